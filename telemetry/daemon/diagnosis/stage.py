"""Runs the diagnosis rules off the daemon's thread, as a stage fed like a sink.

The rules look at every output record (aggregated steps, GPU and host samples) and may produce
event records. On the daemon's thread they would cost ingest time per step; here they get their
own bounded queue and thread (a burst that outruns them is dropped and counted, never slows
ingest), and their events go back into the pipeline through the daemon's thread-safe `post`,
so they reach every sink like any other record. Time-based rules tick on the flush interval.

Events are the rules' output, never their input (a rank's event could say anything), with one
door: what the daemon itself noticed and wrote as an event, handed over by `note` (a head's
`link_closed`: telemetry/daemon/node_links.py), read at the next batch or tick.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable

from telemetry.daemon.sinks.base import Out, Sink

log = logging.getLogger("telemetry.daemon")

TICK_INTERVAL_S = 1.0


class DiagnosisStage(Sink):
    name = "diagnosis"

    def __init__(self, diagnoser, post: Callable[[dict], None]) -> None:
        self.diagnoser = diagnoser
        self.post = post
        self.num_events = 0
        self._noted: deque = deque()

    def note(self, record: dict) -> None:
        """A record the daemon made itself, for the rules (thread-safe; see the module docstring)."""
        self._noted.append(record)

    def consume(self, batch: list[Out]) -> None:
        self._take_noted()
        consume = self.diagnoser.consume
        for o in batch:
            if o.kind != "event":       # events are the rules' output, never their input
                for ev in consume(o.record):
                    self._post(ev)

    def flush(self) -> None:
        self._take_noted()
        for ev in self.diagnoser.tick(time.time()):
            self._post(ev)

    def _take_noted(self) -> None:
        noted = self._noted
        while noted:
            for ev in self.diagnoser.consume(noted.popleft()):
                self._post(ev)

    def _post(self, ev: dict) -> None:
        self.num_events += 1
        msg = ev.get("data", {}).get("message")
        if msg:
            log.warning("diagnosis: %s", msg)
        self.post(ev)

    def stats(self) -> dict:
        try:
            return dict(self.diagnoser.stats())
        except Exception:   # stats must never fail a status request
            return {"events": self.num_events}
