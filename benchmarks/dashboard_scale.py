"""The dashboard with thousands of metric names (issue 31 item 3): how long the page takes to be
drawn, how long a chart far down takes once scrolled to, how long a filter and a zoom take to
redraw, the page's JS heap, and the dashboard process's memory (peak RSS, VmHWM).

    .venv/bin/python -m benchmarks.dashboard_scale [--names 2000] [--steps 1000] [--memory-mb 256]

Writes a run of --names metric names (40 prefixes, so 40 sections) logged at every one of
--steps steps, serves it with `telemetry dashboard`, and loads the page in headless Chromium
(testkit/cdp.py; needs `chromium`). Every name gets a chart; the first EAGER_CHARTS are drawn at
once, the rest as they come near the viewport.
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path


def write_run(root: Path, names: int, steps: int) -> Path:
    import numpy as np

    log_dir = root / "scale-run" / "telemetry"
    log_dir.mkdir(parents=True)
    t0 = time.time() - steps
    keys = [f'"grp{i % 40}/m{i}":' for i in range(names)]
    phase = np.arange(names, dtype=np.float64)
    every = max(1, steps // 20)
    with open(log_dir / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"kind": "hello", "t": t0, "rank": 0, "info": {"run_name": "scale-run"}}) + "\n")
        for s in range(1, steps + 1):
            vals = np.sin(s / 50 + phase).round(6).tolist()
            body = ",".join(k + repr(v) for k, v in zip(keys, vals))
            f.write(f'{{"kind":"metrics","t":{t0 + s},"step":{s},"values":{{{body},"train/loss":{1.0 / s!r}}}}}\n')
            if s % every == 0:
                print(f"  written {s:,} of {steps:,} steps", flush=True)
    return root / "scale-run"


def _vm(pid: int, key: str) -> float:
    """A /proc/<pid>/status figure (VmRSS, VmHWM) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    from testkit.cdp import CHROMIUM, Browser
    from testkit.dashboard_proc import Dashboard

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--memory-mb", type=int, default=256, help="the dashboard's --memory-mb (its default)")
    a = ap.parse_args(argv)
    if CHROMIUM is None:
        print("dashboard_scale: chromium is not installed (apt-get install chromium)")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp), a.names, a.steps)
        size_mb = (run / "telemetry" / "metrics.jsonl").stat().st_size / 2**20
        t0 = time.monotonic()
        dash = Dashboard(str(run), "--memory-mb", str(a.memory_mb), ready_timeout_s=3600)
        served_s = time.monotonic() - t0
        rss_served = _vm(dash.proc.pid, "VmRSS")
        try:
            with Browser(Path(tmp) / "profile", width=1400, height=1000) as b:
                t1 = time.monotonic()
                b.navigate(dash.login_url)
                b.wait_for("document.body.dataset.ready === '1'", timeout_s=300, what="the page drawn")
                ready_s = time.monotonic() - t1
                # A history past --wait-history-mb is read while serving: the page is drawn at once
                # with what came so far; wait for all of it before the rest.
                b.wait_for("Object.values(state.status).every(s => !s.loading_history) && !state.reloading",
                           timeout_s=7200, what="the history read")
                history_s = time.monotonic() - t0
                b.wait_for("document.body.dataset.ready === '1' && Object.keys(state.plots).length > 0",
                           timeout_s=300, what="the page drawn again")
                # Opened again, with the whole history: what a user opening the run now waits.
                t1b = time.monotonic()
                b.navigate(dash.login_url)
                b.wait_for("document.body.dataset.ready === '1' && Object.keys(state.plots).length > 0",
                           timeout_s=300, what="the page opened again")
                reopen_s = time.monotonic() - t1b
                cards = b.evaluate("document.querySelectorAll('[data-chart]').length")
                plots = b.evaluate("Object.keys(state.plots).length")
                last = f"auto-grp{(a.names - 1) % 40}/m{a.names - 1}"
                t2 = time.monotonic()
                b.evaluate(f"document.getElementById('chart-{last}').scrollIntoView()")
                b.wait_for(f"!!state.plots['{last}']", timeout_s=60, what="the last chart drawn")
                scroll_s = time.monotonic() - t2
                # Responsive: a filter typed, then cleared; a zoom on the loss chart (every step chart follows).
                t3 = time.monotonic()
                b.evaluate("(() => { const f = document.getElementById('filter'); f.value = 'grp7/'; "
                           "f.dispatchEvent(new Event('input')); })()")
                shown = b.evaluate("document.querySelectorAll('[data-chart]:not([hidden])').length")
                b.evaluate("(() => { const f = document.getElementById('filter'); f.value = ''; "
                           "f.dispatchEvent(new Event('input')); })()")
                filter_s = time.monotonic() - t3
                # A zoom into 2 % of the steps: drawn at once from what the page holds, then every
                # point of the range fetched again (/api/range; from the files where the store
                # thinned the series: the first one also indexes them).
                zooms = []
                for lo in (a.steps // 3, a.steps // 2):
                    hi = lo + max(1, a.steps // 50)
                    t4 = time.monotonic()
                    b.evaluate(f"zoomTo('step', {lo}, {hi}); redraw()")
                    shown_s = time.monotonic() - t4
                    b.wait_for(f"document.body.dataset.detail === '{lo}-{hi}'", timeout_s=600, what="the zoom's detail")
                    b.evaluate("redraw()")
                    zooms.append((shown_s, time.monotonic() - t4))
                b.evaluate("zoomTo('step', null, null)")
                heap = b.evaluate("performance.memory ? performance.memory.usedJSHeapSize : -1")
                t5 = time.monotonic()
                answer = dash.get(f"/api/data?width={b.evaluate('chartWidth()')}")
                api_s = time.monotonic() - t5
            rss_now, rss_peak = _vm(dash.proc.pid, "VmRSS"), _vm(dash.proc.pid, "VmHWM")
            budget = dash.get_json("/api/data?width=400")["status"][0].get("budget", {})
        finally:
            dash.stop()
    print(f"{a.names:,} names x {a.steps:,} steps ({size_mb:.0f} MB of JSONL): served after {served_s:.1f} s, "
          f"the whole history read {history_s:.1f} s after start; page opened again then drawn in {reopen_s:.2f} s; first page drawn {ready_s:.2f} s after navigation with {cards:,} chart cards and "
          f"{plots} charts drawn; the last chart drawn {scroll_s:.2f} s after scrolling to it; JS heap "
          f"{heap / 2**20:.0f} MB; filter typed and cleared {filter_s:.2f} s ({shown} charts matched); a zoom into 2 % "
          f"of the steps drawn {zooms[0][0]:.2f} s, every point of it {zooms[0][1]:.2f} s (first, with the index), "
          f"another {zooms[1][0]:.2f} s / {zooms[1][1]:.2f} s; /api/data {len(answer) / 2**20:.1f} MB in {api_s:.2f} s; dashboard RSS "
          f"{rss_served:.0f} MB when serving, {rss_now:.0f} MB after, peak {rss_peak:.0f} MB (--memory-mb "
          f"{a.memory_mb}); shed: {json.dumps(budget)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
