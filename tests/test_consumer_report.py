"""telemetry report: from a real daemon's metrics.jsonl, and from a rotated, torn one."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry.client import TelemetryClient
from telemetry.consumers.report import make_report

ROOT = Path(__file__).resolve().parent.parent


def _check_png(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as im:
        im.verify()  # decodes the structure; raises on a broken file
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 200


def test_report_from_a_real_daemon(make_daemon, tmp_path):
    run_dir = tmp_path / "my-run-7"
    d = make_daemon(world_size=2, per_rank=True, log_dir=run_dir / "telemetry")
    clients = [TelemetryClient(d.ingest, rank=r) for r in (0, 1)]
    try:
        for c in clients:
            c.hello({"world_size": 2, "run_name": "my-run-7", "config": {"optim": {"lr": 3e-4}, "steps": 30}})
        for step in range(1, 31):
            for r, c in enumerate(clients):
                c.log(step, {"train/loss": 3.0 - step / 20 + r * 0.01, "perf/step_time": 0.2 + 0.05 * r,
                             "perf/tokens": 1024, "dataset/code/loss": 2.5 - step / 30,
                             "dataset/chat/loss": 3.1 - step / 25})
        clients[1].event("checkpoint_saved", {"path": "/ckpt/step-30"})
    finally:
        for c in clients:
            c.close()
    d.wait_for(lambda rs: any(r.get("step") == 30 and "rank" not in r for r in rs))
    d.drain()

    proc = subprocess.run([sys.executable, "-m", "telemetry", "report", str(run_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "run my-run-7" in proc.stdout and "steps              30" in proc.stdout
    out = run_dir / "telemetry" / "report"
    for name in ("loss.png", "throughput.png", "step_time.png"):
        _check_png(out / name)
    page = (out / "index.html").read_text()
    assert "<title>Run my-run-7" in page and "<h1>Run my-run-7</h1>" in page
    assert "config.optim.lr" in page and "checkpoint_saved" in page
    assert "code" in page or (out / "loss.png").exists()

    # The telemetry dir itself is accepted too, and --out is honoured.
    r = make_report(run_dir / "telemetry", tmp_path / "elsewhere")
    assert r["summary"]["num_steps"] == 30
    assert r["summary"]["step_time_spread_median"] == pytest.approx(0.05 / 0.25, rel=1e-6)
    assert (tmp_path / "elsewhere" / "index.html").exists()


def test_report_reads_rotated_and_torn_files(tmp_path):
    tel = tmp_path / "run" / "telemetry"
    tel.mkdir(parents=True)

    def line(step: int) -> str:
        return json.dumps({"kind": "metrics", "t": 1000.0 + step, "step": step,
                           "values": {"train/loss": 5.0 / step, "perf/tokens_per_second": 1000.0 + step}})

    (tel / "metrics.jsonl.1").write_text("".join(line(s) + "\n" for s in range(1, 11)))
    (tel / "metrics.jsonl.2").write_text("".join(line(s) + "\n" for s in range(11, 21)) + "not json\n")
    events = [{"kind": "event", "t": 1030.0, "rank": 0, "name": "diagnosis/loss_spike",
               "data": {"message": "loss jumped 4x at step 25", "severity": "critical"}},
              {"kind": "gpu", "t": 1030.0, "host": "n0", "gpu": 0,
               "values": {"gpu/util_percent": 90.0, "gpu/memory_used_gb": 10.0, "gpu/memory_total_gb": 80.0}}]
    (tel / "metrics.jsonl").write_text("".join(line(s) + "\n" for s in range(21, 31))
                                       + "".join(json.dumps(e) + "\n" for e in events)
                                       + '{"kind": "metrics", "t": 1031.0, "st')  # torn by a crash
    r = make_report(tmp_path / "run")
    assert r["name"] == "run"  # no hello: the run dir's name
    assert r["summary"]["num_steps"] == 30 and r["summary"]["final_loss"] == pytest.approx(5.0 / 30)
    assert r["read"].num_torn == 1 and r["read"].num_bad == 1 and r["read"].num_files == 3
    assert {p.name for p in r["images"]} == {"loss.png", "throughput.png", "gpu.png"}
    for p in r["images"]:
        _check_png(p)
    page = r["html"].read_text()
    assert "loss jumped 4x at step 25" in page and 'class="critical"' in page
    assert "a torn last line skipped" in page
    assert "mfu: no perf/mfu" in page  # what was not plotted, and why


def test_report_without_metrics_says_so(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "telemetry", "report", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no metrics.jsonl" in proc.stderr
