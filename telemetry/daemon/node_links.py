"""A head's node links: which node each TCP connection on its remote ingest is, and which closed
without the node's goodbye.

A node daemon SIGKILLed, or its host gone, stops sending; the head's steps then wait for it up to
`aggregator.step_timeout_s` and the liveness rule names it only after `rank_missing_steps` more. Its link says so at once: the kernel closes a
killed process's connections (a FIN the head reads within milliseconds), and the head's ZMTP
heartbeats (REMOTE_HEARTBEAT_*) close the link of a host that went silent (powered off,
partitioned, a node daemon stopped). The head's connection watch (security/watch.py) passes each
closed TCP connection's peer ("ip:port"); each node says in its hello which link is its own
(`link`, its end of the connection: forward.py). A node's link that closes is named once no bye
of its forwarder has come LINK_GRACE_S later (a node that drains sends its bye on a link of its
own, then closes its records' link: the bye may still sit in the head's queue when the close is
seen) and the node has not linked again
meanwhile: an event `link_closed` with the node, which the liveness rule words as a finding.

What it cannot see: a link through a proxy or NAT that rewrites the node's address (no hello
names the peer the head sees): that node is named by its missing steps, as before.
"""
from __future__ import annotations

import time
from collections import deque

import zmq

from protocol.output import EventRecord

# How long after a link closed its node's bye may still arrive (sent before that link closed).
LINK_GRACE_S = 1.0
# ... and at most this long while that node's records still come in (a head with a backlog).
LINK_GRACE_MAX_S = 5.0
# The head's ZMTP heartbeats on its remote ingest: a link whose peer answers no ping for
# REMOTE_HEARTBEAT_TIMEOUT_MS is closed (a node's host gone without a FIN, or its daemon stopped),
# 5-10 s after it went silent. libzmq pings every interval whether data flows or not, and a ping
# and its pong cost the head's I/O thread CPU time per link: at 1 s, 8,192 links took the whole CPU
# share of a head on a busy node, so no data moved, and nodes that drained then lost their
# queues, uncounted. At 5 s the head's idle cost per link is a fifth. The TTL the head asks of
# its nodes (close the link on hearing nothing from the head) spans a ping and its timeout.
REMOTE_HEARTBEAT_IVL_MS = 5000
REMOTE_HEARTBEAT_TIMEOUT_MS = 5000
REMOTE_HEARTBEAT_TTL_MS = REMOTE_HEARTBEAT_IVL_MS + REMOTE_HEARTBEAT_TIMEOUT_MS
# Links remembered (a node's new link replaces its old one): a bound like the world's.
MAX_LINKS = 1 << 16
# libzmq cancels a timer by a linear scan of its I/O thread's timers, and each of the head's pings
# arms one (its timeout) that the pong cancels: a ping costs the I/O thread time in proportion to
# the links that thread serves, so the links' heartbeats together cost the square of the links.
# A head spreads its links over one I/O thread per LINKS_PER_IO_THREAD (libzmq gives each new
# connection to its least loaded I/O thread), which also shares the per-frame work of a busy head.
LINKS_PER_IO_THREAD = 512
MAX_IO_THREADS = 8


# libzmq's context option ZMQ_ZERO_COPY_RECV (a draft name pyzmq does not export; libzmq 4.3
# honours it). By default a frame is decoded in place in its link's 8 KB read buffer, and a frame
# not yet read by the daemon keeps that whole buffer alive: on a link that brings a frame or two
# per read (a node's records, a few a second) each frame libzmq holds costs a buffer, several
# times its size. Copied out, it costs its size.
_ZMQ_ZERO_COPY_RECV = 10


def io_threads(links: int) -> int:
    """The libzmq I/O threads for a daemon holding up to `links` node links (1 for none)."""
    return max(1, min(MAX_IO_THREADS, -(-links // LINKS_PER_IO_THREAD)))


def head_context(links: int) -> zmq.Context:
    """The libzmq context of a daemon holding up to `links` node links (0: a daemon of ranks only,
    which keeps libzmq's defaults: its ranks' frames come many to a read)."""
    ctx = zmq.Context(io_threads(links))
    if links:
        ctx.set(_ZMQ_ZERO_COPY_RECV, 0)
    return ctx


class NodeLinks:
    def __init__(self, io_threads: int = 1) -> None:
        self.io_threads = io_threads
        self._by_link: dict[str, tuple[int, int]] = {}   # "ip:port" -> (node, its forwarder's src)
        self._link_of: dict[int, str] = {}               # node -> its latest link
        self._closed: deque = deque()                    # (link, monotonic), from the watch thread
        self._pending: list[list] = []                   # [due, latest, link, node, src, received then, t]
        self.num_closed_named = 0
        self.num_closed_with_bye = 0

    def on_hello(self, node: int, info: dict, src: int) -> None:
        """A node's hello: its `link`, if it says one, is its own from now on."""
        link = info.get("link")
        if not isinstance(link, str) or not 0 < len(link) <= 64:
            return
        old = self._link_of.get(node)
        if old is not None and old != link:
            self._by_link.pop(old, None)
        if link not in self._by_link and len(self._by_link) >= MAX_LINKS:
            return
        self._by_link[link] = (node, src)
        self._link_of[node] = link

    def closed(self, link: str) -> None:
        """A TCP connection of the remote ingest ended (called on the connection watch's thread)."""
        self._closed.append((link, time.monotonic()))

    def busy(self) -> bool:
        return bool(self._closed or self._pending)

    def due(self, now: float, sources: dict) -> list[dict]:
        """The event records of links closed LINK_GRACE_S ago or more whose node said no bye and
        has not linked again. `sources`: the receiver's per-src accounting (its `bye`, `received`)."""
        closed = self._closed
        while closed:
            link, at = closed.popleft()
            who = self._by_link.get(link)
            if who is None:
                continue                                  # not a node's (a rank's, a raw connection)
            node, src = who
            s = sources.get(src)
            self._pending.append([at + LINK_GRACE_S, at + LINK_GRACE_MAX_S, link, node, src,
                                  s.received if s is not None else 0, time.time()])
        out, keep = [], []
        for entry in self._pending:
            due, latest, link, node, src, seen, t = entry
            s = sources.get(src)
            if s is not None and s.bye:
                self.num_closed_with_bye += 1             # drained: its bye came, a clean end
                continue
            if self._link_of.get(node) != link:
                continue                                  # it linked again since (a new hello)
            if s is not None and s.received != seen and now < latest:
                entry[0], entry[5] = now + LINK_GRACE_S, s.received    # its records still come in
            if now < entry[0]:
                keep.append(entry)
                continue
            self.num_closed_named += 1
            out.append(EventRecord(t, node, "link_closed", {"link": link}))
        self._pending = keep
        return out

    def stats(self) -> dict:
        return {"known": len(self._by_link), "io_threads": self.io_threads, "closed_named": self.num_closed_named,
                "closed_with_bye": self.num_closed_with_bye}
