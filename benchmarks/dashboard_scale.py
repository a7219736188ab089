"""The dashboard with thousands of metric names (issue 31 item 3): how long the page takes to be
drawn, how long a chart far down takes once scrolled to, and the page's JS heap.

    .venv/bin/python -m benchmarks.dashboard_scale [--names 2000] [--steps 1000]

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
    log_dir = root / "scale-run" / "telemetry"
    log_dir.mkdir(parents=True)
    t0 = time.time() - steps
    with open(log_dir / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"kind": "hello", "t": t0, "rank": 0, "info": {"run_name": "scale-run"}}) + "\n")
        for s in range(1, steps + 1):
            v = {f"grp{i % 40}/m{i}": math.sin(s / 50 + i) for i in range(names)}
            v["train/loss"] = 1.0 / s
            f.write(json.dumps({"kind": "metrics", "t": t0 + s, "step": s, "values": v}) + "\n")
    return root / "scale-run"


def main(argv: list[str] | None = None) -> int:
    from testkit.cdp import CHROMIUM, Browser
    from testkit.dashboard_proc import Dashboard

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=1000)
    a = ap.parse_args(argv)
    if CHROMIUM is None:
        print("dashboard_scale: chromium is not installed (apt-get install chromium)")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp), a.names, a.steps)
        size_mb = (run / "telemetry" / "metrics.jsonl").stat().st_size / 2**20
        t0 = time.monotonic()
        dash = Dashboard(str(run), ready_timeout_s=600)
        served_s = time.monotonic() - t0
        try:
            with Browser(Path(tmp) / "profile", width=1400, height=1000) as b:
                t1 = time.monotonic()
                b.navigate(dash.login_url)
                b.wait_for("document.body.dataset.ready === '1'", timeout_s=300, what="the page drawn")
                ready_s = time.monotonic() - t1
                cards = b.evaluate("document.querySelectorAll('[data-chart]').length")
                plots = b.evaluate("Object.keys(state.plots).length")
                last = f"auto-grp{(a.names - 1) % 40}/m{a.names - 1}"
                t2 = time.monotonic()
                b.evaluate(f"document.getElementById('chart-{last}').scrollIntoView()")
                b.wait_for(f"!!state.plots['{last}']", timeout_s=60, what="the last chart drawn")
                scroll_s = time.monotonic() - t2
                heap = b.evaluate("performance.memory ? performance.memory.usedJSHeapSize : -1")
        finally:
            dash.stop()
    print(f"{a.names:,} names x {a.steps:,} steps ({size_mb:.0f} MB of JSONL): served after {served_s:.1f} s "
          f"(history read); page drawn {ready_s:.2f} s after navigation with {cards:,} chart cards and "
          f"{plots} charts drawn; the last chart drawn {scroll_s:.2f} s after scrolling to it; JS heap "
          f"{heap / 2**20:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
