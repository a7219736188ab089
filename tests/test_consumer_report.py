"""telemetry report: from a real daemon's metrics.jsonl, and from a rotated, torn one."""
from __future__ import annotations

import json
import math
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
                values = {"train/loss": 3.0 - step / 20 + r * 0.01, "perf/step_time": 0.2 + 0.05 * r,
                          "perf/tokens": 1024, "dataset/code/loss": 2.5 - step / 30,
                          "dataset/chat/loss": 3.1 - step / 25, "train/lr": 1e-3 * min(1, step / 10),
                          "train/grad_norm": 1.0 + step % 4, "perf/forward_time": 0.05, "perf/backward_time": 0.1,
                          "perf/optimizer_time": 0.02, "perf/data_loading_time": 0.01}
                if step % 10 == 0:
                    values.update({"eval/code/loss": 2.0 - step / 40, "eval/code/accuracy": step / 40,
                                   "eval/chat/loss": 2.8 - step / 40})
                c.log(step, values)
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
    assert "eval loss (last)   chat 2.0500, code 1.2500" in proc.stdout, proc.stdout
    out = run_dir / "telemetry" / "report"
    for name in ("loss.png", "throughput.png", "step_time.png", "training.png", "phases.png", "eval.png"):
        _check_png(out / name)
    page = (out / "index.html").read_text()
    assert "<title>Run my-run-7" in page and "<h1>Run my-run-7</h1>" in page
    assert "config.optim.lr" in page and "checkpoint_saved" in page
    assert "code" in page or (out / "loss.png").exists()
    # Where the time went: the goodput ledger, as `telemetry goodput` has it, biggest loss first.
    assert "goodput: " in proc.stdout and "(30 steps, 1 launch(es))" in proc.stdout, proc.stdout
    assert "  productive" in proc.stdout and "  startup" in proc.stdout
    assert "Where the time went: goodput" in page and "<th>startup</th>" in page
    # The daemon kept per-rank records: each rank's own ledger, in the text and on the page.
    assert "per rank (from its own process start to its last record; 2 rank(s)" in proc.stdout, proc.stdout
    assert "Per rank (from its own process start)" in page and page.count("<tr><th>0</th>") == 1
    assert page.count("<tr><th>1</th>") == 1

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
    # Every metric, grouped and with its unit as the catalogue says.
    assert "<h2>Every metric (2)</h2>" in page and "<td>perf/tokens_per_second</td><td>30</td>" in page
    assert "<th>training</th><td>train/loss</td><td>30</td><td>5</td><td>0.16667</td>" in page
    assert "<td>1030 tokens/s</td>" in page, page


def test_report_without_metrics_says_so(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "telemetry", "report", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no metrics.jsonl" in proc.stderr


def test_time_plots_leave_a_gap_where_the_daemon_was_down():
    from telemetry.consumers.report import time_line

    ts = [float(t) for t in range(0, 20)] + [float(t) for t in range(200, 220)]   # 3 minutes without records
    xs, ys = time_line(ts, [50.0] * len(ts))
    assert len(xs) == 41 and math.isnan(ys[20]) and 19 < xs[20] < 200
    assert not any(math.isnan(y) for y in ys[:20] + ys[21:])


def test_a_resumed_run_counts_every_daemon_s_records(make_daemon, tmp_path):
    run_dir = tmp_path / "resumed"
    finals = []
    for first, last in ((1, 10), (11, 25)):   # a second daemon appends to the same metrics.jsonl
        d = make_daemon(world_size=1, log_dir=run_dir / "telemetry")
        c = TelemetryClient(d.ingest, rank=0)
        for step in range(first, last + 1):
            c.log(step, {"train/loss": 1.0, "perf/step_time": 0.1})
        c.close()
        d.wait_for(lambda rs: any(r.get("step") == last for r in rs))
        finals.append(d.drain()["records_in"])
    r = make_report(run_dir)
    assert finals[0] > 0 and finals[1] > 0
    assert r["summary"]["records_in"] == finals[0] + finals[1]
    assert r["summary"]["num_daemons"] == 2
    proc = subprocess.run([sys.executable, "-m", "telemetry.consumers.summary", str(run_dir / "telemetry")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert f"records in         {finals[0] + finals[1]}  (over 2 daemon runs)" in proc.stdout, proc.stdout


def test_hang_and_crash_events_are_listed_first_with_their_bundle(tmp_path):
    # issue 19: a hang early in the run stays in the text summary however many events follow it,
    # and the report says where its forensics bundle is.
    from telemetry.consumers.report import collect, summarize, text_summary

    hang = {"kind": "event", "t": 1001.0, "rank": 1, "name": "diagnosis/hang",
            "data": {"message": "hang: rank 1 is in load_batch", "severity": "critical",
                     "bundle": "/logs/forensics/20261123-120000-hang"}}
    later = [{"kind": "event", "t": 1002.0 + i, "rank": None, "name": "diagnosis/loss_spike",
              "data": {"message": f"spike {i}", "severity": "warning"}} for i in range(8)]
    steps = [{"kind": "metrics", "t": 1000.0, "step": 1, "values": {"train/loss": 2.0}}]
    d = collect(steps + [hang] + later)
    text = text_summary("run", summarize(d), d)
    assert "!!diagnosis/hang: hang: rank 1 is in load_batch [forensics: /logs/forensics/20261123-120000-hang]" in text
    assert "spike 7" in text and "spike 0" not in text
