"""The daemon as a pipeline of stages, each with one small interface and one lifecycle.

    receiver (stages/receive.py)   the ingest socket's read-ahead, shedding, decoding, loss accounting
      -> rare records (stages/rare.py)   hellos, byes, node clocks, media, each client's program order
      -> steps (stages/steps.py)   aggregation across ranks, derived metrics, open-step shedding
      -> fan-out (stages/fanout.py)   the analysis stages, then the sinks (continuity beside JSONL)

A stage is started, fed batches, flushed, drained within a deadline and asked for its counters.
The pipeline starts the stages in order and drains them in order, each with its share of the
time left when its turn comes (`Stage.drain_share`): the drain is "stop the sockets, drain each
stage in order", as the OpenTelemetry Collector's is, and no stage's drain can take the time of
those after it. `status` is the stages' counters merged (`Pipeline.stats`).
"""
from __future__ import annotations

import time
from typing import Callable


class Stage:
    """One stage. `consume` takes a batch (what it is depends on the stage); `flush` passes on
    what the stage holds; `drain(deadline)` stops it and passes on what it still holds, by
    `deadline` (time.monotonic()), returning whether it finished; `stats()` its counters, by
    their status keys (merged with the others' into `status`)."""

    name = "stage"
    # Of the drain's time left when this stage's turn comes, the share it may take.
    drain_share = 1.0

    def start(self) -> None:
        pass

    def consume(self, batch: list) -> None:
        pass

    def flush(self) -> None:
        pass

    def drain(self, deadline: float) -> bool:
        self.flush()
        return True

    def stats(self) -> dict:
        return {}


class Pipeline:
    """The stages in order: started in order, drained in order, their counters merged."""

    def __init__(self, stages: list[Stage], clock: Callable[[], float] = time.monotonic) -> None:
        self.stages = stages
        self._clock = clock
        self.marks: list[tuple[str, float]] = []     # (stage, seconds its drain took): the drain's log

    def start(self) -> None:
        for stage in self.stages:
            stage.start()

    def drain(self, deadline: float) -> list[str]:
        """Drain each stage in order, each by its share of the time left (the last: all of it);
        the names of those that did not finish by their deadline."""
        unfinished = []
        for stage in self.stages:
            now = self._clock()
            own = min(deadline, now + max(0.0, deadline - now) * stage.drain_share)
            if not stage.drain(own):
                unfinished.append(stage.name)
            self.marks.append((stage.name, self._clock() - now))
        return unfinished

    def stats(self) -> dict:
        merged: dict = {}
        for stage in self.stages:
            merged.update(stage.stats())
        return merged
