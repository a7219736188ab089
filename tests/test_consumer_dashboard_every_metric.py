"""Every series a run logs is on the dashboard (issue 31 item 1, first part), in a real browser.

A script of one's own logs keys the page has no chart for (`acc`, `val/loss` every 5 steps,
`nested/a/b`, a per-host series of a GPU metric it does not know); each gets a chart, in a section
per prefix after the built-in ones, holding every point the daemon wrote. The filter box keeps the
charts whose name holds its text. A key first logged after the page loaded gets its chart live.
Smoothing, the log scale and a zoom every chart of the axis follows are checked against the data;
the run's config is shown with its secret redacted; two runs compared get a colour per run and
series.

Skips only where chromium is not installed (launch/setup.sh --dev installs it with apt).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from testkit.cdp import CHROMIUM, Browser
from testkit.dashboard_proc import Dashboard, stop_with_daemon
from daemon_util import start_daemon
from telemetry.client import TelemetryClient

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; "
                                                          "launch/setup.sh --dev does it)")
NUM_STEPS = 30


def _shown(b: Browser) -> dict[str, dict]:
    return b.evaluate("Object.fromEntries([...document.querySelectorAll('[data-chart]')].filter(c => !c.hidden "
                      "&& !c.closest('section').hidden).map(c => [c.dataset.chart, {points: +c.dataset.points, "
                      "series: c.dataset.series, title: c.querySelector('h3').textContent, "
                      "group: c.closest('section').querySelector('h2').textContent}]))")


@pytest.mark.slow
def test_a_scripts_own_keys_each_get_a_chart_and_the_filter_finds_them(tmp_path):
    sockets = Path(tempfile.mkdtemp(prefix="tdash-", dir="/tmp"))
    eps = {n: f"ipc://{sockets}/{n}.sock" for n in ("ingest", "pub", "control")}
    log_dir = tmp_path / "own-run" / "telemetry"
    d = start_daemon(tmp_path, world_size=1, log_dir=log_dir, config={"daemon_record_interval_s": 1},
                     extra_args=("--ingest", eps["ingest"], "--pub", eps["pub"], "--control", eps["control"],
                                 "--run-name", "own-run"))
    tm = TelemetryClient(eps["ingest"], rank=0)
    dash = None
    try:
        tm.hello({"run_name": "own-run", "config": {"optim": {"lr": 3e-4, "betas": [0.9, 0.95]}, "batch_size": 32,
                                                     "wandb_api_key": "sk-not-for-the-page-1234"}})
        for step in range(1, NUM_STEPS + 1):
            # perf/samples: a name the metric catalogue knows (group "counts") that no built-in chart draws
            v = {"train/loss": 2.0 / step, "acc": step / NUM_STEPS, "nested/a/b": float(step % 7), "perf/samples": 8}
            if step % 5 == 0:
                v["val/loss"] = 2.5 / step
            tm.log(step, v)
        d.wait_for(lambda rs: any(r.get("step") == NUM_STEPS for r in rs if r["kind"] == "metrics"))
        steps = [r for r in d.read_jsonl() if r["kind"] == "metrics" and "rank" not in r]
        want = {k: sum(k in r["values"] for r in steps) for k in ("acc", "val/loss", "nested/a/b", "perf/samples")}
        assert want == {"acc": NUM_STEPS, "val/loss": NUM_STEPS // 5, "nested/a/b": NUM_STEPS, "perf/samples": NUM_STEPS}

        dash = Dashboard(str(tmp_path / "own-run"), "--pub", eps["pub"])
        with Browser(tmp_path / "chromium-profile", width=1400, height=1000) as b:
            b.navigate(dash.login_url)
            b.wait_for("document.body.dataset.ready === '1'", what="the page drawn")
            charts = _shown(b)
            assert charts["loss"]["points"] == NUM_STEPS                      # a built-in chart, as before
            # The run's config, flattened, its secret redacted by the daemon before anything was written.
            config = b.evaluate("Object.fromEntries([...document.querySelectorAll('#config-rows tr')]"
                                ".map(r => [r.dataset.key, r.querySelector('td').textContent]))")
            assert config["optim.lr"] == "0.0003" and config["optim.betas"] == "[0.9,0.95]", config
            assert config["batch_size"] == "32" and config["wandb_api_key"] == "<redacted>", config
            assert "sk-not-for-the-page" not in b.evaluate("document.body.innerHTML")
            for key, n in want.items():
                c = charts.get(f"auto-{key}")
                assert c is not None, sorted(charts)
                assert c["points"] == n and c["title"] == key, (key, c)
            # The run's own names by their prefix; a name the catalogue knows in its catalogue group:
            # perf/samples (group "counts"), val/loss (the catalogue's "*/loss": a dataset's loss).
            assert charts["auto-perf/samples"]["group"] == "counts (more series)"
            assert charts["auto-val/loss"]["group"] == "per dataset (more series)"
            sections = b.evaluate("[...document.querySelectorAll('#groups > section, #groups-more > section')]"
                                  ".filter(s => !s.hidden)"
                                  ".map(s => s.querySelector('h2').textContent)")
            # the run's own sections first, then the catalogue's in its order (counts before per dataset)
            assert sections.index("nested/ (logged by the run)") < sections.index("counts (more series)") \
                < sections.index("per dataset (more series)"), sections
            assert charts["auto-nested/a/b"]["group"] == "nested/ (logged by the run)"
            assert charts["auto-acc"]["group"] == "Other metrics (logged by the run)"
            # No built-in name is drawn twice.
            assert not [k for k in charts if k.startswith("auto-") and k[5:] in ("train/loss", "perf/step_time")]

            # The filter: only the charts whose name holds "loss" (train/loss's chart and val/loss).
            b.evaluate("(() => { const f = document.getElementById('filter'); f.value = 'LOSS'; "
                       "f.dispatchEvent(new Event('input')); })()")
            b.wait_for("!document.getElementById('chart-auto-acc') || document.getElementById('chart-auto-acc').hidden",
                       what="the filter applied")
            assert sorted(_shown(b)) == ["auto-val/loss", "loss"], sorted(_shown(b))
            assert "2 chart(s) shown" in b.evaluate("document.getElementById('filter-count').textContent")
            b.evaluate("(() => { const f = document.getElementById('filter'); f.value = ''; "
                       "f.dispatchEvent(new Event('input')); })()")
            b.wait_for("!document.getElementById('chart-auto-acc').hidden", what="the filter cleared")

            # A key first logged now, after the page loaded, gets its chart; one the catalogue knows
            # (perf/eval_time: "step timing", in seconds) its section and unit with its first point.
            tm.log(NUM_STEPS + 1, {"train/loss": 0.01, "late/metric": 42.0, "perf/eval_time": 0.5})
            b.wait_for("!!document.getElementById('chart-auto-late/metric') && "
                       "document.getElementById('chart-auto-late/metric').dataset.points === '1' && "
                       "!!document.getElementById('chart-auto-perf/eval_time')", what="the new keys' charts")
            shown = _shown(b)
            assert shown["auto-late/metric"]["group"] == "late/ (logged by the run)"
            assert shown["auto-perf/eval_time"]["group"] == "step timing (more series)", shown["auto-perf/eval_time"]
            assert b.evaluate("state.runs[state.order[0]].series['perf/eval_time'].unit") == "s"
            # One point on a time axis spans two minutes around it, not years (issue 31).
            spans = b.evaluate("Object.entries(state.plots).filter(([id, p]) => p.plot.data[0].length === 1)"
                               ".map(([id, p]) => [id, p.plot.series[0].label, p.plot.scales.x.max - p.plot.scales.x.min])")
            assert spans, "no chart of one point"
            assert all(abs(span - (120 if axis == "time" else 2)) < 1e-3 for _, axis, span in spans), spans
            print(f"\ndashboard screenshot: {b.screenshot(tmp_path / 'own-keys.png')}")

            # Smoothing: TensorBoard's debiased moving average of each line; markers stay as logged.
            b.evaluate("(() => { const s = document.getElementById('smooth'); s.value = '0.9'; "
                       "s.dispatchEvent(new Event('input')); })()")
            b.wait_for("document.getElementById('smooth-value').textContent === '0.9'", what="smoothing set")
            drawn = b.evaluate("state.plots['auto-acc'].plot.data[1]")
            acc = [r["values"]["acc"] for r in steps]
            ema, want_ys = 0.0, []
            for n, y in enumerate(acc, 1):
                ema = 0.9 * ema + 0.1 * y
                want_ys.append(ema / (1 - 0.9 ** n))
            assert drawn == pytest.approx(want_ys, rel=1e-9), (drawn[:5], want_ys[:5])
            assert b.evaluate("state.plots['auto-val/loss'].plot.data[1].filter(v => v != null)") == pytest.approx(
                [r["values"]["val/loss"] for r in steps if "val/loss" in r["values"]])     # markers: as logged
            b.evaluate("(() => { const s = document.getElementById('smooth'); s.value = '0'; "
                       "s.dispatchEvent(new Event('input')); })()")

            # The log scale: on every chart whose values are all positive; nested/a/b has zeros.
            b.evaluate("document.getElementById('logy').click()")
            b.wait_for("document.getElementById('chart-loss').dataset.log === '1'", what="the log scale")
            assert b.evaluate("state.plots['loss'].plot.scales.y.distr") == 3
            assert b.evaluate("document.getElementById('chart-auto-nested/a/b').dataset.log") == "0"
            b.evaluate("document.getElementById('logy').click()")
            b.wait_for("document.getElementById('chart-loss').dataset.log === '0'", what="linear again")

            # A drag on one chart zooms every chart of its axis, through live updates; a double-click undoes it.
            b.evaluate("(() => { const u = state.plots['auto-acc'].plot; const l = u.valToPos(5, 'x'); "
                       "u.setSelect({left: l, width: u.valToPos(12, 'x') - l, top: 0, height: 10}); })()")
            ranges = b.evaluate("Object.entries(state.plots).filter(([id, p]) => p.axis === 'step')"
                                ".map(([id, p]) => [id, p.plot.scales.x.min, p.plot.scales.x.max])")
            assert len(ranges) >= 4 and all(lo == pytest.approx(5, abs=0.05) and hi == pytest.approx(12, abs=0.05)
                                            for _, lo, hi in ranges), ranges
            tm.log(NUM_STEPS + 2, {"train/loss": 0.02, "acc": 0.5})
            b.wait_for(f"document.getElementById('chart-loss').dataset.lastX === '{NUM_STEPS + 2}'", what="a live step")
            assert b.evaluate("[state.plots['loss'].plot.scales.x.min, state.plots['loss'].plot.scales.x.max]") == \
                [pytest.approx(5, abs=0.05), pytest.approx(12, abs=0.05)]
            b.evaluate("state.plots['loss'].plot.over.dispatchEvent(new MouseEvent('dblclick', {bubbles: true}))")
            assert b.evaluate("state.plots['auto-acc'].plot.scales.x.max") >= NUM_STEPS + 2
            assert b.evaluate("state.zoom.step") is None

            # The x axis in wall time: each step where its record says it ended, live steps too.
            b.evaluate("(() => { const x = document.getElementById('xaxis'); x.value = 'time'; "
                       "x.dispatchEvent(new Event('change')); })()")
            b.wait_for("state.plots['loss'].plot.axes[0].label === 'time'", what="the wall-time x axis")
            tm.log(NUM_STEPS + 3, {"train/loss": 0.03})
            d.wait_for(lambda rs: any(r.get("step") == NUM_STEPS + 3 for r in rs if r["kind"] == "metrics"))
            loss_t = [r["t"] for r in d.read_jsonl() if r["kind"] == "metrics" and "rank" not in r
                      and "train/loss" in r["values"]]
            b.wait_for(f"state.plots['loss'].plot.data[0].length === {len(loss_t)}", what="the live step in time")
            assert b.evaluate("state.plots['loss'].plot.data[0]") == pytest.approx(loss_t, abs=1e-3)
            b.evaluate("(() => { const x = document.getElementById('xaxis'); x.value = 'step'; "
                       "x.dispatchEvent(new Event('change')); })()")
            b.wait_for("state.plots['loss'].plot.axes[0].label === 'step'", what="steps again")

            # Runs compared: a colour for each run, and a dash for each series of a run.
            d.wait_for(lambda rs: any(r["kind"] == "daemon" for r in rs))
            shutil.copytree(tmp_path / "own-run", tmp_path / "copy-run")
            both = Dashboard(str(tmp_path))
            try:
                b.navigate(both.login_url)
                b.wait_for("document.body.dataset.ready === '1' && state.order.length === 2", what="two runs drawn")
                b.evaluate("document.querySelector('#system > summary').click()")      # the daemon's charts
                b.wait_for("state.plots['records_lost'] !== undefined", what="the System section drawn")
                lines = b.evaluate("state.plots['records_lost'].plot.series.slice(1).map(s => "
                                   "[typeof s.stroke === 'function' ? s.stroke(state.plots['records_lost'].plot, 1) "
                                   ": s.stroke, JSON.stringify(s.dash || [])])")
                # (each run's colour, as in the runs table; a dash per series of a run)
                assert len(lines) == 6 and len(set(map(tuple, lines))) == 6, lines
                assert len({c for c, _ in lines}) == 2 and len({dash for _, dash in lines}) == 3, lines
                # The config side by side, one column per run; the same values, so no row marked.
                assert b.evaluate("document.querySelectorAll('#config-head th').length") == 3
                assert b.evaluate("document.querySelectorAll('#config-rows tr.differs').length") == 0
            finally:
                assert both.stop() == 0, "".join(both.lines)
        assert not [line for line in b.console if "exception" in line], b.console
    finally:
        tm.close()
        stop_with_daemon(dash, d, sockets)


@pytest.mark.slow
def test_hundreds_of_names_each_get_a_card_and_are_drawn_as_they_come_into_view(tmp_path):
    """300 names: a card each with its points counted, the first ones drawn at once and the rest
    when scrolled to (a run of thousands of names would otherwise build thousands of canvases
    before the page answers: benchmarks/dashboard_scale.py)."""
    import json

    log_dir = tmp_path / "wide-run" / "telemetry"
    log_dir.mkdir(parents=True)
    names = [f"g{i % 7}/m{i}" for i in range(300)]
    with open(log_dir / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"kind": "hello", "t": 1.8e9, "rank": 0, "info": {"run_name": "wide-run"}}) + "\n")
        for s in range(1, 21):
            f.write(json.dumps({"kind": "metrics", "t": 1.8e9 + s, "step": s,
                                "values": {n: float(i * s) for i, n in enumerate(names) if s % (1 + i % 3) == 0}}) + "\n")
    want = {f"auto-{n}": sum(1 for s in range(1, 21) if s % (1 + i % 3) == 0) for i, n in enumerate(names)}
    dash = Dashboard(str(tmp_path / "wide-run"))
    try:
        with Browser(tmp_path / "chromium-profile", width=1400, height=1000) as b:
            b.navigate(dash.login_url)
            b.wait_for("document.body.dataset.ready === '1'", what="the page drawn")
            cards = b.evaluate("Object.fromEntries([...document.querySelectorAll('[data-chart^=auto-]')]"
                               ".map(c => [c.dataset.chart, +c.dataset.points]))")
            assert cards == want
            drawn = b.evaluate("Object.keys(state.plots).length")
            assert 0 < drawn <= 60, drawn
            last = "auto-" + sorted(names, key=lambda n: (n.split("/")[0], int(n.split("/m")[1])))[-1]
            assert b.evaluate(f"!state.plots['{last}']")
            b.evaluate(f"document.getElementById('chart-{last}').scrollIntoView()")
            b.wait_for(f"!!state.plots['{last}']", what="the last chart drawn once in view")
        assert not [line for line in b.console if "exception" in line], b.console
    finally:
        assert dash.stop() == 0, "".join(dash.lines)


@pytest.mark.slow
def test_a_wandb_script_switched_with_one_line_shows_its_own_keys(tmp_path):
    """tests/dropin_scripts/wandb_features.py, a plain W&B script, run unmodified under
    `telemetry run --as-wandb`: its keys (loss, opt.lr from a nested dict, val/loss against its
    own step metric, epoch, late at step 20) each have a chart holding what the daemon wrote."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update(PYTHONPATH=str(root), WANDB_SILENT="true", WANDB_DIR=str(tmp_path), TELEMETRY_RUNTIME_DIR=str(tmp_path / "rt"))
    p = subprocess.run([sys.executable, "-m", "telemetry", "run", "--as-wandb", "--quiet", "--wandb", "disabled",
                        "--nproc", "1", "--run-dir", str(tmp_path / "r"), "--",
                        str(root / "tests" / "dropin_scripts" / "wandb_features.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    from telemetry.consumers.readjsonl import find_log_dir

    recs = [json.loads(line) for line in (find_log_dir(tmp_path / "r") / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["kind"] == "metrics" and "rank" not in r]
    keys = sorted({k for r in steps for k in r["values"] if k in ("loss", "opt/lr", "val/loss", "epoch", "late")})
    assert keys == ["epoch", "late", "loss", "opt/lr", "val/loss"], sorted({k for r in steps for k in r["values"]})
    want = {k: sum(k in r["values"] for r in steps) for k in keys}
    dash = Dashboard(str(tmp_path / "r"))
    try:
        with Browser(tmp_path / "chromium-profile", width=1400, height=1000) as b:
            b.navigate(dash.login_url)
            b.wait_for("document.body.dataset.ready === '1'", what="the page drawn")
            charts = _shown(b)
            for k, n in want.items():
                assert charts.get(f"auto-{k}", {}).get("points") == n, (k, n, sorted(charts))
            assert charts["auto-opt/lr"]["group"] == "opt/ (logged by the run)"
            # The run's config, as the script's wandb.init and config.update gave it.
            config = b.evaluate("Object.fromEntries([...document.querySelectorAll('#config-rows tr')]"
                                ".map(r => [r.dataset.key, r.querySelector('td').textContent]))")
            assert config.get("lr") == "0.1" and config.get("batch") == "8", config
            # Each chart as wide as its card: nothing wider than the window (charts drawn before
            # any card existed were 860 px in 690 px cards, overlapping their neighbours).
            assert b.evaluate("document.documentElement.scrollWidth") <= 1400
            assert b.evaluate("[...document.querySelectorAll('.card')].filter(c => !c.hidden && c.querySelector('.uplot'))"
                              ".every(c => c.querySelector('.uplot').offsetWidth <= c.clientWidth)")
            print(f"\ndashboard screenshot: {b.screenshot(tmp_path / 'dropin.png')}")
        assert not [line for line in b.console if "exception" in line], b.console
    finally:
        assert dash.stop() == 0, "".join(dash.lines)
