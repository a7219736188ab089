"""A zoom on the dashboard gets every point of its step range (issue 31 item 3: the server
downsamples per pixel, never the data): from the store where it holds a series whole, from the
run's files where its memory budget thinned it (telemetry/consumers/dashboard/ranges.py)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from telemetry.consumers.dashboard.ranges import StepBlocks, downsampled
from testkit.dashboard_proc import Dashboard


def _line(step: int, values: dict, rank: int | None = None, t: float = 1.7e9) -> str:
    rec = {"kind": "metrics", "t": t + step, "step": step, **({"rank": rank} if rank is not None else {}), "values": values}
    return json.dumps(rec, separators=(",", ":")) + "\n"


def _write(path: Path, lines: list[str]) -> None:
    with open(path, "a") as f:
        f.writelines(lines)


def test_the_files_give_back_every_value_of_a_step_range_across_pieces_resumes_and_ranks(tmp_path, monkeypatch):
    import telemetry.consumers.dashboard.ranges as ranges

    monkeypatch.setattr(ranges, "BLOCK_BYTES", 512)      # many blocks out of a small run
    log = tmp_path / "telemetry"
    log.mkdir()
    # A rotated piece (steps 1-60), then the current file: a resume from step 41 (steps 41-60
    # again, new values), per-rank records, other kinds between them.
    _write(log / "metrics.jsonl.1", [_line(s, {"loss": 1.0 / s, "acc": s}) for s in range(1, 61)])
    lines = []
    for s in range(41, 101):
        lines.append(_line(s, {"loss": 2.0 / s, "acc": None if s == 50 else s}))
        lines.append(_line(s, {"loss": 3.0 / s}, rank=1))
        lines.append(json.dumps({"kind": "system", "t": 1.7e9 + s, "host": "h", "values": {"system/cpu_percent": 5}}) + "\n")
    _write(log / "metrics.jsonl", lines)
    blocks = StepBlocks(log)
    got, truncated, read = blocks.read(45, 55, {"loss", "acc", "loss@rank1", "nothing"})
    assert not truncated and 0 < read < (log / "metrics.jsonl").stat().st_size + (log / "metrics.jsonl.1").stat().st_size
    # Both passes over steps 45-55 are read; the later one wins where it repeats a step.
    xs, ys = downsampled(*got["loss"], 1000)
    assert xs == list(range(45, 56)) and ys == pytest.approx([2.0 / s for s in range(45, 56)])
    xs, ys = downsampled(*got["acc"], 1000)
    assert xs == list(range(45, 56)) and ys[5] is None and ys[:5] == list(range(45, 50))
    xs, ys = downsampled(*got["loss@rank1"], 1000)
    assert xs == list(range(45, 56)) and ys == pytest.approx([3.0 / s for s in range(45, 56)])
    assert got["nothing"] == ([], [])
    # Appended after the index was built: found on the next read; a line being written is not.
    _write(log / "metrics.jsonl", [_line(s, {"loss": 4.0 / s}) for s in range(101, 121)])
    with open(log / "metrics.jsonl", "a") as f:
        f.write(_line(121, {"loss": 1.0})[:20])
    got, _, _ = blocks.read(110, 130, {"loss"})
    assert sorted(got["loss"][0]) == list(range(110, 121))
    # Many points in range: downsampled as they are read (memory: a few per pixel column), the
    # extremes kept (a one-step spike among 60,000 steps).
    _write(log / "metrics.jsonl", ["\n"] + [_line(s, {"spiky": 1000.0 if s == 31_337 else float(s % 7)})
                                            for s in range(200, 60_200)])     # (after the torn line above)
    got, truncated, _ = blocks.read(200, 60_199, {"spiky"}, num_buckets=100)
    assert not truncated and len(got["spiky"][0]) <= 8 * 100 + 1
    xs, ys = downsampled(*got["spiky"], 100)
    assert max(ys) == 1000.0 and xs[ys.index(1000.0)] == 31_337 and min(ys) == 0.0
    assert xs[0] == 200 and xs[-1] == 60_199
    # A budget on what one request reads: said, never a silent half answer.
    got, truncated, read = blocks.read(1, 200, {"loss"}, max_bytes=2048)
    assert truncated and read <= 2048


@pytest.mark.slow
def test_a_zoom_into_a_thinned_run_shows_every_logged_point_of_its_range(tmp_path):
    """A run too long for the dashboard's memory budget (--memory-mb 64: its series are
    thinned): a zoom into 60 of its steps draws exactly the 60 logged values of each series,
    read again from metrics.jsonl; one the store holds whole comes from the store."""
    from testkit.cdp import CHROMIUM, Browser

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium; launch/setup.sh --dev does it)")
    log = tmp_path / "long-run" / "telemetry"
    log.mkdir(parents=True)
    steps, names = 30_000, 12
    value = lambda i, s: math.sin(s / 7 + i) + (s % 11) / 10      # noqa: E731  (jagged: thinning shows)
    with open(log / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            v = {f"m/x{i}": round(value(i, s), 6) for i in range(names)}
            if s % 100 == 0:
                v["rare"] = float(s)
            f.write(_line(s, v))
    dash = Dashboard(str(tmp_path / "long-run"), "--memory-mb", "64", ready_timeout_s=300)
    try:
        budget = dash.get_json("/api/data?width=400")["status"][0]["budget"]
        assert budget["num_points_thinned"] > 0, budget
        with Browser(tmp_path / "chromium-profile", width=1400, height=1000) as b:
            b.navigate(dash.login_url)
            b.wait_for("document.body.dataset.ready === '1' && !!state.plots['auto-m/x3']", what="the page drawn")
            full = b.evaluate("state.plots['auto-m/x3'].plot.data[1].filter(v => v != null).length")
            assert full < steps // 4          # far fewer points than logged, before the zoom
            lo, hi = 12_001, 12_060
            b.evaluate(f"zoomTo('step', {lo}, {hi})")
            b.wait_for(f"document.body.dataset.detail === '{lo}-{hi}' && "
                       "state.plots['auto-m/x3'].plot.data[0].filter(x => x >= 12001 && x <= 12060).length === 60",
                       timeout_s=60, what="the zoomed range drawn again")
            xs = b.evaluate("state.plots['auto-m/x3'].plot.data[0]")
            ys = b.evaluate("state.plots['auto-m/x3'].plot.data[1]")
            inside = [(x, y) for x, y in zip(xs, ys) if lo <= x <= hi]
            assert [x for x, _ in inside] == list(range(lo, hi + 1))
            assert [y for _, y in inside] == pytest.approx([round(value(3, s), 6) for s in range(lo, hi + 1)])
            # Outside the range the line goes on with what the page held (live steps would join it).
            assert min(xs) < lo and max(xs) == steps
            assert b.evaluate("state.detail.truncated") is False
            # Undone: the whole run again, from what the store holds.
            b.evaluate("zoomTo('step', null, null)")
            b.wait_for("state.detail === null", what="the zoom undone")
        resp = dash.get_json(f"/api/range?run=r0&x0={lo}&x1={hi}&width=800&key=m/x0&key=rare")
        assert resp["series"]["m/x0"]["x"] == list(range(lo, hi + 1)) and resp["read_bytes"] > 0
        assert resp["series"]["rare"]["x"] == []            # none logged in it
        # A series the store holds whole (one value every 100 steps): from the store, nothing read.
        resp = dash.get_json("/api/range?run=r0&x0=12001&x1=12300&width=800&key=rare")
        assert resp["series"]["rare"] == {"x": [12_100, 12_200, 12_300], "y": [12_100.0, 12_200.0, 12_300.0]}
        assert resp["read_bytes"] == 0
    finally:
        assert dash.stop() == 0, "".join(dash.lines)
