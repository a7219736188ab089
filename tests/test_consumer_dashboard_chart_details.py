"""The charts' details in a real browser, on a run written as a daemon writes metrics.jsonl:
smoothing keeps the values as logged, faint, beneath the smoothed line; the line per rank of a
name a built-in chart draws is in that chart's section, not a section of its own; a rank's line is its
rank's colour on every chart (a chart of ranks 2 and 3 does not paint rank 2 in rank 0's);
a card is as tall as its own chart, not as the tallest card of its row; a chart is exported as
CSV (its values as logged) and PNG.

Skips only where chromium is not installed (launch/setup.sh --dev installs it with apt).
"""
from __future__ import annotations

import json
import math

import pytest

from testkit.cdp import CHROMIUM, Browser
from testkit.dashboard_proc import Dashboard

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; "
                                                          "launch/setup.sh --dev does it)")
STEPS = 60
T0 = 1.7e9
MANY_RANKS = 24


def _records() -> list[dict]:
    recs = [{"kind": "hello", "t": T0, "rank": 0, "info": {"run_name": "details", "config": {"lr": 0.1}}}]
    for s in range(1, STEPS + 1):
        t = T0 + s
        recs.append({"kind": "metrics", "t": t, "step": s,
                     "values": {"noisy": math.sin(s / 5) + (0.5 if s % 2 else -0.5), "w_one": 1.0 / s,
                                "train/loss": 3.0 / s, "telemetry/not_in_the_catalogue": 1.0,
                                "b": 2.0 + s}})   # (b: so w_many and w_one share a row)
        for r in range(MANY_RANKS):
            values = {"w_many": s + r}
            if r < 3:
                values["a"] = r + s / 10               # ranks 0, 1, 2
                values["train/loss"] = 3.0 / s + r / 100
            if r in (2, 3):
                values["c"] = r - s / 10               # ranks 2 and 3 only
            recs.append({"kind": "metrics", "t": t, "step": s, "rank": r, "values": values})
    return recs


def _stroke(b: Browser, chart: str, label: str) -> str:
    return b.evaluate(f"(() => {{ const u = state.plots[{chart!r}].plot; const i = u.series.findIndex(s => "
                      f"s.label === {label!r}); const s = u.series[i]; "
                      "return typeof s.stroke === 'function' ? s.stroke(u, i) : s.stroke; })()")


@pytest.mark.slow
def test_smoothing_rank_colours_and_card_heights(tmp_path):
    tel = tmp_path / "details" / "telemetry"
    tel.mkdir(parents=True)
    (tel / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
    dash = Dashboard(str(tmp_path / "details"))
    try:
        with Browser(tmp_path / "chromium-profile", width=1400, height=1000) as b:
            b.navigate(dash.login_url)
            b.wait_for("document.body.dataset.ready === '1' && ['auto-noisy', 'auto-a', 'auto-c', 'auto-w_many', "
                       "'auto-w_one'].every(c => state.plots[c])", what="the charts drawn")

            # A rank's colour is the same on every chart.
            for rank in (2, 3):
                assert _stroke(b, "auto-c", f"rank {rank}") == _stroke(b, "auto-w_many", f"rank {rank}")
            assert _stroke(b, "auto-a", "rank 2") == _stroke(b, "auto-c", "rank 2")
            assert _stroke(b, "auto-a", "rank 0") != _stroke(b, "auto-c", "rank 2")

            # A name a built-in chart draws (train/loss): its line per rank is in that chart's
            # section, after it, not in a "training (more series)" section of its own.
            where = b.evaluate("[...document.querySelectorAll('#group-Training .card')].filter(c => !c.hidden)"
                               ".map(c => c.dataset.chart + ':' + c.querySelector('h3').textContent)")
            assert where == ["loss:Loss", "auto-train/loss:train/loss per rank"], where
            assert not b.evaluate("[...document.querySelectorAll('section.group')].filter(s => !s.hidden)"
                                  ".map(s => s.querySelector('h2').textContent).filter(t => t.startsWith('training'))")
            # A name of the daemon's the catalogue does not know is in the System section all the same.
            assert b.evaluate("document.getElementById('system').contains("
                              "document.getElementById('chart-auto-telemetry/not_in_the_catalogue'))") is True
            # A card no taller than its chart: w_one (one line) shares a row with w_many (24 ranks,
            # a legend of several lines) and is not stretched to its height.
            heights = b.evaluate("Object.fromEntries([...document.querySelectorAll('.card')].filter(c => "
                                 "!c.hidden && c.querySelector('.uplot')).map(c => [c.dataset.chart, "
                                 "c.getBoundingClientRect().height - c.querySelector('h3').offsetHeight - "
                                 "c.querySelector('.plot').offsetHeight]))")
            tops = b.evaluate("['auto-w_one', 'auto-w_many'].map(c => document.getElementById('chart-' + c)"
                              ".getBoundingClientRect().top)")
            assert tops[0] == tops[1], tops                      # one row: the case that stretched
            assert heights and max(heights.values()) <= 20, heights

            # Smoothing: the smoothed line, and beneath it the values as logged (one faint line).
            assert b.evaluate("document.getElementById('chart-auto-noisy').dataset.rawLines") == "0"
            b.evaluate("(() => { const s = document.getElementById('smooth'); s.value = '0.9'; "
                       "s.dispatchEvent(new Event('input')); })()")
            b.wait_for("document.getElementById('chart-auto-noisy').dataset.rawLines === '1'",
                       what="the raw line drawn beneath the smoothed one")
            drawn, logged = b.evaluate("[state.plots['auto-noisy'].plot.data[1], state.plots['auto-noisy'].unsmoothed[1]]")
            assert len(drawn) == len(logged) == STEPS
            assert logged == pytest.approx([math.sin(s / 5) + (0.5 if s % 2 else -0.5) for s in range(1, STEPS + 1)])
            assert max(abs(x - y) for x, y in zip(drawn, logged)) > 0.3      # smoothed: not the raw values
            # Exported: the points as CSV (the values as logged, not smoothed) and the chart as PNG.
            assert b.evaluate("document.querySelectorAll('#chart-auto-noisy .export').length") == 2
            csv = b.evaluate("chartCSV('auto-noisy')").splitlines()
            assert csv[0] == "step,noisy" and len(csv) == STEPS + 1, csv[:3]
            assert [float(line.split(",")[1]) for line in csv[1:]] == pytest.approx(logged)
            assert b.evaluate("chartPNG('auto-noisy').then(b => [b.type, b.size > 1000])") == ["image/png", True]
            b.evaluate("(() => { const s = document.getElementById('smooth'); s.value = '0'; "
                       "s.dispatchEvent(new Event('input')); })()")
            b.wait_for("document.getElementById('chart-auto-noisy').dataset.rawLines === '0'", what="smoothing off")
        assert not [line for line in b.console if "exception" in line], b.console
    finally:
        assert dash.stop() == 0, "".join(dash.lines)
