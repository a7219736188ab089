"""PUB: two frames per record, the topic (the record's kind, ASCII) and the JSON line's bytes,
so a subscriber in any language can attach, filter by kind with a prefix, and parse JSON.

The socket is bound by the daemon's thread before "ready" is printed and used only there: a PUB
send never blocks (libzmq queues per subscriber, up to PUB_SNDHWM, on its own I/O thread and
drops for a slow subscriber), so this sink runs inline on the daemon's thread (InlineRunner)
and saves a thread hop on the emit-to-subscriber path.
"""
from __future__ import annotations

import zmq

from telemetry.daemon.sinks.base import Out, Sink
from telemetry.shared import endpoints

# Per subscriber, records buffered before PUB drops for that subscriber (libzmq's rule for PUB:
# a slow subscriber loses records, never slows the publisher). Each queued frame costs ~60 bytes
# of libzmq's per subscriber (the line's bytes are shared), so the daemon holds at most about
# MAX_SUBSCRIBERS x PUB_SNDHWM x 2 frames x 60 B (~77 MB) for subscribers that stop reading,
# plus the last PUB_SNDHWM lines themselves. Subscribers that never read (another local user on
# a loopback TCP PUB, or suspended `telemetry tail`s) hold that much of the daemon for as long as
# they stay, so the bound is per subscriber and small. A consumer's own queue (its RCVHWM, 100,000 in
# telemetry's consumers) is in front of this one: a consumer that keeps up loses nothing here.
PUB_SNDHWM = 10_000
# Subscribers at once; one beyond is shut at once and counted (status: security.connections.pub
# .refused, telemetry/connections_refused). A dashboard, a tail and an exporter use one each.
MAX_SUBSCRIBERS = 64
# zmq.Socket's own send without the Python layer pyzmq puts over it (routing ids, groups, Frames:
# none of which a PUB of bytes uses).
_send = getattr(zmq.backend, "Socket", zmq.Socket).send
# The longest message a subscriber may send (libzmq's MAXMSGSIZE: a longer one shuts its
# connection). A subscription is a topic, a prefix of a record's kind (7 bytes at most); libzmq
# keeps every distinct one a subscriber sends, at ~45 bytes of the daemon's memory per byte of
# it, with no bound of its own: one 20 MB subscription from another local user on a loopback TCP
# PUB grew a daemon by 1.2 GB. The bound is not smaller because the handshake's own messages
# pass through it too (a CURVE INITIATE is ~300 bytes).
MAX_SUBSCRIBER_MESSAGE_BYTES = 1024


class PubSink(Sink):
    name = "pub"
    inline = True      # never blocks: run on the daemon's thread (sinks.base.InlineRunner)

    def __init__(self, sock: zmq.Socket) -> None:
        self._sock = sock
        self._topics: dict[str, bytes] = {}
        self.num_sent = 0

    def consume(self, batch: list[Out]) -> None:
        # Two calls of the backend's send, not send_multipart (or the sugar Socket.send): a
        # fraction of their cost per record (benchmarks/ingest.py; benchmarks/RESULTS.md).
        sock, send, topics = self._sock, _send, self._topics
        more, last = zmq.SNDMORE | zmq.NOBLOCK, zmq.NOBLOCK
        for o in batch:
            topic = topics.get(o.kind)
            if topic is None:
                topic = topics[o.kind] = o.kind.encode("ascii")
            send(sock, topic, more)
            send(sock, o.line, last)
        self.num_sent += len(batch)

    def close(self) -> None:
        self._sock.close(linger=200)

    def stats(self) -> dict:
        return {"sent": self.num_sent}


def bind_pub(ctx: zmq.Context, endpoint: str, prepare=None) -> zmq.Socket:
    """prepare(sock, endpoint, name): the daemon's security hook (CURVE beyond loopback)."""
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, PUB_SNDHWM)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_SUBSCRIBER_MESSAGE_BYTES)
    if prepare is not None:
        prepare(sock, endpoint, "pub")
    endpoints.claim_ipc(endpoint)    # a daemon already serving this ipc path is left alone
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:      # a port in use: one line and exit 2 (telemetry.daemon.cli)
        from telemetry.daemon.sinks.base import StartupError

        sock.close(linger=0)
        raise StartupError(f"cannot bind the PUB socket to {endpoint}: {exc.strerror}") from None
    return sock
