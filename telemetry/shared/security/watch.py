"""Count connection-level events on the daemon's listening sockets (ZeroMQ socket monitor).

Some hostile input never becomes a frame the receiver could count:
  - raw TCP garbage, an HTTP request, a port scanner: the ZMTP handshake fails
    (`handshake_failed`; `auth_failed` for a CURVE client whose key is not allowed);
  - a frame larger than MAXMSGSIZE: libzmq drops the connection (`disconnected`), and with it
    the frame; a well-behaved client reconnects by itself.
A disconnect is also what a rank's normal exit looks like, so `disconnected` counts both; the
counters say "how often", not "who". One thread per daemon reads the monitor sockets; events are
per connection, never per record, so this costs nothing on the ingest path.
"""
from __future__ import annotations

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
    """Counts per watched socket: accepted, disconnected, handshake_ok/failed, auth_failed."""

    def __init__(self) -> None:
        self._monitors: dict[zmq.Socket, str] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, name: str, sock: zmq.Socket) -> None:
        """Start counting `sock`'s connection events; call before start()."""
        self._monitors[sock.get_monitor_socket(events=_MASK)] = name
        self.counts[name] = {v: 0 for v in _EVENTS.values()}

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
                        event = parse_monitor_message(frames)["event"]
                    except (zmq.ZMQError, ValueError):
                        continue
                    what = _EVENTS.get(event)
                    if what is not None:
                        self.counts[self._monitors[m]][what] += 1
        except zmq.ContextTerminated:
            pass
        finally:
            for m in self._monitors:
                m.close(linger=0)

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: dict(c) for name, c in self.counts.items()}

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (it closes the monitor sockets); safe twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
