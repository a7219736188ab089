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

On a head, who a closed TCP connection was is worth knowing at once: a node daemon killed, or its
host gone, closes its link (the kernel's FIN, or the head's ZMTP heartbeat timing out) long
before the head's steps time out without it. With `on_tcp_gone` set, the peer address of each TCP
connection accepted on a socket with a limit is kept (getpeername, "ip:port"), and passed to it
(on this thread) when the connection ends; the node says which link is its own in its hello
(telemetry/daemon/node_links.py).

Connections that never become clients (a raw TCP socket that connects and sends nothing) must
not hold the limit against real ranks: at the limit, the oldest TCP connection that has not yet
received a whole ZMTP greeting (IDLE_BELOW_BYTES, from the kernel's TCP_INFO) is shut down to
make room for the new one, counted in `idle_closed` and logged once; only when every live
connection is a client is the new one refused. libzmq's own ZMQ_HANDSHAKE_IVL (set by the
daemon) drops such a peer after a few seconds anyway (counted in `handshake_failed`).
"""
from __future__ import annotations

import logging
import math
import os
import socket
import stat
import struct
import threading
import time
from typing import Callable

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
# A ZMTP 3 greeting is 64 bytes: a connection that has received fewer has not begun to be a
# client (tcp_info's tcpi_bytes_received, a u64 at offset 128 since Linux 4.1).
IDLE_BELOW_BYTES = 64
_TCPI_BYTES_RECEIVED = 128

log = logging.getLogger("telemetry.security")

# A refused connection is logged at once, then at most this often (with the count so far).
REFUSED_LOG_EVERY_S = 60.0


class ConnectionWatch:
    """Counts per watched socket: accepted, disconnected, handshake_ok/failed, auth_failed, and
    with a limit, open and refused."""

    def __init__(self) -> None:
        self._monitors: dict[zmq.Socket, str] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self._limits: dict[str, tuple[int, set]] = {}     # name -> (limit, local addresses)
        self._open: dict[str, dict[int, None]] = {}       # name -> live connections' fds, oldest first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refused_logged: dict[str, float] = {}       # name -> when a refusal was last logged
        # Called with a TCP peer's "ip:port" when its connection ends (set before start()).
        self.on_tcp_gone: Callable[[str], None] | None = None
        self._peers: dict[int, str] = {}                  # fd -> a live TCP connection's peer

    def watch(self, name: str, sock: zmq.Socket, limit: int = 0, endpoints: tuple[str, ...] = ()) -> None:
        """Start counting `sock`'s connection events; call before start(). With `limit` > 0,
        connections accepted beyond it on `endpoints` (what `sock` is bound to) are refused."""
        self._monitors[sock.get_monitor_socket(events=_MASK | zmq.EVENT_CLOSED)] = name
        self.counts[name] = {v: 0 for v in _EVENTS.values()}
        if limit > 0:
            self._limits[name] = (limit, {_local_address(ep) for ep in endpoints} - {None})
            self._open[name] = {}
            self.counts[name].update(open=0, refused=0, idle_closed=0)

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
            if len(live) >= limit and not self._close_an_idle_one(name, live, local):
                if _refuse(fd, local):
                    self.counts[name]["refused"] += 1
                    self._say_refused(name, limit)
                else:
                    self._accept(fd, live, local)
            else:
                self._accept(fd, live, local)
        elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
            live.pop(fd, None)
            peer = self._peers.pop(fd, None)
            if peer is not None:
                try:
                    self.on_tcp_gone(peer)
                except Exception:           # the watch goes on whatever the callback does
                    log.exception("on_tcp_gone(%s) failed", peer)
        self.counts[name]["open"] = len(live)

    def _accept(self, fd: int, live: dict[int, None], local: set) -> None:
        live[fd] = None
        if self.on_tcp_gone is not None:
            peer = _tcp_peer(fd, local)
            if peer is not None:
                self._peers[fd] = peer

    def _say_refused(self, name: str, limit: int) -> None:
        """A refused connection is a client that cannot send: said in the log at once, then at most
        every REFUSED_LOG_EVERY_S with the count (a head with more nodes than its connection limit
        otherwise refuses them over and over with only a counter to say so)."""
        n = self.counts[name]["refused"]
        now = time.monotonic()
        if n > 1 and now - self._refused_logged.get(name, -math.inf) < REFUSED_LOG_EVERY_S:
            return
        self._refused_logged[name] = now
        log.warning("%s: refused a connection at its limit of %d connections (%d refused so far): each refused "
                    "client cannot send. More ranks or nodes than that need max_connections raised in the daemon "
                    "config (a head: the nodes it serves, plus its own ranks), and the descriptor limit with it "
                    "(ulimit -n)", name, limit, n)

    def _close_an_idle_one(self, name: str, live: dict[int, None], local: set) -> bool:
        """Shut down the oldest live connection that never sent a whole greeting; True if one was."""
        for fd in live:
            if _refuse(fd, local, idle_only=True):
                del live[fd]
                n = self.counts[name]["idle_closed"] = self.counts[name]["idle_closed"] + 1
                if n == 1:
                    log.warning("%s: at its limit of connections, closed one that never sent a ZMTP greeting "
                                "to make room (a raw TCP connection, not a client: counted in idle_closed, "
                                "logged once)", name)
                return True
        return False

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


def _tcp_peer(fd: int, local: set) -> str | None:
    """The peer of the TCP connection behind `fd` as "ip:port" ("[ip]:port" for IPv6), if it
    still is one accepted on our endpoints; None otherwise (ipc, or the descriptor gone)."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if s.family not in (socket.AF_INET, socket.AF_INET6) or s.getsockname()[1] not in local:
            return None
        return link_name(s.getpeername())
    except OSError:
        return None
    finally:
        s.close()


def link_name(address: tuple) -> str:
    """A TCP endpoint's address (getsockname / getpeername) as both ends of a link write it."""
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _refuse(fd: int, local: set, idle_only: bool = False) -> bool:
    """Shut down the connection behind `fd`, if it still is one accepted on our endpoints (the
    event is read after the fact: the number could name another descriptor by now); with
    `idle_only`, only a TCP connection that has received fewer than IDLE_BELOW_BYTES."""
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
        if idle_only:
            if s.family not in (socket.AF_INET, socket.AF_INET6):
                return False                  # ipc: private to the owner; no kernel count to go by
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            if len(info) < _TCPI_BYTES_RECEIVED + 8 or \
                    struct.unpack_from("=Q", info, _TCPI_BYTES_RECEIVED)[0] >= IDLE_BELOW_BYTES:
                return False
        s.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        s.close()
