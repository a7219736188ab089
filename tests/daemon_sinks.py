"""Fake sinks for tests, in one place: built directly (SinkRunner tests, a Daemon in-process) or
loaded by a daemon subprocess through `custom_sinks` (PYTHONPATH=tests), hence `log_dir` first.

    SleepySink   sleeps `sleep_s` per batch: a slow W&B
    HangSink     blocks in consume until `.release` is set (never, in a daemon): a stuck W&B
    RaisingSink  raises from consume: a W&B answering 500, a full disk
    StallSink    an inline sink (on the daemon's own thread) sleeping `sleep_s` per batch: a
                 daemon loop that cannot keep up, whatever the reason
"""
from __future__ import annotations

import threading
import time

from telemetry.sinks.base import Sink


class SleepySink(Sink):
    """Sleeps `sleep_s` per batch: a slow W&B. With `gate` (a threading.Event), each batch waits
    for it first: a test fills the queue, then opens the gate, and the sink's pace is known."""
    name = "sleepy"

    def __init__(self, log_dir=None, sleep_s: float = 0.5, gate=None) -> None:
        self.sleep_s = sleep_s
        self.gate = gate
        self.num_records = 0

    def consume(self, batch) -> None:
        if self.gate is not None:
            self.gate.wait()
        time.sleep(self.sleep_s)
        self.num_records += len(batch)

    def stats(self) -> dict:
        return {"records": self.num_records}


class HangSink(Sink):
    """Blocks in consume until `.release` is set: a W&B stuck on a dead connection, a dead NFS mount.

    `.entered` is set once a consume has begun; `.steps` are the steps of the records it got
    through; `.num_closed` counts close() calls."""
    name = "hang"

    def __init__(self, log_dir=None) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.steps: list = []
        self.num_closed = 0

    def consume(self, batch) -> None:
        self.entered.set()
        self.release.wait()
        self.steps += [o.record.get("step") for o in batch]

    def close(self) -> None:
        self.num_closed += 1


class RaisingSink(Sink):
    """Raises RuntimeError(message) from every consume; `sink_name` is its name in the status."""

    def __init__(self, log_dir=None, message: str = "sink failure", sink_name: str = "raising") -> None:
        self.name = sink_name
        self.message = message

    def consume(self, batch) -> None:
        raise RuntimeError(self.message)


class StallSink(Sink):
    """Inline: runs on the daemon's thread, so each batch stalls the whole loop `sleep_s`."""
    name = "stall"
    inline = True

    def __init__(self, log_dir=None, sleep_s: float = 0.5) -> None:
        self.sleep_s = sleep_s

    def consume(self, batch) -> None:
        time.sleep(self.sleep_s)
