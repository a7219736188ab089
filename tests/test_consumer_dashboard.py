"""telemetry dashboard's server: downsampling a 100k-step run, several runs side by side followed
from their files, loopback only unless asked, and the pieces it is built from (series, the
JSONL follower, events merged across ranks)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from testkit.dashboard_proc import ROOT, Dashboard, EventStream
from telemetry.consumers.events import EventGroups
from telemetry.consumers.readjsonl import Follower
from telemetry.consumers.series import insert_gaps, last_per_x, minmax_downsample

NUM_STEPS = 100_000
SPIKE_STEP = 54_321


def _write_long_run(tel: Path) -> None:
    tel.mkdir(parents=True)
    t0 = 1.7e9
    with open(tel / "metrics.jsonl", "w") as f:
        for step in range(1, NUM_STEPS + 1):
            loss = 100.0 if step == SPIKE_STEP else 3.0 / (1 + step / 1000)
            f.write(json.dumps({"kind": "metrics", "t": t0 + step * 0.1, "step": step,
                                "values": {"train/loss": loss, "train/lr": 1e-3, "perf/tokens_per_second": 1e5 + step,
                                           "perf/step_time_max": 0.1, "perf/step_time_min": 0.09}}) + "\n")
            if step % 10 == 0:
                f.write(json.dumps({"kind": "system", "t": t0 + step * 0.1, "host": "n0",
                                    "values": {"system/cpu_percent": 50.0}}) + "\n")


def test_a_100k_step_run_is_downsampled_for_display_never_the_data(tmp_path):
    _write_long_run(tmp_path / "long" / "telemetry")
    t0 = time.monotonic()
    dash = Dashboard(str(tmp_path / "long"))
    try:
        loaded_s = time.monotonic() - t0
        t1 = time.monotonic()
        data = dash.get_json("/api/data?width=1000")
        answer_s = time.monotonic() - t1
        (run,) = data["runs"]
        series = {s["key"]: s for s in run["series"]}
        loss = series["train/loss"]
        assert loss["n"] == NUM_STEPS                       # the store holds every step
        assert len(loss["x"]) <= 5 * 500 and len(loss["x"]) >= 500   # the page gets ~2 points per pixel
        assert max(loss["y"]) == 100.0 and loss["x"][loss["y"].index(100.0)] == SPIKE_STEP  # a one-step spike stays
        assert loss["x"][0] == 1 and loss["x"][-1] == NUM_STEPS
        assert min(loss["y"]) == pytest.approx(3.0 / (1 + NUM_STEPS / 1000))
        assert series["system/cpu_percent@n0"]["n"] == NUM_STEPS // 10
        body = dash.get("api/data?width=1000")
        print(f"\n100k steps: dashboard up in {loaded_s:.1f} s, /api/data in {answer_s * 1000:.0f} ms, "
              f"{len(body) / 1e3:.0f} kB")
        assert len(body) < 2_000_000   # what a browser draws, not 100k points per series
    finally:
        assert dash.stop() == 0


def test_a_long_history_is_read_while_serving_and_every_page_reloads_once_it_is_in(tmp_path):
    """Past --wait-history-mb (here 0) the server answers at once: the page gets what was read so
    far and `loading_history`; once the history is read, a page's stream says reload, and the
    data is whole."""
    _write_long_run(tmp_path / "long" / "telemetry")
    dash = Dashboard(str(tmp_path / "long"), "--wait-history-mb", "0")
    try:
        assert "reading its" in "".join(dash.lines) and "of history while serving" in "".join(dash.lines)
        first = dash.get_json("/api/data?width=1000")
        assert first["status"][0]["loading_history"] is True, first["status"]
        stream = dash.stream(f"/api/stream?since={first['seq']}&instance={first['instance']}")
        try:
            stream.wait_for(lambda name, data: name == "reload", timeout_s=600, what="a reload once the history is in")
        finally:
            stream.close()
        data = dash.get_json("/api/data?width=1000")
        st = data["status"][0]
        assert st["loading_history"] is False and st["num_records"] == NUM_STEPS + NUM_STEPS // 10, st
        series = {s["key"]: s for s in data["runs"][0]["series"]}
        assert series["train/loss"]["n"] == NUM_STEPS and series["system/cpu_percent@n0"]["n"] == NUM_STEPS // 10
    finally:
        assert dash.stop() == 0


def test_several_runs_side_by_side_followed_from_their_files(tmp_path):
    for name, loss in (("run-a", 2.0), ("run-b", 3.0)):
        tel = tmp_path / "runs" / name / "telemetry"
        tel.mkdir(parents=True)
        (tel / "metrics.jsonl").write_text("".join(
            json.dumps({"kind": "metrics", "t": 1.7e9 + s, "step": s, "values": {"train/loss": loss / s}}) + "\n"
            for s in range(1, 11)))
    (tmp_path / "runs" / "not-a-run").mkdir()
    dash = Dashboard(str(tmp_path / "runs"))
    try:
        data = dash.get_json("/api/data")
        assert [r["name"] for r in data["runs"]] == ["run-a", "run-b"]
        assert all(st["source"].startswith("file ") and st["connected"] is None for st in data["status"])
        # A page that kept its change number across a restart of the dashboard is told to reload.
        stale = dash.stream("api/stream?since=7&instance=an-earlier-server")
        assert stale.wait_for(lambda n, d: True, what="an event")[0] == "reload"
        stale.close()
        stream = dash.stream(f"api/stream?since={data['seq']}&instance={data['instance']}")
        try:
            with open(tmp_path / "runs" / "run-b" / "telemetry" / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"kind": "metrics", "t": 1.7e9 + 11, "step": 11, "values": {"train/loss": 0.25}})
                        + "\n")
                f.write('{"kind": "metrics", "t": 1.7e9')    # a line caught mid-write waits for its end
            name, msg = stream.wait_for(lambda n, d: n == "changes", what="the appended step")
            run_b = next(r["id"] for r in data["runs"] if r["name"] == "run-b")
            # The step's point, and its wall time (for the page's x axis in wall time).
            assert msg["points"] == {run_b: [["", "steptime", 11.0, 1.7e9 + 11], ["train/loss", "step", 11.0, 0.25]]}
            assert next(r for r in data["runs"] if r["name"] == "run-b")["step_t"] == \
                [[float(s) for s in range(1, 11)], [1.7e9 + s for s in range(1, 11)]]
        finally:
            stream.close()
    finally:
        assert dash.stop() == 0


def test_beyond_loopback_only_on_request(tmp_path):
    (tmp_path / "telemetry").mkdir()
    (tmp_path / "telemetry" / "metrics.jsonl").write_text("")
    proc = subprocess.run([sys.executable, "-m", "telemetry", "dashboard", str(tmp_path), "--addr", "0.0.0.0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "beyond loopback" in proc.stderr and "--allow-remote" in proc.stderr
    assert "Traceback" not in proc.stderr
    (tmp_path / "nothing-here").mkdir()
    proc = subprocess.run([sys.executable, "-m", "telemetry", "dashboard", str(tmp_path / "nothing-here")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in __import__("os").environ.items() if not k.startswith("TELEMETRY_")})
    assert proc.returncode == 2 and "no metrics.jsonl" in proc.stderr

    dash = Dashboard(str(tmp_path))
    try:
        # A page elsewhere reaching 127.0.0.1 by DNS rebinding sends its own Host: refused.
        req = dash.request("api/data", headers={"Host": "evil.example:80"})
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=30)
        assert exc.value.code == 403
        page = urllib.request.urlopen(dash.url, timeout=30).read().decode()
        assert "/static/uPlot.iife.min.js" in page
        js = urllib.request.urlopen(dash.url + "static/uPlot.iife.min.js", timeout=30).read()
        assert b"uPlot" in js and len(js) > 40_000     # shipped in the package, no CDN
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(dash.url + "static/..%2f__init__.py", timeout=30)
    finally:
        assert dash.stop() == 0



@pytest.mark.parametrize("live", ["TELEMETRY_RUNTIME_DIR", "--pub"])
def test_a_regular_file_is_refused_as_report_refuses_it(tmp_path, live):
    """`telemetry dashboard f.txt` with a live source at hand ($TELEMETRY_RUNTIME_DIR set, or
    --pub) served "1 run: f.txt", taken for a run about to write its first records; report,
    goodput and replay refuse it. A file is never a run dir: refused the same way, exit 2."""
    import os

    f = tmp_path / "f.txt"
    f.write_text("not a run\n")
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRY_")}
    args = ["--port", "0"]
    if live == "--pub":
        args += ["--pub", f"ipc://{runtime}/pub.sock"]
    else:
        env["TELEMETRY_RUNTIME_DIR"] = str(runtime)
    try:
        proc = subprocess.run([sys.executable, "-m", "telemetry", "dashboard", str(f), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"served {f} as a run: {exc.stdout!r:.500}")
    report = subprocess.run([sys.executable, "-m", "telemetry", "report", str(f)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env=env)
    assert report.returncode == 2
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.replace("dashboard", "report") == report.stderr, (proc.stderr, report.stderr)

# -- the pieces ----------------------------------------------------------------------------------
def test_minmax_downsample_keeps_first_last_extremes_and_gaps():
    xs = np.arange(10_000, dtype=float)
    ys = np.sin(xs / 100)
    ys[777] = 50.0
    ys[5000] = np.nan
    dx, dy = minmax_downsample(xs, ys, 100)
    assert len(dx) <= 500 and dx[0] == 0 and dx[-1] == 9999
    assert 777 in dx and dy[list(dx).index(777)] == 50.0
    assert np.isnan(dy[list(dx).index(5000)])
    assert np.all(np.diff(dx) > 0)
    small = np.arange(50, dtype=float)
    assert minmax_downsample(small, small, 100)[0] is small


def test_gaps_and_repeated_steps():
    xs = np.array([0.0, 1, 2, 3, 60, 61, 62])     # a daemon down for a minute
    gx, gy = insert_gaps(xs, np.ones(7))
    assert len(gx) == 8 and np.isnan(gy[4]) and 3 < gx[4] < 60
    x, y = last_per_x(np.array([1.0, 2, 3, 2, 3, 4]), np.array([10.0, 20, 30, 21, 31, 41]))  # resumed at step 2
    assert x.tolist() == [1, 2, 3, 4] and y.tolist() == [10, 21, 31, 41]


def test_follower_reads_rotated_pieces_partial_lines_and_rotation(tmp_path):
    def line(step: int) -> str:
        return json.dumps({"kind": "metrics", "step": step, "values": {}}) + "\n"

    (tmp_path / "metrics.jsonl.1").write_text(line(1))
    cur = tmp_path / "metrics.jsonl"
    cur.write_text(line(2) + line(3)[:10])
    f = Follower(tmp_path)
    assert [r["step"] for r in f.poll()] == [1, 2]
    with open(cur, "a") as fh:
        fh.write(line(3)[10:] + line(4))
    assert [r["step"] for r in f.poll()] == [3, 4]
    # The daemon rotates: the old file gets its last lines, then a new metrics.jsonl starts.
    with open(cur, "a") as fh:
        fh.write(line(5))
    cur.rename(tmp_path / "metrics.jsonl.2")
    cur.write_text(line(6) + "not json\n")
    assert [r["step"] for r in f.poll()] == [5, 6]
    assert f.stats.num_bad == 1
    assert f.poll() == []
    f.close()


def test_events_from_every_rank_are_one_with_their_ranks():
    groups = EventGroups()
    for rank in (2, 0, 1, 3):
        g, new = groups.add({"kind": "event", "t": 100.0 + rank, "rank": rank, "name": "checkpoint_saved",
                             "data": {"path": "/c/step_100", "step": 100}})
        assert new == (rank == 2)
    assert len(groups.groups) == 1 and g.ranks_text() == "ranks 0-3" and g.num_records == 4
    groups.add({"kind": "event", "t": 105.0, "rank": 0, "name": "checkpoint_saved",
                "data": {"path": "/c/step_200", "step": 200}})
    groups.add({"kind": "event", "t": 500.0, "rank": 0, "name": "checkpoint_saved",
                "data": {"path": "/c/step_100", "step": 100}})                 # much later: a new occurrence
    groups.add({"kind": "event", "t": 501.0, "rank": 0, "name": "checkpoint_saved",
                "data": {"path": "/c/step_100", "step": 100}})                 # the same rank twice: two
    assert len(groups.groups) == 4


@pytest.mark.slow
def test_run_sh_attach_dashboard_serves_the_run_live(tmp_path):
    """run.sh --attach dashboard beside the real trainer: the page is served, live from the PUB
    socket of the run's daemon, and stopped with the run when no one is at a terminal."""
    import os

    run_dir = tmp_path / "attached"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRY_")}
    env.update({"TELEMETRY_WANDB": "disabled", "TELEMETRY_DASHBOARD_PORT": "0"})
    proc = subprocess.run([str(ROOT / "launch/run.sh"), "--steps", "5", "--run-dir", str(run_dir),
                           "--attach", "dashboard"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "telemetry run: dashboard: http://127.0.0.1:" in proc.stdout
    log = (run_dir / "telemetry" / "dashboard.log").read_text()
    assert "live from pub ipc://" in log and "Traceback" not in log, log
    bad = subprocess.run([str(ROOT / "launch/run.sh"), "--attach", "browser"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "'tail' or 'dashboard'" in bad.stderr


@pytest.mark.parametrize("command", ["tail", "export-prometheus", "dashboard"])
def test_every_live_consumer_attaches_through_one_start_up(command):
    """tail, export-prometheus and dashboard resolve --pub the same way (subscribe.attach): a bad
    endpoint is a clear message naming the command, exit code 2, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "telemetry", command, "--pub", "not-an-endpoint"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    # One line naming the command and the endpoint (tail checks it at the flag, argparse's way).
    assert proc.stderr.startswith(f"telemetry {command}: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "endpoint 'not-an-endpoint'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_run_dir_without_records_yet_goes_live_from_the_daemon(daemon, tmp_path):
    from telemetry.client import TelemetryClient

    (tmp_path / "fresh" / "telemetry").mkdir(parents=True)
    dash = Dashboard(str(tmp_path / "fresh"), "--pub", daemon.pub)
    client = TelemetryClient(daemon.ingest, rank=0)
    try:
        data = dash.get_json("/api/data")
        assert data["runs"][0]["series"] == [] and data["runs"][0]["name"] == "fresh"
        stream = dash.stream(f"api/stream?since={data['seq']}&instance={data['instance']}")
        try:
            deadline = time.monotonic() + 20
            step = 0
            while time.monotonic() < deadline:   # the SUB socket joins a moment after the start
                step += 1
                client.log(step, {"train/loss": 0.5})
                time.sleep(0.2)
                if any(n == "changes" and any(p[0] == "train/loss" for pts in d["points"].values() for p in pts)
                       for n, d in stream.events):
                    break
            else:
                raise AssertionError(f"no live point: {stream.events[-3:]}")
            st = [d for n, d in stream.events if n == "status"][-1]["status"][0]
            assert st["connected"] is True and st["source"] == f"pub {daemon.pub}"
        finally:
            stream.close()
    finally:
        client.close()
        assert dash.stop() == 0
    proc = subprocess.run([sys.executable, "-m", "telemetry", "dashboard", str(tmp_path / "typo"), "--pub", daemon.pub],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_the_run_s_end_and_its_daemons_in_the_store():
    """Ended: every rank closed, train_end, or run.sh's drain.json newer than the last record; a
    rank saying hello again (a resume) reopens the run. Counters add up over daemon restarts."""
    from telemetry.consumers.dashboard.store import RunStore

    s = RunStore("r0", "run", None)
    for r in (0, 1):
        s.consume({"kind": "hello", "t": 10.0, "rank": r, "info": {"run_name": "named"}})
    s.consume({"kind": "metrics", "t": 11.0, "step": 1, "values": {"train/loss": 1.0, "perf/mfu": None}})
    s.consume({"kind": "daemon", "t": 12.0, "values": {"telemetry/records_in": 40, "telemetry/uptime_s": 5.0}})
    assert s.name == "named" and not s.status()["ended"]
    assert s.status(drain_file_mtime=5.0)["ended"] is False          # an older run's drain.json
    assert s.status(drain_file_mtime=13.0)["ended_how"] == "daemon drained"
    s.consume({"kind": "bye", "t": 13.0, "rank": 0})
    assert not s.status()["ended"]
    s.consume({"kind": "bye", "t": 13.0, "rank": 1})
    assert s.status()["ended_how"] == "all 2 ranks closed"
    s.consume({"kind": "hello", "t": 100.0, "rank": 0, "info": {}})     # resumed
    assert not s.status()["ended"]
    s.consume({"kind": "daemon", "t": 101.0, "values": {"telemetry/records_in": 7, "telemetry/uptime_s": 1.0}})
    assert s.status()["daemon"]["telemetry/records_in"] == 47 and s.status()["num_daemons"] == 2
    s.consume({"kind": "event", "t": 102.0, "rank": 0, "name": "train_end", "data": {"step": 1}})
    assert s.status()["ended_how"] == "train_end at step 1"
    snap = s.snapshot(800)
    mfu = next(x for x in snap["series"] if x["key"] == "perf/mfu")
    assert mfu["y"] == [None]     # a non-finite value (null) is a gap, not a zero


def test_the_store_keeps_the_runs_name_and_summary_from_the_wandb_dropin():
    """The drop-in's hello names the run (wandb.init(name=...)) under `wandb`; its summary comes
    as wandb/summary events (bookkeeping, kept out of the event list): the store keeps the name
    and the summary (a later value of a key replaces it; non-finite said as text; keys beyond
    MAX_SUMMARY_KEYS counted, not kept), and each value is a change for live pages."""
    from telemetry.consumers.dashboard import store as store_mod
    from telemetry.consumers.dashboard.store import RunStore

    s = RunStore("r0", "oi1gac7g", None)
    s.consume({"kind": "hello", "t": 1.0, "rank": 0, "info": {"framework": "wandb", "config": {"lr": 0.1},
                                                              "wandb": {"name": "bleu-baseline", "id": "oi1gac7g"}}})
    assert s.name == "bleu-baseline"
    points, events = s.consume({"kind": "event", "t": 2.0, "rank": 0, "name": "wandb/summary",
                                "data": {"best_bleu": 31.4, "worst": float("nan"), "cfg": {"a": [1, 2]}}})
    assert events == [] and s.events.groups == []
    assert points == [["best_bleu", "summary", 0.0, 31.4], ["worst", "summary", 0.0, "nan"],
                      ["cfg", "summary", 0.0, '{"a": [1, 2]}']]
    s.consume({"kind": "event", "t": 3.0, "rank": 0, "name": "wandb/summary", "data": {"best_bleu": 32.0}})
    snap = s.snapshot(600)
    assert snap["name"] == "bleu-baseline"
    assert snap["summary"] == {"best_bleu": 32.0, "worst": "nan", "cfg": '{"a": [1, 2]}'}
    assert snap["num_summary_dropped"] == 0
    many = {f"k{i}": i for i in range(store_mod.MAX_SUMMARY_KEYS + 5)}
    s.consume({"kind": "event", "t": 4.0, "rank": 0, "name": "wandb/summary", "data": many})
    assert len(s.summary) == store_mod.MAX_SUMMARY_KEYS and s.num_summary_dropped == 8


@pytest.mark.parametrize("how", ["symlink-loop", "dir-replaced-by-a-file"])
def test_metrics_that_become_unreadable_are_said_once_and_the_page_keeps_its_data(tmp_path, how):
    """The feed thread that follows metrics.jsonl died with a traceback when the file could no
    longer be read after the start (its directory replaced by a file, a symlink loop at its name,
    its mode): the page froze without a word. Now one line on stderr, the page keeps what it had,
    and what is written once the file can be read again comes in."""
    tel = tmp_path / "run" / "telemetry"
    tel.mkdir(parents=True)

    def line(step: int) -> str:
        return json.dumps({"kind": "metrics", "t": 1.7e9 + step, "step": step, "values": {"train/loss": 1.0 / step}})

    (tel / "metrics.jsonl").write_text("".join(line(s) + "\n" for s in range(1, 6)))
    dash = Dashboard(str(tmp_path / "run"), "--no-token")
    moved = tmp_path / "moved"
    try:
        if how == "symlink-loop":
            (tel / "metrics.jsonl").rename(moved)
            (tel / "metrics.jsonl").symlink_to("metrics.jsonl")
        else:
            tel.rename(moved)
            tel.write_text("")
        deadline = time.monotonic() + 60
        while not any("cannot be read any more" in ln for ln in dash.lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3 * 0.5)     # a few more of the feed's polls (FILE_POLL_S): each one fails again
        said = [ln for ln in dash.lines if "cannot be read any more" in ln]
        assert len(said) == 1 and "Traceback" not in "".join(dash.lines), "".join(dash.lines)
        assert said[0].startswith("telemetry dashboard: run run: its metrics cannot be read any more ("), said
        (run,) = dash.get_json("/api/data?width=1000")["runs"]
        assert {s["key"]: s["n"] for s in run["series"]}.get("train/loss") == 5, run["series"]
        # Readable again, and written to: the feed goes on.
        if how == "symlink-loop":
            (tel / "metrics.jsonl").unlink()
            moved.rename(tel / "metrics.jsonl")
        else:
            tel.unlink()
            moved.rename(tel)
        with open(tel / "metrics.jsonl", "a") as f:
            f.write(line(6) + "\n")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            (run,) = dash.get_json("/api/data?width=1000")["runs"]
            if {s["key"]: s["n"] for s in run["series"]}.get("train/loss") == 6:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"step 6 never came: {run['series']}")
    finally:
        assert dash.stop() == 0, "".join(dash.lines)
    assert "Traceback" not in "".join(dash.lines), "".join(dash.lines)
