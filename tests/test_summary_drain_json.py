"""The run summary's --drain-json is a run file: a FIFO or a device planted at its name is no
counters (the summary is printed from metrics.jsonl alone), never a reader that waits forever or
reads without end."""
from __future__ import annotations

import json
import os
import subprocess
import sys


def _run_dir(tmp_path):
    run = tmp_path / "telemetry"
    run.mkdir()
    rows = [{"kind": "metrics", "t": 1.7e9 + s, "step": s, "values": {"train/loss": 1.0 / (s + 1)}} for s in range(5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_drain_json_that_is_no_regular_file_is_no_counters(tmp_path):
    # A FIFO nobody writes: opening it to read waited forever. (/dev/zero takes the same path,
    # refused as no regular file; not run here: the old reader took gigabytes before any timeout.)
    run = _run_dir(tmp_path)
    drain = run / "drain.json"
    os.mkfifo(drain)
    p = subprocess.run([sys.executable, "-m", "telemetry.consumers.summary", str(run), "--drain-json", str(drain)],
                       capture_output=True, text=True, timeout=120)     # a hang detector only
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


def test_drain_json_counters_are_read(tmp_path):
    run = _run_dir(tmp_path)
    (run / "drain.json").write_text(json.dumps({"records_in": 4321, "records_lost": 0}))
    p = subprocess.run([sys.executable, "-m", "telemetry.consumers.summary", str(run), "--drain-json",
                        str(run / "drain.json")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "4321" in p.stdout.replace(",", ""), (p.stdout[-2000:], p.stderr[-2000:])


def test_sink_drops_after_the_last_counter_record_are_in_the_summary(tmp_path):
    """What a sink dropped after the daemon's last `daemon` record (the W&B run refusing a late
    row at its finish) is in drain.json alone: the summary says it (it said "sink drops 0")."""
    run = _run_dir(tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "daemon", "t": 1.7e9 + 9, "values": {
            "telemetry/records_in": 5, "telemetry/records_lost": 0, "telemetry/sink_dropped": 0,
            "telemetry/uptime_s": 9.0}}) + "\n")
    (run / "drain.json").write_text(json.dumps({"records_in": 5, "records_lost": 0, "sink_dropped": 2}))
    p = subprocess.run([sys.executable, "-m", "telemetry.consumers.summary", str(run), "--drain-json",
                        str(run / "drain.json")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "(sink drops 2)" in p.stdout, (p.stdout[-2000:], p.stderr[-2000:])


def test_records_in_after_a_daemon_restart_is_the_whole_runs(tmp_path):
    """A daemon killed and followed by a successor: drain.json's `run` has the run's records in
    across both; the summary said only the last daemon's (the killed one left no counter record)."""
    run = _run_dir(tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "daemon", "t": 1.7e9 + 9, "values": {
            "telemetry/records_in": 3, "telemetry/records_lost": 0, "telemetry/uptime_s": 2.0}}) + "\n")
    (run / "drain.json").write_text(json.dumps({"records_in": 3, "records_lost": 2, "run": {
        "incarnations": 2, "records_in": 7, "records_lost": 2, "steps_out": 5}}))
    p = subprocess.run([sys.executable, "-m", "telemetry.consumers.summary", str(run), "--drain-json",
                        str(run / "drain.json")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "records in         7\n" in p.stdout and "records dropped    2 " in p.stdout, p.stdout


def test_what_the_drain_found_and_what_was_refused_are_in_the_run_summary(tmp_path):
    """A full disk (metrics.jsonl could not hold records), records unread at the deadline, frames
    refused as malformed: `telemetry run`'s summary said "records dropped 0 (sink drops 1531)" and
    nothing more (an outside tester's find); `telemetry drain` said them, the summary did not."""
    run = _run_dir(tmp_path)
    final = {"records_in": 9, "records_lost": 0, "sink_dropped": 1531, "records_malformed": 20,
             "values_refused": 3, "records_unread_at_drain": 40,
             "sinks": {"jsonl": {"dropped": 1531, "write_errors": 2, "lines_lost": 0},
                       "wandb": {"opened": False, "open_error": "UsageError('bad project')", "dropped": 9}}}
    (run / "drain.json").write_text(json.dumps(final))
    p = subprocess.run([sys.executable, "-m", "telemetry.consumers.summary", str(run), "--drain-json",
                        str(run / "drain.json")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert any(line.startswith("  refused            20 records not of the protocol (refused whole); 3 values "
                               "refused alone") for line in lines), p.stdout
    drain = [line for line in lines if line.startswith("  at the drain")]
    assert len(drain) == 2 and "metrics.jsonl could not hold 1,531 records (write errors 2" in drain[0], drain
    assert "40 records queued at the deadline" in drain[1], drain
    # The W&B run not made: its own line, once.
    assert sum("W&B run" in line and "NOT MADE" in line for line in lines) == 1, p.stdout
    assert not any("the W&B run was not made" in line for line in lines), p.stdout
