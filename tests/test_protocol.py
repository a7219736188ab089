"""Wire format: golden bytes both ways, validation, and no pickle."""
import pickle

import msgspec
import pytest

import protocol
from protocol import MalformedRecord, decode

GOLDEN_HEX = ("99 02 01 07 03 2a 00 cd 03 e8 05 81 aa 74 72 61 69 6e 2f 6c 6f 73 73 "
              "cb 40 04 00 00 00 00 00 00")
GOLDEN = bytes.fromhex(GOLDEN_HEX.replace(" ", ""))


def test_golden_bytes_encode():
    frame = protocol.encode_metrics(src=7, rank=3, seq=42, dropped=0, t_ns=1000, step=5,
                                    values={"train/loss": 2.5})
    assert frame == GOLDEN


def test_golden_bytes_decode():
    rec = decode(GOLDEN)
    assert isinstance(rec, protocol.Metrics)
    assert (rec.src, rec.rank, rec.seq, rec.dropped, rec.t_ns, rec.step) == (7, 3, 42, 0, 1000, 5)
    assert rec.values == {"train/loss": 2.5}


def test_golden_bytes_match_the_readme():
    from pathlib import Path

    readme = (Path(protocol.__file__).parent / "README.md").read_text()
    assert GOLDEN_HEX in readme


@pytest.mark.parametrize("make", [
    lambda: protocol.encode_hello(1, 0, 0, 0, 5, {"host": "h", "pid": 3, "world_size": 2}),
    lambda: protocol.encode_event(1, 2, 9, 1, 5, "checkpoint_saved", {"path": "/x", "n": [1, 2]}),
    lambda: protocol.encode_bye(1, 2, 10, 1, 5, {"sent": 9, "dropped": 1}),
    lambda: protocol.encode_metrics(1, 2, 3, 0, 5, 0, {"a": 1, "b": -2.5, "c": float("nan")}),
])
def test_every_kind_round_trips(make):
    frame = make()
    rec = decode(frame)
    assert protocol.encode(rec) == frame


@pytest.mark.parametrize("payload, why", [
    (b"", "empty"),
    (b"\xc1", "never-used msgpack byte"),
    (GOLDEN[:-3], "truncated"),
    (msgspec.msgpack.encode([9, 1, 1, 0, 0, 0, 0]), "unknown kind"),
    (msgspec.msgpack.encode([2, 2, 1, 0, 0, 0, 0, 1, {}]), "wrong version"),
    (msgspec.msgpack.encode([2, 1, 1, -1, 0, 0, 0, 1, {}]), "negative rank"),
    (msgspec.msgpack.encode([2, 1, 1, 0, 0, 0, 0, -5, {}]), "negative step"),
    (msgspec.msgpack.encode([2, 1, 1, 0, 0, 0, 0, 1, {"x": "str"}]), "string value"),
    (msgspec.msgpack.encode([2, 1, 1, 0, 0, 0, 0, 1, {"x": [1.0]}]), "list value"),
    (msgspec.msgpack.encode([2, 1, 1, 0, 0, 0, 0, 1, {1: 2.0}]), "int key"),
    (msgspec.msgpack.encode([2, 1, 1, 0, 0, 0, 0, 1, {"": 2.0}]), "empty name"),
    (msgspec.msgpack.encode([2, 1, 1, 0, 0, 0, 0, 1, {"x" * 300: 2.0}]), "long name"),
    (msgspec.msgpack.encode([2, 1, 1, 0, 0, 0, 0, 1, {f"k{i}": 1 for i in range(5000)}]), "too many values"),
    (msgspec.msgpack.encode([3, 1, 1, 0, 0, 0, 0, "", {}]), "empty event name"),
    (msgspec.msgpack.encode({"kind": 2}), "a map, not an array"),
    (msgspec.msgpack.encode([2, 1, 1, 0, 0, 0, 0]), "metrics without body"),
    (msgspec.msgpack.encode([2, 1, 1 << 64 - 1, 0, 0, 0, 0, 1, {}]), "src too large"),
    (pickle.dumps({"kind": 2}), "a pickle"),
])
def test_malformed_frames_are_rejected(payload, why):
    with pytest.raises(MalformedRecord):
        decode(payload)


def test_deeply_nested_event_data_is_rejected_not_crashing():
    # an event whose data holds 100k nested one-element arrays
    frame = b"\x98\x03\x01\x01\x00\x00\x00\x00\xa1e" + b"\x81\xa1x" + b"\x91" * 100_000 + b"\x00"
    with pytest.raises(MalformedRecord):
        decode(frame)


def test_oversized_frame_is_rejected():
    with pytest.raises(MalformedRecord):
        decode(b"\x00" * (protocol.MAX_FRAME_BYTES + 1))


def test_bool_and_nil_values_are_accepted():
    rec = decode(protocol.encode_metrics(1, 0, 0, 0, 5, 3, {"is_best": True, "acc": None, "loss": 1.0}))
    assert rec.values == {"is_best": True, "acc": None, "loss": 1.0}


def test_trailing_fields_from_a_later_minor_version_are_ignored():
    # Element 9 is a metrics record's `parts` (added in a minor version); later ones are skipped.
    frame = msgspec.msgpack.encode([2, 1, 1, 0, 0, 0, 0, 3, {"a": 1.0}, 2, "future"])
    assert (decode(frame).step, decode(frame).parts) == (3, 2)


def test_a_metrics_record_without_parts_is_one_part():
    """A client from before `parts` (the golden bytes) sends one record per step; the client
    leaves parts=1 out, so its frames are the old bytes."""
    assert decode(GOLDEN).parts == 1
    assert protocol.encode_metrics(7, 3, 42, 0, 1000, 5, {"train/loss": 2.5}) == GOLDEN
    frame = protocol.encode_metrics(7, 3, 42, 0, 1000, 5, {"train/loss": 2.5}, parts=2)
    assert frame == GOLDEN[:1].replace(b"\x99", b"\x9a") + GOLDEN[1:] + b"\x02"
    assert decode(frame).parts == 2 and protocol.encode(decode(frame)) == frame
    for bad in (0, -1, 1025, "2", 1.5):
        with pytest.raises(protocol.MalformedRecord):
            decode(msgspec.msgpack.encode([2, 1, 1, 0, 0, 0, 0, 3, {"a": 1.0}, bad]))
