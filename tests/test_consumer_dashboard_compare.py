"""Five runs compared on one page, in a real browser: a runs table (a row per run with its colour,
a show/hide box and the tiles' values), never a set of tiles per run (5 runs made 60 tiles); one
set of charts with one line per run in the run's colour, the first chart above the fold at
1600x1200; a run hidden in the table leaves every chart and comes back; the runs' media sliders
move together.

Skips only where chromium is not installed (launch/setup.sh --dev installs it with apt).
"""
from __future__ import annotations

import json

import pytest

from testkit.cdp import CHROMIUM, Browser
from testkit.dashboard_proc import Dashboard

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; "
                                                          "launch/setup.sh --dev does it)")
NUM_RUNS = 5
STEPS = 40
T0 = 1.7e9
NAMES = [f"lr-{i}" for i in range(NUM_RUNS)]


def _write_run(root, name: str, i: int) -> None:
    tel = root / name / "telemetry"
    tel.mkdir(parents=True)
    recs = [{"kind": "hello", "t": T0, "rank": 0, "info": {"run_name": name, "config": {"lr": 10.0 ** -(i + 2)}}}]
    for s in range(1, STEPS + 1):
        recs.append({"kind": "metrics", "t": T0 + s, "step": s,
                     "values": {"train/loss": (i + 2.0) / s, "train/lr": 10.0 ** -(i + 2), "acc": s / STEPS}})
        recs.append({"kind": "system", "t": T0 + s, "host": "node0", "values": {"system/cpu_percent": 10.0 + i}})
    recs.append({"kind": "event", "t": T0 + 5, "rank": None, "name": "diagnosis/loss_spike",
                 "data": {"severity": "warning", "message": f"loss spike in {name}", "step": 5}})
    recs.append({"kind": "daemon", "t": T0 + STEPS, "values": {"telemetry/records_in": 2 * STEPS + 1,
                                                               "telemetry/records_lost": 0}})
    (tel / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    # A histogram every 10 steps (run 0 also at 15), as the daemon's media keeper writes its index.
    steps = sorted({10, 20, 30, 40} | ({15} if i == 0 else set()))
    (tel / "media").mkdir()
    (tel / "media" / "index.jsonl").write_text("".join(
        json.dumps({"step": s, "key": "weights", "type": "Histogram", "rank": None, "bins": [0, 1, 2, 3],
                    "counts": [s, i, 1]}) + "\n" for s in steps))


@pytest.mark.slow
def test_five_runs_compared_share_one_set_of_charts_with_a_runs_table(tmp_path):
    for i, name in enumerate(NAMES):
        _write_run(tmp_path, name, i)
    dash = Dashboard(str(tmp_path))
    try:
        with Browser(tmp_path / "chromium-profile", width=1600, height=1200) as b:
            b.navigate(dash.login_url)
            b.wait_for(f"document.body.dataset.ready === '1' && state.order.length === {NUM_RUNS} && "
                       "state.plots['loss'] !== undefined", what="five runs drawn")
            # A row per run, its colour and its values; no tile per run.
            rows = b.evaluate("[...document.querySelectorAll('#runs-rows tr')].map(r => ({run: r.dataset.run, "
                              "color: r.dataset.color, shown: r.querySelector('input').checked, "
                              "cells: Object.fromEntries([...r.querySelectorAll('td[data-tile]')].map(c => "
                              "[c.dataset.tile, c.textContent]))}))")
            assert [r["run"] for r in rows] == NAMES, rows
            assert len({r["color"] for r in rows}) == NUM_RUNS and all(r["shown"] for r in rows), rows
            assert [r["cells"]["step"] for r in rows] == [str(STEPS)] * NUM_RUNS, rows
            assert [r["cells"]["records in"] for r in rows] == [str(2 * STEPS + 1)] * NUM_RUNS, rows
            assert b.evaluate("document.querySelectorAll('.tile').length") == 0
            # One set of charts, a line per run in the run's colour, the first above the fold.
            assert b.evaluate("document.querySelectorAll('#chart-loss').length") == 1
            lines = b.evaluate("state.plots['loss'].plot.series.slice(1).map((s, i) => [s.label, typeof s.stroke === "
                               "'function' ? s.stroke(state.plots['loss'].plot, i + 1) : s.stroke])")
            assert [label for label, _ in lines] == [f"{n} train" for n in NAMES], lines
            assert [color for _, color in lines] == [r["color"] for r in rows], (lines, rows)
            first = b.evaluate("(() => { const c = [...document.querySelectorAll('[data-chart]')].find(c => !c.hidden "
                               "&& c.offsetParent !== null); return [c.dataset.chart, c.getBoundingClientRect().top, "
                               "c.querySelector('.uplot').getBoundingClientRect().bottom]; })()")
            assert first[0] == "loss" and first[2] <= 1200, first

            # Hidden in the table: the run leaves every chart; shown again: it is back.
            b.evaluate("document.querySelector('#runs-rows tr[data-run=\"lr-2\"] input').click()")
            b.wait_for("!document.getElementById('chart-loss').dataset.series.includes('lr-2')", what="lr-2 hidden")
            assert b.evaluate("document.getElementById('chart-auto-acc').dataset.series.split('|').length") == NUM_RUNS - 1
            assert b.evaluate("document.querySelector('#runs-rows tr[data-run=\"lr-2\"] input').checked") is False
            b.evaluate("document.querySelector('#runs-rows tr[data-run=\"lr-2\"] input').click()")
            b.wait_for("document.getElementById('chart-loss').dataset.series.split('|').length === 5", what="lr-2 back")

            # The runs' media sliders move together: run 0's to step 15, the others to their last
            # value at or before it (step 10).
            b.wait_for(f"document.querySelectorAll('.mcard[data-key=weights]').length === {NUM_RUNS}", what="media")
            b.evaluate("(() => { const s = document.querySelector('.mcard[data-key=weights][data-run=r0] input'); "
                       "s.value = '1'; s.dispatchEvent(new Event('input')); })()")
            at = b.evaluate("[...document.querySelectorAll('.mcard[data-key=weights]')].map(c => [c.dataset.run, "
                            "+c.dataset.step])")
            assert dict(at) == {"r0": 15, **{f"r{i}": 10 for i in range(1, NUM_RUNS)}}, at
        assert not [line for line in b.console if "exception" in line], b.console
    finally:
        assert dash.stop() == 0, "".join(dash.lines)
