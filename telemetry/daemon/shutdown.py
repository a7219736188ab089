"""The daemon's drain: SIGTERM, SIGINT, a drain request or --watch-pid's process gone.

Stop the inputs (the pollers; the ingest socket closes once the receiver stage has drained it),
drain the pipeline's stages in order, each with its share of `drain_timeout_s`
(pipeline.py: the receiver's read of what the clients sent, the held byes behind their
steps, the open steps, then the fan-out: a script's exit code to every runner, the analysis
stages, the last records, the sinks),
write the final counters (drain.json: `status` and how the drain went; the checkpoint for a
successor: continuity.py; the reply to `telemetry drain`), and close.

`run(d)` returns the exit code: 1 if the JSONL sink could not hold everything or drain.json
could not be written, else 0.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from telemetry.shared import endpoints, files

if TYPE_CHECKING:
    from telemetry.daemon.core import Daemon

log = logging.getLogger("telemetry.daemon")

_json = msgspec.json.Encoder()
SCRIPT_EXIT_EVENT = "script_exit"     # {"exit_code": N}: a drain request's (shared/control.py)

# Why a daemon stopped, by drain.json's stop_code (what a consumer matches), with its words
# (stop_reason, for people).
STOP_REASONS = {
    "sigterm": "SIGTERM",
    "sigint": "SIGINT",
    "drain_request": "drain request",
    "watched_process_exited": "the process it was started for exited (pid N)",
}


def run(d: Daemon) -> int:
    """Drain the daemon `d`, once; the exit code."""
    now = time.monotonic()
    timeout_s = d.cfg.drain_timeout_s
    log.info("draining (%s)", d.stop_reason)
    for p in d.pollers:
        try:
            p.close()
        except Exception as exc:   # a poller must not stop the drain
            log.error("poller %s close failed: %r", getattr(p, "name", p), exc)
    d.pipeline.drain(now + timeout_s)
    unfinished = d.fanout.unfinished
    drained_at = time.monotonic()
    final = {"ok": True, "drained": not unfinished, "unfinished_sinks": unfinished,
             "sinks_closed_short": d.fanout.closed_short,
             "stop_code": d.stop_code, "stop_reason": d.stop_reason, **d.report.status()}
    final_written = write_drain_json(d.log_dir, final)
    d.continuity.write(d.fanout.num_records_out)
    d.control_server.answer_drain(final)
    _close(d, unfinished)
    log.info("drain: %.2f s of %.2f (%s; final counters and close %.2f)", time.monotonic() - now, timeout_s,
             ", ".join(f"{name} {s:.2f}" for name, s in d.pipeline.marks), time.monotonic() - drained_at)
    log.info("stopped: %d records in, %d malformed, %d lost, %d steps out", final["records_in"],
             final["records_malformed"], final["records_lost"], final["steps_out"])
    failed = d.jsonl_runner.sink.failed()
    if failed:
        log.error("%s could not hold everything it was handed (%s): exit 1",
                  d.jsonl_runner.sink.path, _json.encode(final["sinks"].get("jsonl")).decode())
    return 0 if d.jsonl_runner.name not in unfinished and not failed and final_written else 1


def _close(d: Daemon, unfinished: list[str]) -> None:
    """The control socket, the security stage, the endpoints, the wake-up pipe, the directories'
    locks (free for a successor) and, with no sink thread left inside a socket call, the context."""
    if threading.current_thread() is threading.main_thread():
        signal.set_wakeup_fd(-1)
    d.control_server.close()
    d.security.close()
    endpoints.release_ipc(d.endpoints.values())
    d.close_wakeups()
    if d.lock_fd is not None:
        os.close(d.lock_fd)
        d.lock_fd = None
    if d.run_lock_fd is not None:      # the log directory: everything is written
        os.close(d.run_lock_fd)
        d.run_lock_fd = None
    if not unfinished:
        # With a sink thread still inside a socket call, destroying the context could hang
        # or crash; the process is about to exit anyway.
        d.ctx.destroy(linger=0)
    if d.remove_runtime_dir is not None:
        # A run's own socket directory (`telemetry run`'s): its sockets, lock files, the ranks'
        # stack files. The daemon that ends the run outlives whoever started it, so it is the
        # one sure to be there to remove it; a successor daemon makes it again.
        remove_runtime_dir(d.remove_runtime_dir)


def _ours(name: str) -> bool:
    """A name the daemon, its clients or `telemetry run` make in a runtime directory: sockets
    and what sits beside them (tokens, keys, the clients' seq pages), locks, stack files, the
    claim of the launch's run (telemetry.wandb._claim_launch: its file and the temporary one it
    is linked from)."""
    claim = endpoints.LAUNCH_CLAIM_FILE
    return (name.endswith((".sock", ".lock")) or ".sock." in name
            or (name.startswith("stacks-rank") and name.endswith(".txt"))
            or name == claim or name.startswith(f".{claim}."))


def remove_runtime_dir(path: Path) -> None:
    """Remove what the run made in its runtime directory, then the directory. Only names of ours:
    anything else (a directory given by mistake, a user's file) is left, with the directory,
    and said."""
    import shutil

    try:
        entries = list(os.scandir(path))
    except OSError:
        return                          # gone already, or not ours to read
    others = []
    for e in entries:
        if not _ours(e.name):
            others.append(e.name)
        elif e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path, ignore_errors=True)
        else:
            try:
                os.unlink(e.path)
            except OSError:
                pass
    if others:
        log.warning("runtime directory %s kept: it holds what this run did not make (%s)", path,
                    ", ".join(sorted(others)[:5]) + (" ..." if len(others) > 5 else ""))
        return
    try:
        os.rmdir(path)
    except OSError:
        pass


def write_drain_json(log_dir: Path, final: dict) -> bool:
    """drain.json, on a full disk in the room the JSONL sink's reserve held; else the final
    counters go to stderr, so they are somewhere. True if the file was written."""
    from telemetry.daemon.sinks.jsonl import release_reserve

    path = log_dir / "drain.json"
    data = _json.encode(final) + b"\n"
    err = _write_final(path, data)
    if err is not None and release_reserve(log_dir):
        err = _write_final(path, data)          # in the reserve's room: said only if that fails too
    release_reserve(log_dir)      # its job is done either way
    if err is not None:
        log.error("cannot write %s: %r", path, err)
        print("telemetry daemon: final counters (drain.json could not be written): "
              + data.decode().rstrip(), file=sys.stderr, flush=True)
    return err is None


def _write_final(path: Path, data: bytes) -> OSError | None:
    """The final counters beside metrics.jsonl, whatever stopped the daemon (SIGTERM too);
    `telemetry drain` replies with the same object. The error, if it could not be written."""
    try:
        files.write_file(path, data)
        return None
    except OSError as exc:
        return exc
