"""Custom sinks for daemon tests, loaded by the daemon subprocess through `custom_sinks`
(PYTHONPATH=tests): a slow one and a hung one."""
from __future__ import annotations

import threading
import time

from telemetry.sinks.base import Sink


class SleepySink(Sink):
    """Sleeps `sleep_s` per batch: a slow W&B."""
    name = "sleepy"

    def __init__(self, log_dir, sleep_s: float = 0.5) -> None:
        self.sleep_s = sleep_s
        self.num_records = 0

    def consume(self, batch) -> None:
        time.sleep(self.sleep_s)
        self.num_records += len(batch)

    def stats(self) -> dict:
        return {"records": self.num_records}


class HangSink(Sink):
    """Never returns from its first consume: a W&B stuck on a dead connection."""
    name = "hang"

    def __init__(self, log_dir) -> None:
        self._never = threading.Event()

    def consume(self, batch) -> None:
        self._never.wait()
