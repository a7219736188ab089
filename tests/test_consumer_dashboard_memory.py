"""The dashboard's memory is bounded in bytes under --memory-mb: series beyond --max-series are
not kept (the first to come are), long series are thinned keeping their extremes, events and the
live changes are bounded, an /api/data answer is bounded in points, and metrics.jsonl is read
in chunks; what is shed is counted and shown. The process against a run of many names, and the
pieces with small limits."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from testkit.dashboard_proc import Dashboard
from telemetry.consumers import readjsonl
from telemetry.consumers.dashboard.live import Hub
from telemetry.consumers.dashboard.store import RunStore, StoreLimits

NUM_RECORDS = 300
NAMES_PER_RECORD = 100


def test_a_run_of_30k_names_keeps_the_first_max_series_and_counts_the_rest(tmp_path):
    tel = tmp_path / "many" / "telemetry"
    tel.mkdir(parents=True)
    with open(tel / "metrics.jsonl", "w") as f:
        for r in range(NUM_RECORDS):
            values = {"train/loss": 1.0 / (r + 1), **{f"user/r{r}/m{i}": float(i) for i in range(NAMES_PER_RECORD)}}
            f.write(json.dumps({"kind": "metrics", "t": 1.7e9 + r, "step": r + 1, "values": values}) + "\n")
    dash = Dashboard(str(tmp_path / "many"), "--max-series", "1000")
    try:
        data = dash.get_json("api/data")
        (run,) = data["runs"]
        keys = [s["key"] for s in run["series"]]
        assert len(keys) == 1000 and keys[0] == "train/loss" and "user/r9/m98" in keys and "user/r9/m99" not in keys
        loss = next(s for s in run["series"] if s["key"] == "train/loss")
        assert loss["n"] == NUM_RECORDS                     # a kept series keeps every value
        budget = data["status"][0]["budget"]
        assert budget["num_series"] == 1000 and budget["max_series"] == 1000
        assert budget["num_values_dropped"] == NUM_RECORDS * NAMES_PER_RECORD - 999
        assert "user/r299/m0" not in run["latest"]
    finally:
        assert dash.stop() == 0
    said = [line for line in dash.lines if "values of new series are dropped" in line]
    assert len(said) == 1 and "1,000 series kept" in said[0], dash.lines


def test_the_longest_series_is_thinned_keeping_first_last_and_extremes():
    s = RunStore("r0", "run", None, limits=StoreLimits(max_points=10_000))
    for step in range(1, 100_001):
        vals = {"train/loss": 100.0 if step == 54_321 else 3.0 / (1 + step / 1000)}
        if step % 100 == 0:
            vals["eval/loss"] = 1.0
        s.consume({"kind": "metrics", "t": 1.7e9 + step, "step": step, "values": vals})
    budget = s.status()["budget"]
    assert budget["num_points"] <= 10_000
    assert budget["num_points"] + budget["num_points_thinned"] == 100_000 + 1_000
    loss = s.series["train/loss"]
    xs, ys = np.frombuffer(loss.xs), np.frombuffer(loss.ys)
    assert xs[0] == 1 and xs[-1] == 100_000 and np.all(np.diff(xs) > 0)
    assert ys.max() == 100.0 and xs[ys.argmax()] == 54_321                  # a one-step spike stays
    assert ys.min() == 3.0 / (1 + 100_000 / 1000)
    assert len(s.series["eval/loss"]) == 1_000                               # the short one is whole
    snap = s.snapshot(1000)
    assert next(x for x in snap["series"] if x["key"] == "train/loss")["n"] == len(loss)


def test_one_series_longer_than_its_bound_is_thinned_alone():
    s = RunStore("r0", "run", None, limits=StoreLimits(max_points_per_series=1000))
    for step in range(1, 10_001):
        s.consume({"kind": "metrics", "t": 1.7e9 + step, "step": step,
                   "values": {"train/loss": -5.0 if step == 4321 else 1.0 + (step % 10) / 10, "train/lr": 1e-3}
                   if step <= 500 else {"train/loss": -5.0 if step == 4321 else 1.0 + (step % 10) / 10}})
    loss = s.series["train/loss"]
    assert len(loss) <= 1000 and len(s.series["train/lr"]) == 500
    xs, ys = np.frombuffer(loss.xs), np.frombuffer(loss.ys)
    assert ys.min() == -5.0 and xs[ys.argmin()] == 4321 and xs[0] == 1 and xs[-1] == 10_000
    assert s.num_points_thinned == 10_000 - len(loss)


def test_events_beyond_their_share_forget_the_oldest():
    s = RunStore("r0", "run", None, limits=StoreLimits(max_event_groups=100))
    for i in range(1000):
        s.consume({"kind": "event", "t": 1.7e9 + i, "rank": 0, "name": "note", "data": {"i": i}})
    groups = s.events.groups
    assert len(groups) <= 100 and s.num_events_forgotten == 1000 - len(groups)
    assert len({g.id for g in groups}) == len(groups) and groups[-1].data == {"i": 999}
    assert s.status()["budget"]["num_events_forgotten"] == s.num_events_forgotten
    big = RunStore("r1", "run", None, limits=StoreLimits(max_event_bytes=100_000))
    for i in range(100):
        big.consume({"kind": "event", "t": 1.7e9 + i, "rank": 0, "name": "dump", "data": {"i": i, "x": "y" * 10_000}})
    assert big.num_event_bytes <= 100_000 and len(big.events.groups) < 10 and big.num_events_forgotten > 90


def test_the_live_changes_kept_are_bounded_in_bytes():
    hub = Hub(max_log_bytes=200_000)
    for i in range(10_000):
        hub.publish("r0", [[f"user/metric_{j}", "step", float(i), 1.0] for j in range(10)], [])
    assert hub._log_bytes <= 200_000 and len(hub._log) < 200
    seq, changes = hub.changes_since(0, timeout_s=0)
    assert seq == 10_000 and changes is None                 # too far behind: the page reloads
    seq, changes = hub.changes_since(9_998, timeout_s=0)
    assert [c[0] for c in changes] == [9_999, 10_000] and len(changes[0]) == 4


def test_an_answer_is_bounded_in_points():
    s = RunStore("r0", "run", None)
    for step in range(1, 5001):
        s.consume({"kind": "metrics", "t": 1.7e9 + step, "step": step,
                   "values": {f"m{i}": float((step * (i + 1)) % 97) for i in range(200)}})
    whole = s.snapshot(2000)
    assert sum(len(x["x"]) for x in whole["series"]) > 200_000
    snap = s.snapshot(2000, max_points=50_000)
    sent = sum(len(x["x"]) for x in snap["series"])
    assert 10_000 < sent <= 50_000
    assert all(x["x"][0] == 1 and x["x"][-1] == 5000 for x in snap["series"])


def test_a_line_beyond_the_bound_is_skipped_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(readjsonl, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(readjsonl, "READ_CHUNK_BYTES", 64)      # lines across many chunks
    path = tmp_path / "metrics.jsonl"
    line = lambda step, pad="": json.dumps({"kind": "metrics", "step": step, "values": {"x": pad}}) + "\n"  # noqa: E731
    path.write_text(line(1) + line(2, "p" * 5000) + line(3) + line(4, "q" * 999))
    f = readjsonl.Follower(tmp_path)
    assert [r["step"] for r in f.records()] == [1, 3]
    assert f.stats.num_bad == 2
    with open(path, "a") as fh:
        fh.write(line(5))
    assert [r["step"] for r in f.poll()] == [5]
    f.close()
    stats = readjsonl.ReadStats()
    assert [r["step"] for r in readjsonl.read_records(tmp_path, stats)] == [1, 3, 5] and stats.num_bad == 2


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def test_the_process_stays_under_its_budget_with_300k_names(tmp_path):
    """The default budget (256 MB) holds for the whole process, whatever the number of names (the
    old store kept every one: ~0.7 KB a name, and /api/data sent them all)."""
    tel = tmp_path / "wide" / "telemetry"
    tel.mkdir(parents=True)
    with open(tel / "metrics.jsonl", "w") as f:
        for r in range(300):
            values = {f"user/r{r}/metric_{i}": float(i) for i in range(1000)}
            f.write(json.dumps({"kind": "metrics", "t": 1.7e9 + r, "step": r + 1, "values": values}) + "\n")
    dash = Dashboard(str(tmp_path / "wide"))
    try:
        body = dash.get("api/data")
        peak = _peak_rss_mb(dash.proc.pid)
        data = json.loads(body)
        assert len(data["runs"][0]["series"]) == 10_000
        assert data["status"][0]["budget"]["num_values_dropped"] == 300_000 - 10_000
        assert peak < 256, f"peak RSS {peak:.0f} MB"
        print(f"\n300k names: peak RSS {peak:.0f} MB, /api/data {len(body) / 1e6:.2f} MB")
    finally:
        assert dash.stop() == 0
