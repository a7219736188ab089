"""Property-based tests of the decoder: it never raises anything but MalformedRecord, whatever the
bytes, and it returns exactly what was encoded for every valid record."""
from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import protocol
from protocol import MalformedRecord, decode
from protocol.constants import MAX_NAME_CHARS, MAX_VALUES

I64 = st.integers(min_value=0, max_value=(1 << 63) - 1)
RANK = st.integers(min_value=0, max_value=protocol.MAX_RANK)
NAME = st.text(min_size=1, max_size=MAX_NAME_CHARS)
NUMBER = st.one_of(st.floats(allow_nan=False), st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1))
SCALAR = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.integers(-(1 << 63), (1 << 63) - 1),
                   st.text(max_size=20))
ANY = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                   max_leaves=10)
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode_or_malformed(frame: bytes) -> None:
    try:
        rec = decode(frame)
    except MalformedRecord:
        return
    # Anything accepted satisfies the documented bounds.
    assert rec.version == protocol.PROTOCOL_VERSION
    for f in ("src", "rank", "seq", "dropped", "t_ns"):
        assert 0 <= getattr(rec, f) < (1 << 63)


@SETTINGS
@given(st.binary(max_size=512))
def test_random_bytes_never_raise_anything_else(frame):
    _decode_or_malformed(frame)


@SETTINGS
@given(st.lists(ANY, max_size=11))
def test_random_msgpack_arrays_never_raise_anything_else(items):
    _decode_or_malformed(msgpack.packb(items))


@SETTINGS
@given(st.sampled_from([1, 2, 3, 4]), st.integers(-3, 5), st.lists(ANY, min_size=5, max_size=9))
def test_wrong_versions_and_types_in_a_header(kind, version, rest):
    frame = msgpack.packb([kind, version, *rest])
    if version != protocol.PROTOCOL_VERSION:
        with pytest.raises(MalformedRecord):
            decode(frame)
    else:
        _decode_or_malformed(frame)


@SETTINGS
@given(I64, RANK, I64, I64, I64, I64, st.dictionaries(NAME, NUMBER, max_size=20))
def test_metrics_round_trip(src, rank, seq, dropped, t_ns, step, values):
    rec = decode(protocol.encode_metrics(src, rank, seq, dropped, t_ns, step, values))
    assert (rec.src, rec.rank, rec.seq, rec.dropped, rec.t_ns, rec.step) == (src, rank, seq, dropped, t_ns, step)
    assert rec.values.keys() == values.keys()
    for k, v in values.items():
        assert rec.values[k] == v or (isinstance(v, float) and math.isnan(v))


@SETTINGS
@given(I64, I64, NAME, st.dictionaries(st.text(max_size=8), ANY, max_size=5))
def test_event_and_hello_round_trip(src, seq, name, data):
    ev = decode(protocol.encode_event(src, 1, seq, 0, 5, name, data))
    assert (ev.name, ev.data, ev.seq) == (name, data, seq)
    hello = decode(protocol.encode_hello(src, 2, seq, 0, 5, data))
    assert hello.info == data


@SETTINGS
@given(I64, I64, st.dictionaries(NAME, NUMBER, min_size=1, max_size=10), st.data())
def test_every_truncation_of_a_valid_frame_is_malformed(src, step, values, data):
    frame = protocol.encode_metrics(src, 0, 1, 0, 7, step, values)
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(MalformedRecord):
        decode(frame[:cut])


@pytest.mark.parametrize("depth", [100, 10_000, 200_000])
def test_deeply_nested_event_data_is_refused_or_bounded(depth):
    # [3, 1, src, rank, seq, dropped, t_ns, name, {"a": [[[...]]]}]
    head = msgpack.packb([3, 1, 1, 0, 0, 0, 0, "x"])       # an 8-array; make it 9 long by hand
    frame = b"\x99" + head[1:] + b"\x81\xa1a" + b"\x91" * depth + b"\xc0"
    _decode_or_malformed(frame)
    if depth >= 10_000:
        with pytest.raises(MalformedRecord):
            decode(frame)


def test_bounds_are_enforced():
    with pytest.raises(MalformedRecord):
        decode(msgpack.packb([2, 1, 1, 0, 0, 0, 0, 1, {f"m{i}": 1.0 for i in range(MAX_VALUES + 1)}]))
    with pytest.raises(MalformedRecord):
        decode(msgpack.packb([2, 1, 1, 0, 0, 0, 0, 1, {"x" * (MAX_NAME_CHARS + 1): 1.0}]))
    with pytest.raises(MalformedRecord):
        decode(msgpack.packb([2, 1, -1, 0, 0, 0, 0, 1, {}]))
    with pytest.raises(MalformedRecord):
        decode(b"\x00" * (protocol.MAX_FRAME_BYTES + 1))


@SETTINGS
@given(st.integers(min_value=protocol.MAX_RANK + 1, max_value=(1 << 63) - 1))
def test_a_rank_beyond_any_real_run_is_malformed(rank):
    """A bogus rank id would make every later step wait for it (issue 18)."""
    with pytest.raises(MalformedRecord):
        decode(protocol.encode_metrics(1, rank, 0, 0, 1, 1, {"x": 1.0}))


def _loose(frame: bytes):
    import msgspec

    from protocol.codec import decode_header
    from protocol.records import LooseHeader

    try:
        h = msgspec.msgpack.decode(frame, type=LooseHeader)
    except Exception:
        return None
    assert decode_header(frame) == (h.src, h.rank, h.seq, h.dropped)
    return h.kind, h.src, h.rank, h.seq, h.dropped


@SETTINGS
@given(st.sampled_from([1, 2, 3, 4]), st.integers(-3, 5), st.lists(st.one_of(I64, st.integers(-5, (1 << 64) - 1), ANY),
                                                                    min_size=0, max_size=9))
def test_peek_header_reads_what_the_loose_header_reads(kind, version, rest):
    """protocol.codec.peek_header (the daemon accounts shed frames with it, reading only their
    first bytes) agrees with the full LooseHeader decode on every frame whose body is well formed,
    and only ever reads a header with the same bounds."""
    from protocol.codec import peek_header

    frame = msgpack.packb([kind, version, *rest])
    peeked, loose = peek_header(frame), _loose(frame)
    assert peeked == loose
    # Above PEEK_PARSE_MAX_BYTES only the header's bytes are read: garbage after it changes nothing.
    from protocol.codec import PEEK_PARSE_MAX_BYTES

    assert peek_header(frame + b"\xc1" * (PEEK_PARSE_MAX_BYTES + 1)) == peeked


@SETTINGS
@given(I64, RANK, I64, I64, I64, st.integers(0, 4096))
def test_peek_header_of_real_frames_whatever_their_width(src, rank, seq, dropped, t_ns, width):
    from protocol.codec import peek_header

    values = {f"w{i}": float(i) for i in range(width)}
    frame = protocol.encode_metrics(src, rank, seq, dropped, t_ns, 1, values)
    assert peek_header(frame) == (protocol.KIND_METRICS, src, rank, seq, dropped) == _loose(frame)
    assert peek_header(b"") is None and peek_header(frame[:3]) is None
