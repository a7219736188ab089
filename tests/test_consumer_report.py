"""telemetry report: from a real daemon's metrics.jsonl, and from a rotated, torn one."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry.client import TelemetryClient
from telemetry.consumers.report import make_report

ROOT = Path(__file__).resolve().parent.parent


def _check_png(path: Path, min_width: int = 600, min_height: int = 200) -> None:
    from PIL import Image

    with Image.open(path) as im:
        im.verify()  # decodes the structure; raises on a broken file
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] >= min_width and im.size[1] >= min_height


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
    # Not a run: bad input, one line, exit 2 (it was 1).
    assert proc.returncode == 2 and "no metrics.jsonl" in proc.stderr and len(proc.stderr.splitlines()) == 1


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


def test_a_wandb_script_s_report_plots_its_own_keys_and_shows_its_media_and_summary(make_daemon, tmp_path,
                                                                                      monkeypatch):
    """A plain W&B script through the drop-in: every key it logged has its plot, its image is on
    the page, its histogram drawn, its table shown, its summary, name and config said; the NaN it
    logged is counted, not drawn."""
    import numpy as np

    import telemetry.wandb as tw

    run_dir = tmp_path / "script-run"
    media = tmp_path / "media-tmp"
    d = make_daemon(world_size=1, log_dir=run_dir / "telemetry", env={"TELEMETRY_MEDIA_DIR": str(media)})
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(media))
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    rng = np.random.default_rng(3)
    own = ["acc", "val/bleu", "val/ppl", "speed"]
    try:
        run = tw.init(project="mt", name="bleu-sweep-3", config={"lr": 0.01, "layers": 6}, tags=["baseline"])
        for s in range(1, 13):
            run.log({"acc": s / 12, "val/bleu": 20 + s, "val/ppl": float("nan") if s == 6 else 30 - s,
                     "speed": 100 + s % 3}, step=s)
        run.log({"samples": tw.Image(rng.integers(0, 255, (16, 24, 3), dtype=np.uint8), caption="first batch"),
                 "weights": tw.Histogram(rng.normal(size=500), num_bins=16),
                 "preds": tw.Table(columns=["src", "hyp"], data=[["guten tag", "good day"], ["danke", "thanks"]])},
                step=12)
        run.summary["best_bleu"] = 31.5
    finally:
        tw.finish()
    index = run_dir / "telemetry" / "media" / "index.jsonl"
    d.wait_for(lambda rs: any(r.get("step") == 12 and "rank" not in r for r in rs))
    assert d.drain()["drained"]
    assert index.exists() and len(index.read_text().splitlines()) == 3

    proc = subprocess.run([sys.executable, "-m", "telemetry", "report", str(run_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "run bleu-sweep-3" in proc.stdout and "best_bleu 31.5" in proc.stdout, proc.stdout
    # Its own keys' last values in the text; none of our trainer's figures it has no data for.
    assert "your metrics       acc 1, speed 100, val/bleu 32, val/ppl 18 (last values)" in proc.stdout
    assert "  loss " not in proc.stdout and "MFU" not in proc.stdout
    out = run_dir / "telemetry" / "report"
    page = (out / "index.html").read_text()
    assert "<h1>Run bleu-sweep-3</h1>" in page
    # A plot per own key, named on the page, each a real PNG; the user's keys come first.
    plotted = re.findall(r'<figure class="metric"><img src="([^"]+)" alt="([^"]+)">', page)
    keys = [k for _, k in plotted]
    assert keys[:len(own)] == sorted(own, key=lambda k: ("/" not in k, k)), keys
    for src, _ in plotted:
        _check_png(out / src, min_width=300, min_height=150)
    # The NaN is counted beside its key's plot, not drawn.
    assert "val/ppl" in page and "1 NaN/Inf not drawn" in page
    # The image, as the daemon kept it, on the page.
    imgs = re.findall(r'<img src="(media/[^"]+\.png)" alt="samples', page)
    assert len(imgs) == 1 and "first batch" in page
    from PIL import Image

    with Image.open(out / imgs[0]) as im:
        assert im.size == (24, 16)
    # The histogram drawn, the table as a table.
    hist = re.findall(r'<img src="(media/[^"]+\.png)" alt="weights', page)
    assert len(hist) == 1
    _check_png(out / hist[0], min_width=300, min_height=150)
    assert "<td>guten tag</td><td>good day</td>" in page
    # The summary, the config, the tags.
    assert re.search(r"<th>best_bleu</th><td>31\.5</td>", page), page
    assert "config.lr" in page and "baseline" in page


def test_a_wide_long_run_is_reported_within_its_bounds(tmp_path, monkeypatch):
    """However many keys and steps: each series holds a bounded number of points (its count,
    first, last, min and max stay exact), the plots stop at their cap and the page says how many
    were left out; a series past the held ones keeps its figures and is said not plotted."""
    from telemetry.consumers import report

    monkeypatch.setattr(report, "SERIES_POINTS", 64)
    monkeypatch.setattr(report, "MAX_SERIES_HELD", 5)
    monkeypatch.setattr(report, "MAX_METRIC_PLOTS", 4)
    tel = tmp_path / "wide" / "telemetry"
    tel.mkdir(parents=True)
    keys = [f"grp/k{i}" for i in range(7)]
    with open(tel / "metrics.jsonl", "w") as f:
        for step in range(1, 1001):
            values = {k: (None if step == 500 and i == 0 else step * (i + 1) - (step % 7)) for i, k in enumerate(keys)}
            f.write(json.dumps({"kind": "metrics", "t": 1000.0 + step, "step": step, "values": values}) + "\n")
    r = make_report(tel)
    d = r["data"]
    first = d.steps["grp/k0"]
    assert 32 <= len(first.ys) <= 64 and first.held
    assert (first.n, first.num_nonfinite, first.first, first.last) == (999, 1, 0.0, 1000 - 1000 % 7)
    assert first.max == max(s - s % 7 for s in range(1, 1001) if s != 500)
    assert [k for k in keys if not d.steps[k].held] == keys[5:]          # past MAX_SERIES_HELD: figures only
    assert d.steps["grp/k6"].n == 1000 and d.steps["grp/k6"].max == 7000 - 1000 % 7
    assert r["summary"]["num_steps"] == 1000
    page = r["html"].read_text()
    assert len(r["metric_plots"]) == 4 and page.count('<figure class="metric"><img') == 4
    assert "3 more metric(s) not plotted (at most 4 plots)" in page
    assert "<td>grp/k6</td><td>1000</td>" in page
    for p in r["metric_plots"]:
        _check_png(p, min_width=300, min_height=150)


def test_media_the_report_cannot_trust_is_bounded_and_said(tmp_path):
    """A media index damaged or hand-made: a line that is not an entry is counted, a file name
    outside the kept files is never read, a big table is cut (and says so), a histogram without
    its counts is said not shown; the rest of the page is made."""
    tel = tmp_path / "run" / "telemetry"
    (tel / "media").mkdir(parents=True)
    metrics = {"kind": "metrics", "t": 1.0, "step": 1, "values": {"acc": 0.5}}
    (tel / "metrics.jsonl").write_text(json.dumps(metrics) + "\n")
    (tel / "media" / "0.json").write_text(json.dumps({"columns": [f"c{i}" for i in range(30)],
                                                      "data": [[f"r{r}c{i}" for i in range(30)] for r in range(100)]}))
    entries = [{"step": 1, "key": "big", "type": "Table", "file": "0.json"},
               {"step": 1, "key": "escape", "type": "Image", "images": [{"file": "../metrics.jsonl"}]},
               {"step": 1, "key": "hist", "type": "Histogram", "bins": [0, 1, 2], "counts": [3]}]
    (tel / "media" / "index.jsonl").write_text("not json\n" + "".join(json.dumps(x) + "\n" for x in entries))
    page = make_report(tel)["html"].read_text()
    assert "1 unreadable media index line(s) skipped" in page
    assert "the first 50 of 100 rows, the first 20 of 30 columns" in page and "<td>r49c19</td>" in page
    assert "r50c0" not in page and "r0c20" not in page
    assert "an image the daemon did not keep whole" in page and not (tel / "report" / "media" / "1-0.png").exists()
    assert "not shown: ValueError: a histogram without its bins and counts" in page
    assert '<img src="metrics/0.png" alt="acc">' in page


# A daemon record as a daemon wrote it before its counters took status's names.
_OLD_DAEMON_VALUES = {"telemetry/records_in": 120, "telemetry/dropped": 7, "telemetry/dropped_by_clients": 4,
                      "telemetry/lost_in_transit": 3, "telemetry/hellos_in": 2, "telemetry/events_in": 1,
                      "telemetry/byes_in": 2, "telemetry/memory_shed": 5, "telemetry/sink_dropped": 0,
                      "telemetry/uptime_s": 30.0}


def test_an_older_daemon_s_counters_are_read_under_their_names_now(tmp_path):
    """A run dir written by a daemon before the renames: report, summary, the dashboard's store
    and tail's view still show its counts (the old names read as the new ones)."""
    from telemetry.consumers.dashboard.store import RunStore
    from telemetry.consumers.tail import TailState

    tel = tmp_path / "old" / "telemetry"
    tel.mkdir(parents=True)
    recs = [{"kind": "metrics", "t": 1000.0 + s, "step": s, "values": {"train/loss": 1.0 / s}} for s in range(1, 6)]
    recs.append({"kind": "daemon", "t": 1006.0, "values": _OLD_DAEMON_VALUES})
    (tel / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    r = make_report(tmp_path / "old")
    assert r["summary"]["dropped"] == 7 and r["summary"]["records_in"] == 120
    proc = subprocess.run([sys.executable, "-m", "telemetry.consumers.summary", str(tel)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "records dropped    7 " in proc.stdout, proc.stdout
    s = RunStore("r0", "old", None)
    for rec in recs:
        s.consume(rec)
    daemon = s.status()["daemon"]
    assert daemon["telemetry/records_lost"] == 7 and daemon["telemetry/records_lost_in_transit"] == 3
    assert daemon["telemetry/records_in_by_kind/hello"] == 2 and daemon["telemetry/memory/records_shed"] == 5
    assert "telemetry/dropped" not in daemon
    keys = {x["key"] for x in s.snapshot(800)["series"]}
    assert {"telemetry/records_lost", "telemetry/records_lost_in_transit"} <= keys and "telemetry/dropped" not in keys
    t = TailState()
    t.consume("daemon", recs[-1])
    assert t.daemon["telemetry/records_lost"] == 7 and t.daemon["telemetry/records_dropped_by_clients"] == 4


def test_a_deleted_summary_key_leaves_the_reports_summary():
    """`del run.summary[...]` in a W&B script (a wandb/summary_remove event after the sets): the
    report's summary is the run's, without the key and what was nested under it."""
    from telemetry.consumers.report import collect

    ev = lambda name, data: {"kind": "event", "name": name, "rank": 0, "t": 1.0, "data": data}  # noqa: E731
    d = collect([ev("wandb/summary", {"best": 7, "nest/p": 1, "nest/q/r": 2, "nested_not": 3}),
                 ev("wandb/summary_at", {"step": 2, "roots": ["best"]}),
                 ev("wandb/summary_remove", {"step": 2, "paths": [["best"], ["nest", "q"], ["absent"]]})])
    assert d.summary == {"nest/p": 1, "nested_not": 3}
    assert not d.events          # bookkeeping, not events the report lists


def test_the_text_summary_says_how_the_run_ended(tmp_path):
    """A rank's failed finish (`train_end`), with the launcher's exit code (`script_exit`) beside
    it, else the launcher's exit code: the text report said neither, so a crashed run read like
    any other; then it took a driver's exit 0 over the run's own failure."""
    from telemetry.consumers.report import collect, summarize, text_summary

    steps = [{"kind": "metrics", "t": 1000.0, "step": 1, "values": {"train/loss": 2.0}}]

    def ended(*events):
        d = collect(steps + [{"kind": "event", "t": 1001.0 + i, "rank": r, "name": n, "data": data}
                             for i, (n, r, data) in enumerate(events)])
        lines = [line for line in text_summary("run", summarize(d), d).split("\n") if line.startswith("  ended")]
        return lines[0].split(None, 1)[1] if lines else None

    assert ended() is None
    assert ended(("script_exit", None, {"exit_code": 0})) == "successfully (the script's exit code 0)"
    assert ended(("script_exit", None, {"exit_code": 137})) == "FAILED (the script's exit code 137: SIGKILL)"
    assert ended(("script_exit", None, {"exit_code": 3})) == "FAILED (the script's exit code 3)"
    assert ended(("train_end", 0, {"exit_code": 2})) == "FAILED (rank 0's run finished with exit code 2)"
    assert ended(("train_end", 0, {"exit_code": 0})) is None
    # The run's own failure over a driver that exited 0 (its W&B run records the failure too),
    # the driver's code beside it; the lowest failed rank's; a resumed rank's later finish counts.
    assert ended(("train_end", 0, {"exit_code": 2}), ("script_exit", None, {"exit_code": 0})) == \
        "FAILED (rank 0's run finished with exit code 2; the script's exit code 0)"
    assert ended(("train_end", 3, {"exit_code": 137}), ("train_end", 1, {"exit_code": 1}),
                 ("script_exit", None, {"exit_code": 1})) == \
        "FAILED (rank 1's run finished with exit code 1; the script's exit code 1)"
    assert ended(("train_end", 0, {"exit_code": 1}), ("train_end", 0, {"exit_code": 0}),
                 ("script_exit", None, {"exit_code": 0})) == "successfully (the script's exit code 0)"


FIRST_TRIAL_FAILS = """\
import multiprocessing as mp, sys, time
import wandb

def trial(k):
    time.sleep(3 * k)                    # trial 0 inits first: its run is the launch's
    wandb.init(project="sweep", config={"trial": k})
    for i in range(5):
        wandb.log({"loss": k * 100 + i})
    if k == 0:
        raise ValueError("trial 0 diverged")
    wandb.finish()

if __name__ == "__main__":
    mp.set_start_method("spawn")
    ps = [mp.Process(target=trial, args=(k,)) for k in range(2)]
    [p.start() for p in ps]
    [p.join() for p in ps]
    print("trial exit codes", [p.exitcode for p in ps], flush=True)
"""


def test_a_failed_trial_under_a_driver_that_exits_0_is_a_failed_run(tmp_path):
    """An outside report: a sweep driver runs two trials in spawned children under `telemetry run
    --as-wandb`; the first trial's W&B run (the launch's) raises, the driver exits 0. The run's
    own train_end and its W&B run say exit code 1, yet the report and the run summary said it
    ended successfully (the script's exit code 0). Both now say FAILED, the driver's code beside."""
    import glob
    import os

    from wandb_offline import read_records, wait_finished

    (tmp_path / "sweep.py").write_text(FIRST_TRIAL_FAILS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update({"PYTHONPATH": str(ROOT), "TELEMETRY_RUNTIME_DIR": str(tmp_path / "rt"), "WANDB_SILENT": "true"})
    launch = subprocess.run([sys.executable, "-m", "telemetry", "run", "--as-wandb", "--wandb", "offline",
                             "--run-dir", "r/launch", "--", "sweep.py"], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    out = launch.stdout + launch.stderr
    assert launch.returncode == 0 and "trial exit codes [1, 0]" in out, out[-3000:]
    (run_file,) = glob.glob(str(tmp_path / "r" / "launch" / "wandb" / "offline-run-*" / "run-*.wandb"))
    exits = [r.exit.exit_code for r in read_records(wait_finished(run_file)) if r.WhichOneof("record_type") == "exit"]
    assert exits == [1], exits              # the launch's W&B run: the failed trial's
    said = "FAILED (rank 0's run finished with exit code 1; the script's exit code 0)"
    summary = [line.split(None, 1)[1] for line in out.splitlines() if line.startswith("  ended ")]
    assert summary == [said], out[-3000:]
    report = subprocess.run([sys.executable, "-m", "telemetry", "report", "r/launch", "--out", "rep"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    ended = [line.split(None, 1)[1] for line in report.stdout.splitlines() if line.startswith("  ended ")]
    assert report.returncode == 0 and ended == [said], report.stdout + report.stderr


def test_the_report_says_what_the_drain_found_lost_or_not_made(tmp_path):
    """The final counters (drain.json) say what metrics.jsonl cannot: a W&B run W&B refused to
    make, records the deadline left unread. The report read metrics.jsonl only, so it said
    nothing of either; an object of another shape is read for what it holds (nothing)."""
    tel = tmp_path / "run" / "telemetry"
    tel.mkdir(parents=True)
    (tel / "metrics.jsonl").write_text("".join(json.dumps(
        {"kind": "metrics", "t": 1000.0 + s, "step": s, "values": {"train/loss": 1.0 / s}}) + "\n" for s in range(1, 6)))

    def report(drain):
        if drain is not None:
            (tel / "drain.json").write_text(drain if isinstance(drain, str) else json.dumps(drain))
        proc = subprocess.run([sys.executable, "-m", "telemetry", "report", str(tmp_path / "run"),
                               "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        said = [line.split(None, 3)[3] for line in proc.stdout.splitlines() if line.startswith("  at the drain")]
        return said, (tmp_path / "out" / "index.html").read_text()

    final = {"drained": True, "records_unread_at_drain": 1234,
             "sinks": {"jsonl": {"written": 5}, "wandb": {"opened": False, "dropped": 7,
                                                         "open_error": "UsageError('Invalid project name')"}}}
    said, page = report(final)
    assert said == ["1,234 records queued at the deadline were counted, not processed (raise drain_timeout_s)",
                    "the W&B run was not made: UsageError('Invalid project name') (7 records not in W&B; "
                    "metrics.jsonl has the run)"], said
    assert "<th>at the drain</th><td>the W&amp;B run was not made: UsageError(&#x27;Invalid project name&#x27;)" in page
    final["sinks"]["wandb"]["opened"] = True          # made after all (a retry): nothing to say of it
    del final["records_unread_at_drain"]
    assert report(final)[0] == []
    for not_the_daemons in ('{"sinks": [1]}', '{"sinks": {"wandb": 3}}'):
        assert report(not_the_daemons)[0] == [], not_the_daemons
    (tel / "drain.json").unlink()
    assert report(None)[0] == []


@pytest.mark.parametrize("drain, why", [
    ('{"records_in": 12, "records_l', "not JSON (Unterminated string starting at: line 1 column 20)"),
    ("", "not JSON (Expecting value: line 1 column 1)"),        # a disk that filled as it was written
    ("[1, 2]", "not a JSON object"),
    ("\udcff", "not UTF-8 text"),
    (None, "not a regular file"),                                  # a directory at its name
])
def test_a_drain_json_that_cannot_be_read_is_said_and_the_report_goes_on(tmp_path, drain, why):
    """A corrupt drain.json was read as no drain.json at all: whatever the daemon's final counters
    would have said was lost (records unread, a W&B run not made) went unsaid. Now one line, the
    report's and the run summary's, says it could not be read and why; the rest is reported."""
    tel = tmp_path / "run" / "telemetry"
    tel.mkdir(parents=True)
    (tel / "metrics.jsonl").write_text("".join(json.dumps(
        {"kind": "metrics", "t": 1000.0 + s, "step": s, "values": {"train/loss": 1.0 / s}}) + "\n" for s in range(1, 6)))
    if drain is None:
        (tel / "drain.json").mkdir()
    else:
        (tel / "drain.json").write_bytes(drain.encode("utf-8", "surrogateescape"))
    proc = subprocess.run([sys.executable, "-m", "telemetry", "report", str(tmp_path / "run"), "--out",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    said = [line for line in proc.stdout.splitlines() if "drain.json" in line]
    assert said == [f"  at the drain       drain.json could not be read: {why}; the daemon's final counters "
                    "are not in this report"], proc.stdout
    assert "loss               1.0000 -> 0.2000" in proc.stdout and "plots              loss.png" in proc.stdout
    assert "drain.json could not be read" in (tmp_path / "out" / "index.html").read_text()
    summary = subprocess.run([sys.executable, "-m", "telemetry.consumers.summary", str(tel), "--drain-json",
                              str(tel / "drain.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert summary.returncode == 0 and not summary.stderr, summary.stderr
    assert [line for line in summary.stdout.splitlines() if "drain.json" in line] == [
        f"  at the drain       drain.json could not be read: {why}; the daemon's final counters are not in this "
        "summary"], summary.stdout


def test_progress_is_shown_on_a_terminal_and_nowhere_else(tmp_path):
    """A long run's report read for seconds with no sign of life. On a terminal (stderr a pty) a
    line is drawn in place: how much of metrics.jsonl is read, then the drawing, erased before
    the summary; with stderr a pipe or a file, nothing at all, and stdout is the same either way."""
    import os
    import pty

    tel = tmp_path / "run" / "telemetry"
    tel.mkdir(parents=True)
    (tel / "metrics.jsonl").write_text("".join(json.dumps(
        {"kind": "metrics", "t": 1000.0 + s, "step": s, "values": {"train/loss": 1.0 / s}}) + "\n" for s in range(1, 200)))
    argv = [sys.executable, "-m", "telemetry", "report", str(tmp_path / "run"), "--out", str(tmp_path / "out")]
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        on_tty = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:     # EIO: every writer of the pty is gone
                break
            if not chunk:
                break
            on_tty += chunk
        out = proc.stdout.read()
        assert proc.wait(120) == 0, on_tty
    finally:
        os.close(master)
    frames = on_tty.decode().split("\r\x1b[K")
    assert frames[0] == "" and frames[-1] == "", frames          # each drawn in place, the last erased
    assert re.fullmatch(r"telemetry report: reading metrics\.jsonl 100 % \(0\.0 of 0\.0 MB\)", frames[1]), frames
    assert frames[-2] == "telemetry report: drawing the plots", frames
    piped = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert piped.stdout == out
