"""A subscriber on the daemon's PUB socket: what every live consumer (tail, Prometheus) shares.

The daemon publishes two frames per record: the topic (the record's kind, ASCII) and the JSON
line. A subscriber only ever reads: it connects (the daemon binds), so it can attach before the
daemon starts, survive a daemon restart, and detach at any time without the run noticing. PUB
drops records for a subscriber that falls behind its RCVHWM/SNDHWM rather than slow the daemon,
so a consumer that cannot keep up loses records, never the training.
"""
from __future__ import annotations

import json
from typing import Iterable, Iterator

import zmq

# Records buffered on our side; beyond it PUB drops for this subscriber (never slows the daemon).
SUB_RCVHWM = 100_000
# A frame bigger than this is not one of the daemon's records.
MAX_RECORD_BYTES = 4 << 20
POLL_MS = 200


class Subscriber:
    """SUB socket connected to `endpoint`, subscribed to `topics` (kinds; empty = all).

    `records(timeout_ms)` yields (kind, record) for what arrived, after waiting at most
    timeout_ms for the first one. Frames that are not a (topic, JSON object) pair are counted
    in num_bad and skipped. Close twice is harmless.
    """

    def __init__(self, endpoint: str, topics: Iterable[str] = ()) -> None:
        self.endpoint = endpoint
        self.num_records = 0
        self.num_bad = 0
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, SUB_RCVHWM)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_RECORD_BYTES)
        topics = list(topics)
        for t in topics or [""]:
            self._sock.setsockopt(zmq.SUBSCRIBE, t.encode("ascii"))
        self._sock.connect(endpoint)
        self._closed = False

    def records(self, timeout_ms: int = POLL_MS, max_records: int = 10_000) -> Iterator[tuple[str, dict]]:
        sock = self._sock
        if not sock.poll(timeout_ms):
            return
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
                rec = json.loads(parts[1])
            except (UnicodeDecodeError, ValueError):
                self.num_bad += 1
                continue
            if not isinstance(rec, dict):
                self.num_bad += 1
                continue
            self.num_records += 1
            yield kind, rec

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sock.close(linger=0)
        self._ctx.term()
