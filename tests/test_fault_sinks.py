"""Sink faults: a full disk under the JSONL sink, a W&B that raises, a sink that hangs, fsync errors.
Other sinks carry on, the failure is counted and reported, no partial line is ever written."""
from __future__ import annotations

import errno
import json
import signal
import threading
import time
from pathlib import Path

import pytest

from daemon_sinks import HangSink, RaisingSink
from telemetry.client import TelemetryClient
from telemetry.daemon.config import load
from telemetry.shared.control import request
from telemetry.daemon.core import Daemon
from telemetry.daemon.sinks.base import Out, SinkRunner
from telemetry.daemon.sinks.jsonl import JsonlSink
from testkit import faults


def test_disk_full(tmp_path):
    limit = 128 * 1024
    r = faults.disk_full(tmp_path, limit_bytes=limit, n=2000, rate=2000)
    assert r["alive_when_full"] and r["exit_code"] == 1       # its source of truth failed: said at exit
    assert r["jsonl_write_errors"] >= 1 and r["jsonl_dropped"] >= 1     # counted
    assert r["status_reports_error"]                                     # and reported
    assert r["integrity"]["bad_lines"] == 0 and r["integrity"]["ends_with_newline"]   # no partial line
    assert 0 < r["integrity"]["bytes"] <= limit
    assert r["pub_steps_received"] == 2000                               # PUB carried on


def test_raising_and_hanging_sinks_do_not_stop_jsonl(tmp_path):
    rt = Path(faults.Endpoints().dir)
    cfg = load(None, {"log_dir": str(tmp_path / "tm"), "wandb.mode": "disabled", "ingest": f"ipc://{rt}/i",
                      "pub": f"ipc://{rt}/p", "control": f"ipc://{rt}/c", "aggregator.world_size": 1,
                      "drain_timeout_s": 3.0})
    hang = HangSink()

    class FaultyDaemon(Daemon):
        def _make_sinks(self):
            super()._make_sinks()
            self.runners.append(SinkRunner(RaisingSink(message="wandb: 500 Internal Server Error", sink_name="wandb"),
                                            max_queued=1000))
            self.runners.append(SinkRunner(hang, max_queued=100))

    d = FaultyDaemon(cfg)
    old_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    d.start()   # on pytest's main thread: it installs signal handlers, restored below
    t = threading.Thread(target=lambda: setattr(d, "rc", d.run()), daemon=True)
    t.start()
    try:
        tm = TelemetryClient(d.endpoints["ingest"], rank=0)
        for step in range(500):
            tm.log(step, {"train/loss": float(step)})
        tm.close()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = request(d.endpoints["control"], "status")
            # Each sink has its own thread: wait until both have had their batches.
            if st["sinks"]["jsonl"]["written"] >= 500 and st["sinks"]["wandb"]["errors"] >= 1:
                break
            time.sleep(0.1)
        sinks = st["sinks"]
        assert sinks["wandb"]["errors"] >= 1 and "500 Internal" in sinks["wandb"]["last_error"]
        assert sinks["hang"]["dropped"] > 0          # its bounded queue filled; drops are counted
        final = request(d.endpoints["control"], "drain", timeout_s=120)   # a hang detector
        t.join(120)
        assert not t.is_alive()
        assert final["unfinished_sinks"] == ["hang"]   # abandoned at the deadline, named
        # Never held up: the drain ended while the hung sink was still inside consume() (it
        # stays there until the test releases it, below).
        assert hang.entered.is_set() and not hang.release.is_set()
    finally:
        hang.release.set()
        signal.set_wakeup_fd(-1)
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
    lines = (tmp_path / "tm" / "metrics.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b""
    steps = {json.loads(x).get("step") for x in lines[:-1]}
    assert set(range(500)) <= steps


def test_fsync_error_is_counted_never_treated_as_success(tmp_path, monkeypatch):
    sink = JsonlSink(tmp_path, fsync_interval_s=0.01)
    sink.start()
    calls = []

    def failing_fsync(fd):
        calls.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("telemetry.daemon.sinks.jsonl.os.fsync", failing_fsync)
    sink.consume([Out("metrics", {"step": 1}, b'{"step": 1}')])
    time.sleep(0.02)
    sink.flush()
    assert sink.stats()["fsync_errors"] == 1 and len(calls) == 1
    time.sleep(0.02)
    sink.flush()     # nothing new since: not fsynced again as if a retry could make it durable
    assert len(calls) == 1
    monkeypatch.undo()
    sink.close()
    assert (tmp_path / "metrics.jsonl").read_bytes() == b'{"step": 1}\n'


def test_failed_write_is_undone_to_the_last_whole_line(tmp_path, monkeypatch):
    sink = JsonlSink(tmp_path)
    sink.start()
    sink.consume([Out("metrics", {"step": 1}, b'{"step": 1}')])
    real_write = __import__("os").write

    def short_then_enospc(fd, data):
        if len(data) > 5:
            real_write(fd, bytes(data[:5]))       # part of the batch made it ...
            return 5
        raise OSError(errno.ENOSPC, "No space left on device")   # ... then the disk is full

    monkeypatch.setattr("telemetry.daemon.sinks.jsonl.os.write", short_then_enospc)
    with pytest.raises(OSError):
        sink.consume([Out("metrics", {"step": 2}, b'{"step": 2}'), Out("metrics", {"step": 3}, b'{"step": 3}')])
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_bytes() == b'{"step": 1}\n'
    sink.consume([Out("metrics", {"step": 4}, b'{"step": 4}')])
    sink.close()
    assert (tmp_path / "metrics.jsonl").read_bytes() == b'{"step": 1}\n{"step": 4}\n'
    assert sink.stats()["write_errors"] == 1
