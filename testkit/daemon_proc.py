"""A real telemetry daemon process, started and driven: shared by the benchmarks and the tests.

    from testkit.daemon_proc import DaemonProc, daemon_command
    proc = subprocess.Popen(daemon_command(log_dir, ingest, pub, control), stdout=PIPE, stderr=STDOUT, text=True)
    d = DaemonProc(proc, log_dir, runtime_dir=None); d.wait_ready(60)   # "telemetry daemon ready"
    d.status()["records_in"]; d.read_jsonl(kind="metrics"); d.stop()    # SIGTERM, returns the exit code

The tests start theirs with tests/daemon_util.py `start_daemon` (private ipc or tcp port 0); the
fault-injection scenarios (testkit/faults.py) with fixed endpoints they restart on.
The daemon's stdout and stderr are collected in `.lines` (shown when a start fails).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import msgspec
import zmq

from protocol import output

READY = "telemetry daemon ready"


def raw_push(ctx: zmq.Context, endpoint: str, *, sndhwm: int = 1000, sndtimeo_ms: int | None = None,
             curve_keys: tuple | None = None) -> zmq.Socket:
    """A bare PUSH socket connected to a daemon's ingest, for hand-made or malformed frames (what
    TelemetryClient would send, or what it never would): linger 0, `sndhwm` frames queued (1000,
    libzmq's default), sends block at most `sndtimeo_ms` (None: no limit). curve_keys:
    (server public key file, client secret key file) for a CURVE-secured ingest."""
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, sndhwm)
    if sndtimeo_ms is not None:
        s.setsockopt(zmq.SNDTIMEO, sndtimeo_ms)
    if curve_keys:
        from telemetry.shared.security.curve import apply_client_curve

        apply_client_curve(s, str(curve_keys[0]), str(curve_keys[1]))
    s.connect(endpoint)
    return s


class DaemonProc:
    """A running daemon: endpoints (.ingest .pub .control), .log_dir, .proc, .lines."""

    def __init__(self, proc: subprocess.Popen, log_dir: Path, runtime_dir: Path | None) -> None:
        self.proc = proc
        self.log_dir = log_dir
        # file -> (bytes read, records, its first bytes)
        self._parsed: dict[tuple[int, int], tuple[int, list[dict], bytes]] = {}
        self.jsonl = log_dir / "metrics.jsonl"
        self.lines: list[str] = []
        self.ingest = self.pub = self.control = ""
        self._runtime_dir = runtime_dir
        self._ready = threading.Event()
        self._pump = threading.Thread(target=self._read_output, daemon=True)
        self._pump.start()

    def _read_output(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if READY in line and not self._ready.is_set():
                fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
                self.ingest, self.pub, self.control = fields["ingest"], fields["pub"], fields["control"]
                self._ready.set()

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._pump.join(1.0)
                self.kill()
                raise RuntimeError(f"daemon never said ready (rc={self.proc.returncode}):\n" + self.output())

    def output(self) -> str:
        return "".join(self.lines)

    # -- reading what it wrote -----------------------------------------------------------------
    def read_jsonl(self, kind: str | None = None, aggregated: bool | None = None) -> list[dict]:
        """Every whole line of metrics.jsonl (and its rotated pieces, oldest first).

        kind: only records of this kind; aggregated: True = only records without "rank",
        False = only per-rank records.
        """
        out = []
        for path in _pieces(self.log_dir):
            for rec in self._records_of(path):
                if kind is not None and rec.get("kind") != kind:
                    continue
                if aggregated is not None and (("rank" not in rec) != aggregated):
                    continue
                out.append(rec)
        return out

    def _records_of(self, path: Path) -> list[dict]:
        """The whole lines of one file, each parsed and checked once: the lines read before are
        kept by the file's identity (a rotated piece is the file it was), and only what was
        appended since is read (wait_for polls every 50 ms; files grow to many MB). A file made
        anew under a deleted one's inode number (it is reused at once) begins otherwise: its first
        bytes tell it from the file read before."""
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                key = (st.st_dev, st.st_ino)
                offset, recs, head = self._parsed.get(key, (0, [], b""))
                if st.st_size < offset or f.read(len(head)) != head:   # truncated, or another file: anew
                    offset, recs = 0, []
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return []
        # A reader may catch a batch mid-write: only lines ending in "\n" are whole.
        whole = data.rfind(b"\n") + 1
        if whole:
            head = head if offset else data[:min(whole, 256)]
            recs.extend(_parsed_line(line, path) for line in data[:whole].split(b"\n")[:-1])
            self._parsed[key] = (offset + whole, recs, head)      # (read_jsonl copies what it returns)
        return recs

    def steps(self) -> dict[int, dict]:
        """Aggregated metrics records by step (the last one wins)."""
        return {r["step"]: r for r in self.read_jsonl("metrics", aggregated=True)}

    # The defaults below are hang detectors, generous for a loaded machine (a 2-core box running
    # the suite beside other jobs), never a speed: each failure says what was seen.
    def wait_for(self, predicate: Callable[[list[dict]], bool], timeout_s: float = 120.0,
                 kind: str | None = None) -> list[dict]:
        """Poll metrics.jsonl until predicate(records) holds; return the records or raise."""
        deadline = time.monotonic() + timeout_s
        while True:
            recs = self.read_jsonl(kind)
            if predicate(recs):
                return recs
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout_s} s; {len(recs)} records; "
                                     f"daemon output:\n{self.output()[-3000:]}")
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited (rc={self.proc.returncode}):\n{self.output()[-3000:]}")
            time.sleep(0.05)

    # -- the control socket --------------------------------------------------------------------
    def request(self, cmd: str, timeout_s: float = 60.0) -> dict:
        from telemetry.shared.control import request

        return request(self.control, cmd, timeout_s=timeout_s)

    def status(self, timeout_s: float = 60.0) -> dict:
        return self.request("status", timeout_s)

    def drain(self, timeout_s: float = 120.0) -> dict:
        """Ask for a drain; return the final counters; wait for the process to exit."""
        final = self.request("drain", timeout_s)
        self.proc.wait(timeout_s)
        return final

    # -- sockets a test may want ---------------------------------------------------------------
    def push(self, ctx: zmq.Context | None = None, sndhwm: int = 100_000) -> zmq.Socket:
        """A raw PUSH socket connected to ingest (linger 0): for hand-made or malformed frames."""
        return raw_push(ctx or zmq.Context.instance(), self.ingest, sndhwm=sndhwm, sndtimeo_ms=5000)

    def subscribe(self, topic: bytes = b"", ctx: zmq.Context | None = None, rcvtimeo_ms: int = 5000) -> zmq.Socket:
        """A SUB socket on the daemon's PUB (linger 0, receive timeout). Give it ~0.2 s to join."""
        ctx = ctx or zmq.Context.instance()
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, rcvtimeo_ms)
        s.setsockopt(zmq.SUBSCRIBE, topic)
        s.connect(self.pub)
        return s

    # -- stopping ------------------------------------------------------------------------------
    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 120.0) -> int:
        """Signal the daemon (SIGTERM: drain and exit) and wait; return its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"daemon did not exit within {timeout_s} s of {sig!r}:\n"
                                     + self.output()[-3000:])
        self._pump.join(2.0)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(60)

    def cleanup(self) -> None:
        self.kill()
        if self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)


def _pieces(log_dir: Path) -> list[Path]:
    from telemetry.shared.jsonlines import rotated_files

    return rotated_files(log_dir)


def daemon_command(log_dir: Path, ingest: str, pub: str, control: str, wandb: str = "disabled",
                   world_size: int | None = None, per_rank: bool = False, config: Path | None = None,
                   extra_args: tuple[str, ...] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "telemetry", "daemon", "--log-dir", str(log_dir), "--wandb", wandb,
           "--ingest", ingest, "--pub", pub, "--control", control]
    if world_size is not None:
        cmd += ["--world-size", str(world_size)]
    if per_rank:
        cmd.append("--per-rank")
    if config is not None:
        cmd += ["--config", str(config)]
    return cmd + list(extra_args)


def _parsed_line(line: bytes, path: Path) -> dict:
    """A line as a dict, checked: every line a daemon writes is one of the records
    protocol/output.py declares, field for field (no undeclared field, every type as declared),
    and each test that reads a daemon's output checks it."""
    try:
        output.check(line)
    except msgspec.ValidationError as exc:
        raise AssertionError(f"{path}: a line that is not a declared record ({exc}): {line[:500]!r}") from None
    return json.loads(line)
