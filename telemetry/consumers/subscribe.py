"""A subscriber on the daemon's PUB socket, and the start-up every live consumer shares.

The daemon publishes two frames per record: the topic (the record's kind, ASCII) and the JSON
line. A subscriber only ever reads: it connects (the daemon binds), so it can attach before the
daemon starts, survive a daemon restart, and detach at any time without the run noticing. PUB
drops records for a subscriber that falls behind its RCVHWM/SNDHWM rather than slow the daemon,
so a consumer that cannot keep up loses records, never the training.

Every live consumer (tail, export-prometheus, dashboard) starts the same way, with `attach()`:
resolve the PUB endpoint (--pub, else $TELEMETRY_PUB, else the run's private ipc socket), make
SIGTERM and SIGINT detach like Ctrl-C, connect. A bad endpoint is an `AttachError` whose message
names the command, for an exit code 2.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import zmq

from protocol import output
from protocol.output import OutputRecord

# Records buffered on our side; beyond it PUB drops for this subscriber (never slows the daemon).
SUB_RCVHWM = 100_000
# How often a follower without a daemon looks at the run directory for a new one.
FOLLOW_CHECK_S = 0.5
# A follower says that nothing serves its endpoint once it has waited this long for a connection.
NOT_SERVED_S = 1.0
# A frame bigger than this is not one of the daemon's records.
MAX_RECORD_BYTES = 4 << 20
POLL_MS = 200


class AttachError(ValueError):
    """A consumer cannot attach: the message is ready to print (it names the command)."""


class Subscriber:
    """SUB socket connected to `endpoint`, subscribed to `topics` (kinds; empty = all).

    `records(timeout_ms)` yields (kind, record) for what arrived, after waiting at most
    timeout_ms for the first one. Frames that are not a (topic, JSON object) pair are counted
    in num_bad and skipped. Close twice is harmless.

    With `watch_connection`, a socket monitor tells whether the daemon is there: `connected` is
    True between libzmq's connect and disconnect events (a daemon restart reads False, then True
    again once it has bound: the SUB reconnects by itself), and `num_reconnects` counts returns.
    """

    def __init__(self, endpoint: str, topics: Iterable[str] = (), watch_connection: bool = False) -> None:
        self.endpoint = endpoint
        self.num_records = 0
        self.num_bad = 0
        self.connected = False
        self.num_connects = 0
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, SUB_RCVHWM)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_RECORD_BYTES)
        topics = list(topics)
        for t in topics or [""]:
            self._sock.setsockopt(zmq.SUBSCRIBE, t.encode("ascii"))
        self._monitor: zmq.Socket | None = None
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        if watch_connection:
            # Before connect(), so the first connected event is not missed.
            self._monitor = self._sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            self._poller.register(self._monitor, zmq.POLLIN)
        self._sock.connect(endpoint)
        self._closed = False

    @property
    def num_reconnects(self) -> int:
        return max(0, self.num_connects - 1)

    def _read_monitor(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                msg = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if msg["event"] == zmq.EVENT_CONNECTED:
                self.connected = True
                self.num_connects += 1
            elif msg["event"] == zmq.EVENT_DISCONNECTED:
                self.connected = False

    def records(self, timeout_ms: int = POLL_MS,
                max_records: int = 10_000) -> Iterator[tuple[str, OutputRecord | dict]]:
        ready = dict(self._poller.poll(timeout_ms))
        if self._monitor is not None and self._monitor in ready:
            self._read_monitor()
        if self._sock not in ready:
            return
        sock = self._sock
        for _ in range(max_records):
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(parts) != 2:
                self.num_bad += 1
                continue
            try:
                kind = parts[0].decode("ascii")
            except UnicodeDecodeError:
                self.num_bad += 1
                continue
            rec = output.decode(parts[1])
            if rec is None:
                self.num_bad += 1
                continue
            self.num_records += 1
            yield kind, rec

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
        self._sock.close(linger=0)
        self._ctx.term()


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def resolve_pub(prog: str, explicit: str | None) -> str:
    """The PUB endpoint: `explicit`, else $TELEMETRY_PUB, else the private ipc socket.

    Raises AttachError ("<prog>: <why>") for an endpoint that cannot be one.
    """
    from telemetry.shared import endpoints

    try:
        return endpoints.resolve("pub", explicit)
    except endpoints.EndpointError as exc:
        raise AttachError(f"{prog}: {exc}") from None


def detach_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt in the main thread: run.sh and friends stop a
    background consumer with SIGTERM, and a process started in the background by a
    non-interactive shell inherits SIGINT ignored (Python then never raises on Ctrl-C)."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)


def attach(prog: str, explicit_pub: str | None, topics: Iterable[str] = (),
           watch_connection: bool = False) -> Subscriber:
    """The live consumers' start-up: resolve the endpoint, detach on signals, connect.

    Call from the main thread. Raises AttachError for a bad endpoint (print it, exit 2).
    """
    ep = resolve_pub(prog, explicit_pub)
    detach_on_signals()
    return Subscriber(ep, topics, watch_connection=watch_connection)


class RunFollower:
    """A Subscriber that follows a run across its daemons.

    A relaunch of a run (the same run directory, resumed) has a new daemon, and under
    `telemetry run` new sockets in a new directory: a SUB connected to the old ones waits for
    ever. Each daemon writes its endpoints into its run directory (shared/run_endpoints.py); a
    follower that knows the run directory (`log_dir`: --run-dir, or the `log_dir` of the first
    daemon's status) reads them again while it has no daemon, and moves to a new PUB endpoint
    when one is written there. Without a run directory it cannot follow: once the old socket
    file is gone it says so (`news`), with what to do.

    records(), connected, endpoint and close() are the Subscriber's; `news()` returns the lines
    to tell the user (each said once): nothing serves the endpoint yet, moved to a new daemon,
    cannot follow.
    """

    def __init__(self, prog: str, endpoint: str | None, topics: Iterable[str] = (), log_dir: Path | None = None,
                 control_ep: str | None = None, where: str = "") -> None:
        self.prog = prog
        self.topics = list(topics)
        self.log_dir = log_dir
        self.where = where             # how the first endpoint was chosen (endpoints.where)
        self.status: dict = {}         # the first daemon's status, when its control socket answered
        self.sub: Subscriber | None = None
        self._news: list[str] = []
        self._said: set[str] = set()
        self._started = time.monotonic()
        self._last_check = 0.0
        self._ever_connected = False
        if endpoint is None and log_dir is not None:
            endpoint = (self._written() or {}).get("pub")
        if endpoint is not None:
            self.sub = Subscriber(endpoint, self.topics, watch_connection=True)
        if control_ep:
            threading.Thread(target=self._ask_status, args=(control_ep,), daemon=True).start()

    @property
    def endpoint(self) -> str:
        return self.sub.endpoint if self.sub is not None else f"(none yet: {self.log_dir})"

    @property
    def connected(self) -> bool:
        return self.sub is not None and self.sub.connected

    def records(self, timeout_ms: int = POLL_MS) -> Iterator[tuple[str, OutputRecord | dict]]:
        if self.sub is None:
            time.sleep(timeout_ms / 1000)
        else:
            yield from self.sub.records(timeout_ms)
        self._ever_connected = self._ever_connected or self.connected
        if not self.connected:
            self._look()

    def news(self) -> list[str]:
        out, self._news = self._news, []
        return out

    def _say(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self._news.append(line)

    def _ask_status(self, control_ep: str) -> None:
        """Once, in the background: the daemon's status (its run name, its run directory). A
        daemon that does not answer costs nothing but this thread."""
        from telemetry.shared.control import request

        try:
            st = request(control_ep, "status", timeout_s=2.0)
        except Exception:
            return
        if isinstance(st, dict):
            self.status = st
            if self.log_dir is None and isinstance(st.get("log_dir"), str) and os.path.isabs(st["log_dir"]):
                self.log_dir = Path(st["log_dir"])

    def _written(self) -> dict | None:
        from telemetry.shared import run_endpoints

        return run_endpoints.read(self.log_dir) if self.log_dir is not None else None

    def _look(self) -> None:
        """No daemon on the endpoint: a new one in the run directory, or words about it."""
        now = time.monotonic()
        if now - self._last_check < FOLLOW_CHECK_S:
            return
        self._last_check = now
        pub = (self._written() or {}).get("pub")
        if pub and (self.sub is None or pub != self.sub.endpoint):
            from telemetry.shared import endpoints

            try:
                endpoints.check_ipc(pub)
            except endpoints.EndpointError as exc:
                self._say(f"refused {pub}", f"{self.prog}: the run directory names {pub}: {exc}")
                return
            old = self.sub
            self.sub = Subscriber(pub, self.topics, watch_connection=True)
            if old is not None:
                old.close()
                self._said.discard("gone")
                self._news.append(f"{self.prog}: the run has a new daemon (relaunched): following it at {pub}")
            return
        if self._ever_connected:
            if self.log_dir is None and self._socket_gone():
                self._say("gone", f"{self.prog}: the daemon's socket {self.sub.endpoint} is gone (its run ended, or "
                                  f"was relaunched with new sockets): this view cannot follow it without the run's "
                                  f"directory; attach again with `telemetry tail --run-dir DIR`")
        elif now - self._started >= NOT_SERVED_S:
            if self.sub is None:
                self._say("unserved", f"{self.prog}: no daemon has written its endpoints in {self.log_dir} yet; "
                                      f"waiting for one (Ctrl-C detaches)")
            else:
                where = f" {self.where}" if self.where else ""
                self._say("unserved", f"{self.prog}: nothing serves {self.sub.endpoint} yet{where}; waiting for a "
                                      f"daemon there (Ctrl-C detaches)")

    def _socket_gone(self) -> bool:
        ep = self.sub.endpoint if self.sub is not None else ""
        return ep.startswith("ipc://") and not os.path.lexists(ep[len("ipc://"):])

    def close(self) -> None:
        if self.sub is not None:
            self.sub.close()
