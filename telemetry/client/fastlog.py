"""What TelemetryClient.log()'s common case reads and writes, and that case itself.

A training step between two log() calls leaves every cache cold, and each Python bytecode and
attribute of the client that the call touches then costs: so the common case (a dict of plain
numbers, a good step, `parts` 1, no spans to send, not forked) is one C call
(telemetry/client/_fastlog.c, LogState.log) that encodes the record, takes its seq, and queues it
for the sender thread or sends it, with every counter it needs in one small object. The client,
its sender thread (deferred.py) and its span recorder (spans.py) keep those counters here and
read and write them as attributes, each written by one thread (the client's `sent`, `dropped`,
`submitted`, `last_ns`, `own_ns`, `own_sent_at`, `forked`, `spans`; the sender thread's `done`,
`dropped_bg`, `parked`), under the GIL.

PyLogState is the same contract in Python, used where the C part is not built (no compiler) and
where the client encodes in Python (`$TELEMETRY_PURE_PYTHON=1`, protocol/codec.py); tests/test_fastlog_twin.py holds the two to the same frames
and counters. See _fastlog.c for what log() returns.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from protocol.constants import MAX_NAME_CHARS

_monotonic_ns = time.monotonic_ns
_time_ns = time.time_ns


class PyLogState:
    """LogState in Python: the same attributes, bind(), unbind() and log()."""

    __slots__ = ("sent", "dropped", "dropped_bg", "submitted", "done", "room", "last_ns", "own_ns", "own_sent_at",
                 "forked", "spans", "parked", "_pack", "_bound", "_seqs", "_header", "_append", "_ring", "_send",
                 "_zmq_error", "_noblock", "_max_frame", "_max_values", "_roomy", "_direct_after", "_own_every",
                 "_wall_clock", "_own_key")

    def __init__(self, pack: Callable[..., "bytes | None"] | None = None) -> None:
        self.sent = self.dropped = self.dropped_bg = self.submitted = self.done = self.room = 0
        self.last_ns = self.own_ns = self.own_sent_at = 0
        self.forked = self.spans = self.parked = False
        self._pack = pack
        self._bound = False
        self._own_key = None

    def bind(self, seqs: memoryview, kind: int, version: int, src: int, rank: int, append: Callable, ring: Callable,
             send: Callable, zmq_error: type, noblock: int, max_frame: int, max_values: int, roomy: int,
             direct_after: int, own_every: int, wall_clock: Callable[[], int] | None = None,
             own_key: str | None = None) -> None:
        self._seqs, self._header = seqs, (kind, version, src, rank)
        self._append, self._ring, self._send, self._zmq_error, self._noblock = append, ring, send, zmq_error, noblock
        self._max_frame, self._max_values, self._roomy = max_frame, max_values, roomy
        self._direct_after, self._own_every = direct_after, own_every
        self._wall_clock = wall_clock or _time_ns
        if own_key is not None and (own_key.__class__ is not str or not 1 <= len(own_key) <= MAX_NAME_CHARS):
            raise ValueError("bind: own_key must be a metric name (a str) or None")
        self._own_key = own_key
        self._bound = True

    def unbind(self) -> None:
        self._bound = False
        self._seqs = self._append = self._ring = self._send = None

    def log(self, step: Any, values: Any, parts: Any) -> "bytes | bool | None":
        if not self._bound or self.forked or self.spans or parts.__class__ is not int or parts != 1 \
                or values.__class__ is not dict:
            return False
        t0 = _monotonic_ns()
        own = False
        if t0 - self.own_sent_at >= self._own_every:
            key = self._own_key
            if key is None or len(values) >= self._max_values or key in values:
                return False
            values = {**values, key: self.own_ns / 1e9}
            own = True
        seqs = self._seqs
        seq = seqs[0]
        t = self._wall_clock()
        kind, version, src, rank = self._header
        frame = self._pack(kind, version, src, rank, seq, self.dropped + self.dropped_bg, t, step, values)
        if frame is None:
            return False
        if len(frame) > self._roomy and (len(frame) > self._max_frame or len(values) > self._max_values):
            return False
        seqs[0] = seq + 1
        if own:
            self.own_sent_at = t0
        pending = self.submitted - self.done
        if pending or t - self.last_ns < self._direct_after:
            self.last_ns = t
            if pending >= self.room:
                self.own_ns += _monotonic_ns() - t0
                return frame
            self.submitted += 1
            ring = self._ring            # held: another thread's close may unbind meanwhile
            self._append(frame)
            if self.parked:
                ring()
        else:
            self.last_ns = t
            send, noblock, zmq_error = self._send, self._noblock, self._zmq_error
            try:
                send(frame, noblock)
                self.sent += 1
            except zmq_error:
                self.dropped += 1
        self.own_ns += _monotonic_ns() - t0
        return None


def _native() -> type | None:
    try:
        from telemetry.client._fastlog import LogState
    except ImportError:
        return None
    return LogState


LogState = _native()


def new_state(pack: Callable[..., "bytes | None"], native_pack: Callable[..., "bytes | None"] | None) -> Any:
    """The C LogState when it is built and the client encodes with the C encode (`pack` is
    `native_pack`: the C state encodes with the same code), else PyLogState over `pack`."""
    if LogState is not None and native_pack is not None and pack is native_pack:
        return LogState()
    return PyLogState(pack)
