"""Count connection-level events on the daemon's listening sockets (ZeroMQ socket monitor).

Some hostile input never becomes a frame the receiver could count:
  - raw TCP garbage, an HTTP request, a port scanner: the ZMTP handshake fails
    (`handshake_failed`; `auth_failed` for a CURVE client whose key is not allowed);
  - a frame larger than MAXMSGSIZE: libzmq drops the connection (`disconnected`), and with it
    the frame; a well-behaved client reconnects by itself.
A disconnect is also what a rank's normal exit looks like, so `disconnected` counts both; the
counters say "how often", not "who". One thread per daemon reads the monitor sockets; events are
per connection, never per record, so this costs nothing on the ingest path.

A watched socket may have a connection limit: `open` counts its live connections, and one
accepted beyond the limit is shut down at once (shutdown(2) on the descriptor libzmq's accept
returned; libzmq then sees the peer gone and drops it) and counted in `refused`. What a refused
peer had already written is not accounted anywhere (it never became a record): the counter says
that it happened. libzmq itself has no such limit; 1,100 idle connections at nofile 1024 made it
spin and abort.
"""
from __future__ import annotations

import os
import socket
import stat
import threading

import zmq
from zmq.utils.monitor import parse_monitor_message

_EVENTS = {
    zmq.EVENT_ACCEPTED: "accepted",
    zmq.EVENT_DISCONNECTED: "disconnected",
    zmq.EVENT_HANDSHAKE_SUCCEEDED: "handshake_ok",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake_failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "handshake_failed",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth_failed",
}
_MASK = 0
for _e in _EVENTS:
    _MASK |= _e
POLL_MS = 200


class ConnectionWatch:
    """Counts per watched socket: accepted, disconnected, handshake_ok/failed, auth_failed, and
    with a limit, open and refused."""

    def __init__(self) -> None:
        self._monitors: dict[zmq.Socket, str] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self._limits: dict[str, tuple[int, set]] = {}     # name -> (limit, local addresses)
        self._open: dict[str, set[int]] = {}              # name -> descriptors of live connections
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, name: str, sock: zmq.Socket, limit: int = 0, endpoints: tuple[str, ...] = ()) -> None:
        """Start counting `sock`'s connection events; call before start(). With `limit` > 0,
        connections accepted beyond it on `endpoints` (what `sock` is bound to) are refused."""
        self._monitors[sock.get_monitor_socket(events=_MASK | zmq.EVENT_CLOSED)] = name
        self.counts[name] = {v: 0 for v in _EVENTS.values()}
        if limit > 0:
            self._limits[name] = (limit, {_local_address(ep) for ep in endpoints} - {None})
            self._open[name] = set()
            self.counts[name].update(open=0, refused=0)

    def start(self) -> None:
        if self._monitors:
            self._thread = threading.Thread(target=self._run, name="connection-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        for m in self._monitors:
            poller.register(m, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for m, _ in poller.poll(POLL_MS):
                    try:
                        frames = m.recv_multipart(zmq.NOBLOCK)
                        msg = parse_monitor_message(frames)
                    except (zmq.ZMQError, ValueError):
                        continue
                    name, event = self._monitors[m], msg["event"]
                    what = _EVENTS.get(event)
                    if what is not None:
                        self.counts[name][what] += 1
                    if name in self._open:
                        self._track(name, event, msg["value"])
        except zmq.ContextTerminated:
            pass
        finally:
            for m in self._monitors:
                m.close(linger=0)

    def _track(self, name: str, event: int, fd: int) -> None:
        live = self._open[name]
        if event == zmq.EVENT_ACCEPTED:
            limit, local = self._limits[name]
            if len(live) >= limit and _refuse(fd, local):
                self.counts[name]["refused"] += 1
            else:
                live.add(fd)
        elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
            live.discard(fd)
        self.counts[name]["open"] = len(live)

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: dict(c) for name, c in self.counts.items()}

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (it closes the monitor sockets); safe twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


def _local_address(endpoint: str) -> str | int | None:
    """What an accepted connection's getsockname() gives for a bound endpoint: an ipc path, a
    TCP port."""
    if endpoint.startswith("ipc://"):
        return endpoint[len("ipc://"):]
    if endpoint.startswith("tcp://"):
        try:
            return int(endpoint.rsplit(":", 1)[1])
        except ValueError:
            return None
    return None


def _refuse(fd: int, local: set) -> bool:
    """Shut down the connection behind `fd`, if it still is one accepted on our endpoints (the
    event is read after the fact: the number could name another descriptor by now)."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        name = s.getsockname()
        addr = name[1] if isinstance(name, tuple) else name
        if isinstance(addr, bytes):
            addr = addr.decode(errors="replace")
        if addr not in local:
            return False
        s.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        s.close()
