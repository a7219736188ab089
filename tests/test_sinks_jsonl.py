"""metrics.jsonl: whole lines, appends on restart, torn tail repaired, size-based rotation."""
import json

from protocol import output
from protocol.output import MetricsRecord
from telemetry.daemon.sinks.base import Out
from telemetry.daemon.sinks.jsonl import FILE_NAME, JsonlSink, repair_torn_tail
from telemetry.shared.jsonlines import rotated_files


def out(i):
    rec = MetricsRecord(float(i), i, {"train/loss": 1.0 / (i + 1)})
    return Out("metrics", rec, output.encode(rec))


def lines(path):
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "never a partial last line"
    return [json.loads(x) for x in data.splitlines()]


def test_writes_whole_lines_and_appends_on_restart(tmp_path):
    s = JsonlSink(tmp_path, fsync_interval_s=0.01)
    s.start()
    s.consume([out(i) for i in range(3)])
    s.flush()
    s.close()
    s.close()                                   # twice is harmless
    s2 = JsonlSink(tmp_path)
    s2.start()
    s2.consume([out(3)])
    s2.close()
    assert [r["step"] for r in lines(tmp_path / FILE_NAME)] == [0, 1, 2, 3]
    assert s2.stats()["repaired_bytes"] == 0


def test_torn_last_line_is_cut_at_start(tmp_path):
    path = tmp_path / FILE_NAME
    path.write_bytes(out(0).line + b"\n" + out(1).line + b"\n" + b'{"kind": "metrics", "st')
    s = JsonlSink(tmp_path)
    s.start()
    assert s.num_repaired_bytes == len(b'{"kind": "metrics", "st')
    s.consume([out(2)])
    s.close()
    assert [r["step"] for r in lines(path)] == [0, 1, 2]


def test_repair_edge_cases(tmp_path):
    p = tmp_path / "x.jsonl"
    assert repair_torn_tail(p) == 0             # missing file
    p.write_bytes(b"")
    assert repair_torn_tail(p) == 0
    p.write_bytes(b"no newline at all" * 10_000)   # one torn line longer than a read block
    assert repair_torn_tail(p) == 170_000 and p.read_bytes() == b""
    p.write_bytes(b"{}\n")
    assert repair_torn_tail(p) == 0 and p.read_bytes() == b"{}\n"


def test_rotation_keeps_every_line_in_order(tmp_path):
    s = JsonlSink(tmp_path, rotate_bytes=2000)
    s.start()
    for i in range(0, 300, 10):
        s.consume([out(j) for j in range(i, i + 10)])
    s.close()
    pieces = rotated_files(tmp_path)
    assert len(pieces) > 2 and pieces[-1].name == FILE_NAME and pieces[0].name == FILE_NAME + ".1"
    steps = [r["step"] for p in pieces for r in lines(p)]
    assert steps == list(range(300))
    assert s.num_rotations == len(pieces) - 1
    assert all(p.stat().st_size < 2000 + 10 * 80 for p in pieces)


def test_rotation_continues_numbering_after_restart(tmp_path):
    for _ in range(2):
        s = JsonlSink(tmp_path, rotate_bytes=500)
        s.start()
        for i in range(0, 50, 5):
            s.consume([out(j) for j in range(i, i + 5)])
        s.close()
    steps = [r["step"] for p in rotated_files(tmp_path) for r in lines(p)]
    assert steps == list(range(50)) * 2
