"""The records the daemon writes, declared once (protocol/output.py, issue 28 item 4): each kind's
line is the JSON object the README shows, a reader gets it back as the declared record or, for a
line outside the declaration, as a plain dict, and both read alike."""
from __future__ import annotations

import json

import msgspec
import pytest

from protocol import output
from protocol.output import (ByeRecord, DaemonRecord, EventRecord, GpuRecord, HelloRecord, MetricsRecord,
                             OutputRecord, SystemRecord)

T = 1763800000.25


def _late_rank_record() -> MetricsRecord:
    rec = MetricsRecord(T, 7, {"train/loss": 2.5}, rank=3)
    rec.late = True
    return rec


# Each kind as a producer builds it, and the JSON object its line must be (key order included:
# kind, t, then the kind's fields; a field left UNSET is not in the line).
CASES = [
    (MetricsRecord(T, 7, {"train/loss": 2.5, "perf/mfu": None}),
     {"kind": "metrics", "t": T, "step": 7, "values": {"train/loss": 2.5, "perf/mfu": None}}),
    (MetricsRecord(T, 7, {"x": 1}, missing_ranks=[2, 5]),
     {"kind": "metrics", "t": T, "step": 7, "values": {"x": 1}, "missing_ranks": [2, 5]}),
    (MetricsRecord(T, 8, {"x": 1.5}, window_steps=4),
     {"kind": "metrics", "t": T, "step": 8, "values": {"x": 1.5}, "window_steps": 4}),
    (_late_rank_record(),
     {"kind": "metrics", "t": T, "step": 7, "values": {"train/loss": 2.5}, "rank": 3, "late": True}),
    (EventRecord(T, None, "diagnosis/nonfinite", {"message": "m", "step": 7}),
     {"kind": "event", "t": T, "rank": None, "name": "diagnosis/nonfinite", "data": {"message": "m", "step": 7}}),
    (HelloRecord(T, 0, {"host": "h", "world_size": 2}),
     {"kind": "hello", "t": T, "rank": 0, "info": {"host": "h", "world_size": 2}}),
    (ByeRecord(T, 1, {"sent": 10, "dropped": 0}), {"kind": "bye", "t": T, "rank": 1, "stats": {"sent": 10, "dropped": 0}}),
    (DaemonRecord(T, {"telemetry/records_in": 5}), {"kind": "daemon", "t": T, "values": {"telemetry/records_in": 5}}),
    (SystemRecord(T, "h0", {"system/cpu_percent": 41.0}),
     {"kind": "system", "t": T, "host": "h0", "values": {"system/cpu_percent": 41.0}}),
    (GpuRecord(T, "h0", 1, {"gpu/util_percent": 97}),
     {"kind": "gpu", "t": T, "host": "h0", "gpu": 1, "values": {"gpu/util_percent": 97}}),
]


@pytest.mark.parametrize("rec, want", CASES, ids=[f"{c[1]['kind']}{i}" for i, c in enumerate(CASES)])
def test_each_kind_is_the_line_the_readme_shows_and_reads_back_as_itself(rec, want):
    line = output.encode(rec)
    assert line == json.dumps(want, separators=(",", ":")).encode()       # the same object, key order too
    back = output.decode(line)
    assert type(back) is type(rec) and back.to_dict() == want == rec.to_dict()
    assert output.check(line) == back
    # Read as the JSON object reads: kind, the fields present; an UNSET field is not there.
    assert back["kind"] == back.kind == want["kind"] and list(back) == list(want) and dict(back) == want == {**back}
    for key, value in want.items():
        assert back[key] == value and back.get(key) == value and key in back
    for absent in ("rank", "late", "missing_ranks", "window_steps", "nope"):
        if absent not in want:
            assert absent not in back and back.get(absent) is None and back.get(absent, 0) == 0
            with pytest.raises(KeyError):
                back[absent]


def test_a_line_outside_the_declaration_is_a_plain_dict_and_nothing_else_is_a_record():
    newer = {"kind": "metrics", "t": T, "step": 1, "values": {}, "from_the_future": 1}
    assert output.decode(json.dumps(newer)) == newer                      # a newer daemon's field: kept
    other = {"kind": "histogram", "t": T, "bins": [1, 2]}
    assert output.decode(json.dumps(other)) == other                      # a newer daemon's kind: kept
    odd = {"kind": "metrics", "t": T, "step": "seven", "values": {}}
    assert output.decode(json.dumps(odd)) == odd                          # a hand-made line: read, as dicts were
    for line in (b"", b"not json", b"[1, 2]", b"5", b'{"t": 1}', b'{"kind": 3}', b'{"kind": "metrics"'):
        assert output.decode(line) is None, line
    for line in (json.dumps(newer), json.dumps(other), json.dumps(odd)):  # ... but no daemon may write them
        with pytest.raises(msgspec.ValidationError):
            output.check(line)


def test_with_values_copies_either_form():
    rec = MetricsRecord(T, 3, {"a": 1.0, "b": 2.0}, missing_ranks=[1])
    narrowed = output.with_values(rec, {"a": 1.0})
    assert isinstance(narrowed, OutputRecord) and narrowed.to_dict() == {
        "kind": "metrics", "t": T, "step": 3, "values": {"a": 1.0}, "missing_ranks": [1]}
    assert rec.values == {"a": 1.0, "b": 2.0}
    plain = {"kind": "metrics", "t": T, "step": 3, "values": {"a": 1.0, "b": 2.0}}
    assert output.with_values(plain, {"b": 2.0}) == {**plain, "values": {"b": 2.0}}
