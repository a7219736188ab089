"""A run dir built to break its readers: random bytes, a line nested a million arrays deep, a
record time of 9.2e18, a 400-digit value, an event nested 900 deep (and the run's small JSON
files, replay's marks and the daemon's final counters, nested past json's recursion limit). Every reader (`telemetry
report`, `replay`, `goodput`, the run summary, the dashboard's store and range reads) skips each
such line, counts it and says so, and reads the daemon's records around it: exit 0, never a
traceback (protocol/output.py's decode never raises; its bounds: MAX_T, MAX_DEPTH, 64-bit ints).

Real processes on real files, each under an address-space ceiling and a timeout that only
catch a blow-up or a hang.
"""
from __future__ import annotations

import random
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from daemon_util import ROOT
from protocol import output
from protocol.output import EventRecord, MetricsRecord

HANG_S = 180
ADDRESS_SPACE_BYTES = 3 << 30
T0 = 1_763_800_000.0
NUM_GOOD = 6

HOSTILE = [
    b"[" * 10**6 + b"]" * 10**6,                                                     # RecursionError
    b'{"kind":"metrics","t":9.2e18,"step":3,"values":{"train/loss":1.0}}',           # OverflowError
    b'{"kind":"metrics","t":%.1f,"step":3,"values":{"train/loss":1%s}}' % (T0, b"0" * 400),
    b'{"kind":"event","t":%.1f,"rank":0,"name":"x","data":{"a":%s1%s}}' % (T0, b"[" * 900, b"]" * 900),
    b'{"kind":"event","t":%.1f,"rank":0,"name":"x","data":{"a":%s1%s}}' % (T0, b'{"a":' * 900, b"}" * 900),
    b"5\x80\xfe not JSON after a number",                                            # DecodeError
]


def _good(step: int) -> bytes:
    return output.encode(MetricsRecord(T0 + step, step, {"train/loss": 1.0 / step, "perf/step_time": 0.5}))


def _run_dir(tmp_path: Path, body: bytes) -> Path:
    run = tmp_path / "run"
    (run / "telemetry").mkdir(parents=True)
    (run / "telemetry" / "metrics.jsonl").write_bytes(body)
    return run


def _crafted(tmp_path: Path) -> Path:
    """The good records with a hostile line after each of the first ones."""
    lines = []
    for step in range(1, NUM_GOOD + 1):
        lines.append(_good(step))
        if step <= len(HOSTILE):
            lines.append(HOSTILE[step - 1])
    lines.append(output.encode(EventRecord(T0 + 9, 0, "checkpoint_saved", {"path": "/x", "nested": {"ok": [1]}})))
    run = _run_dir(tmp_path, b"\n".join(lines) + b"\n")
    for name in ("wandb_replay.json", "drain.json"):   # replay's marks, the daemon's final counters
        (run / "telemetry" / name).write_text("[" * 100_000)
    return run


def _random(tmp_path: Path) -> Path:
    noise = random.Random(50).randbytes(8 << 20)
    return _run_dir(tmp_path, _good(1) + b"\n" + noise + b"\n" + _good(2) + b"\n")


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=HANG_S,
                       preexec_fn=_limit_memory)
    assert p.returncode == 0 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-3000:])
    return p


def _readers(run: Path, tmp_path: Path) -> dict[str, str]:
    """Each reader's output on the run dir."""
    return {
        "report": _run("-m", "telemetry", "report", str(run), "--out", str(tmp_path / "report")).stdout,
        "replay": _run("-m", "telemetry", "replay", str(run), "--wandb", "offline", cwd=tmp_path).stdout,
        "goodput": _run("-m", "telemetry", "goodput", str(run)).stdout,
        "summary": _run("-m", "telemetry.consumers.summary", str(run / "telemetry"),
                        "--drain-json", str(run / "telemetry" / "drain.json")).stdout,
    }


def test_every_reader_skips_and_counts_the_hostile_lines_and_reads_the_rest(tmp_path):
    run = _crafted(tmp_path)
    out = _readers(run, tmp_path)
    n = len(HOSTILE)
    assert re.search(rf"read\s+{NUM_GOOD + 1} records from 1 file\(s\); skipped 0 torn and {n} unreadable",
                     out["report"]), out["report"]
    assert f"; {n} unreadable line(s) skipped" in out["replay"] and f"{NUM_GOOD} rows" in out["replay"], out["replay"]
    assert f"unreadable lines: {n} skipped" in out["goodput"], out["goodput"]
    assert re.search(rf"unreadable lines\s+{n} skipped", out["summary"]), out["summary"]
    assert re.search(rf"steps logged\s+{NUM_GOOD} \(last step {NUM_GOOD}\)", out["summary"]), out["summary"]


def test_random_bytes_are_skipped_lines_not_a_traceback(tmp_path):
    run = _random(tmp_path)
    out = _readers(run, tmp_path)
    m = re.search(r"read\s+(\d+) records from 1 file\(s\); skipped \d+ torn and (\d+) unreadable", out["report"])
    assert m and int(m.group(1)) == 2 and int(m.group(2)) > 1000, out["report"]
    assert "2 rows" in out["replay"] and "unreadable line(s) skipped" in out["replay"], out["replay"]
    assert re.search(r"steps logged\s+2 ", out["summary"]), out["summary"]


@pytest.mark.parametrize("make", [_crafted, _random])
def test_the_dashboard_reads_around_the_hostile_lines(tmp_path, make):
    from telemetry.consumers.dashboard.ranges import StepBlocks
    from telemetry.consumers.dashboard.store import RunStore
    from telemetry.consumers.readjsonl import ReadStats, read_records

    log_dir = make(tmp_path) / "telemetry"
    store, stats = RunStore("r", "r", log_dir), ReadStats()
    for rec in read_records(log_dir, stats):
        store.consume(rec)
    assert stats.num_bad >= len(HOSTILE) if make is _crafted else stats.num_bad > 1000
    store.snapshot(800)
    got, truncated, _ = StepBlocks(log_dir).read(0, 10**30, {"train/loss"})
    assert not truncated and sorted(got["train/loss"][0]) == list(range(1, (NUM_GOOD if make is _crafted else 2) + 1))


def test_decode_never_raises_and_bounds_what_it_returns():
    """The decoder's own answer for each class, the declared and the plain-dict path alike."""
    for line in HOSTILE:
        assert output.decode(line) is None, line[:80]
    for t in (-1.0, 9.2e18, output.MAX_T):
        assert output.decode(b'{"kind":"metrics","t":%r,"step":1,"values":{}}' % t) is None
        assert output.decode(b'{"kind":"newer","t":%r}' % t) is None          # the plain-dict path
    # A record nests MAX_DEPTH levels at most, its own object the first.
    lists = lambda n: "[" * n + "]" * n   # noqa: E731
    at_most = lists(output.MAX_DEPTH - 1)
    assert output.decode('{"kind":"newer","t":1.0,"a":%s}' % at_most) == {"kind": "newer", "t": 1.0, "a": eval(at_most)}
    assert output.decode('{"kind":"newer","t":1.0,"a":[%s]}' % at_most) is None
    at_most = lists(output.MAX_DEPTH - 2)   # in an event's data, itself the second level
    assert output.decode('{"kind":"event","t":1.0,"rank":0,"name":"x","data":{"a":%s}}' % at_most) is not None
    assert output.decode('{"kind":"event","t":1.0,"rank":0,"name":"x","data":{"a":[%s]}}' % at_most) is None
    assert output.decode(b'{"kind":"newer","t":1.0,"n":%d}' % 2**64) is None
    assert output.decode(b'{"kind":"newer","t":1.0,"n":%d}' % (2**64 - 1))["n"] == 2**64 - 1


def test_a_hostile_per_rank_ledger_file_is_a_problem_said_not_a_traceback(tmp_path):
    """goodput_ranks.json, which report, goodput, the summary and a restarted daemon read."""
    from telemetry.shared.goodput import read_ranks_file

    entry = '{"wall_s": 1%s, "steps": 1, "launches": 1, "until": 1.0, "buckets_s": {}}' % ("0" * 400)
    for name, text in (("deep", "[" * 100_000 + "]" * 100_000), ("huge", '{"ranks": {"0": %s}}' % entry)):
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        ranks, why = read_ranks_file(path)
        assert ranks is None and why.startswith(f"{path}: not a per-rank ledger file"), why


def test_the_daemon_takes_in_no_record_its_readers_would_skip_for_depth():
    """Ingest refuses an event nested deeper than output.MAX_DEPTH (counted malformed), so the
    daemon never writes a line that every reader then skips; one at the bound is kept and read."""
    import protocol
    from daemon_util import feed_one
    from telemetry.daemon.receiver import Receiver

    def data(levels: int) -> dict:   # `levels` nested maps, the data itself the first
        d: dict = {"a": 1}
        for _ in range(levels - 1):
            d = {"a": d}
        return d

    r = Receiver()
    kept = feed_one(r, protocol.encode_event(1, 0, 0, 0, int(T0 * 1e9), "x", data(output.MAX_DEPTH - 1)))
    assert kept is not None
    assert output.decode(output.encode(EventRecord(T0, 0, "x", kept.data))) is not None
    assert feed_one(r, protocol.encode_event(1, 0, 1, 0, int(T0 * 1e9), "x", data(output.MAX_DEPTH))) is None
    assert r.totals()["records_malformed"] == 1
