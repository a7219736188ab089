"""What the daemon says of itself: its loss accounting, `status`, the `daemon` record, its progress.

- `Losses`: the records lost past the receiver's own accounting (receiver.py: malformed, dropped
  by clients, lost in transit): those that raised in a pipeline stage, those shed by the intake
  queue, those still queued at the drain deadline (read and counted, never processed), and the
  clients still open when the drain ended. `totals()` adds them to the receiver's figures:
  records_lost is summed there and nowhere else.
- `SelfReport`: built from the parts it reads (the pipeline's stages, the memory budget, the
  security stage, the pollers, the continuity, the daemon's `Identity`), it changes none of them:
  - `status()`: the control socket's answer (`telemetry status`), also the drain's reply and
    drain.json; `memory_status()` its memory part.
  - `daemon_record()`: the `daemon` record written every daemon_record_interval_s and at the
    drain. Its counters are the catalogue's (telemetry/shared/catalogue.py, source "self"); one
    that `status` also has is read from the same figures (`counts`) at the path its entry names,
    so the two never say different things (telemetry/records_lost is status's records_lost).
  - `log_progress()`: the line the daemon logs at that interval (the trainer prints none:
    reading its loss would be a host-device sync).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from protocol.output import DaemonRecord, MetricsRecord
from telemetry.daemon import memory
from telemetry.daemon.goodput_stage import daemon_values as goodput_values
from telemetry.daemon.intake import SHED_KIND
from telemetry.shared.catalogue import CATALOGUE

if TYPE_CHECKING:    # the stages import Losses from here
    from telemetry.daemon.continuity import Continuity
    from telemetry.daemon.pipeline import Pipeline
    from telemetry.daemon.stages.fanout import FanOut
    from telemetry.daemon.stages.rare import RareStage
    from telemetry.daemon.stages.receive import ReceiveStage
    from telemetry.daemon.stages.steps import StepsStage

log = logging.getLogger("telemetry.daemon")

# Kinds of failure (stage, exception type) logged with a traceback; more are only counted.
MAX_FAILURE_CAUSES = 100
# The daemon record's counters that status has too: (name, path into counts()).
STATUS_TWINS = tuple((m.name, tuple(m.status.split("."))) for m in CATALOGUE if m.source == "self" and m.status)


class Losses:
    def __init__(self) -> None:
        self.num_unread_at_drain = 0           # queued at the drain deadline, read and counted lost
        self.num_sources_open_at_drain = 0     # clients without a bye at the drain's end (Receiver.open_clients)
        # Clients whose process ended without a bye, their accounting closed by their page
        # (client_page.py), and the records they took a seq for that never left them.
        self.num_sources_ended_by_page = 0
        self.num_lost_with_client = 0
        # Clients that closed with a bye this daemon never read (a predecessor killed first):
        # their accounting closed by their page marked closed; their tail was sent, lost in transit.
        self.num_sources_closed_by_page = 0
        self.num_records_failed = 0            # raised in a pipeline stage (failed()), counted lost
        self._failure_causes: set[tuple[str, str]] = set()

    def failed(self, stage: str, exc: Exception, num_records: int) -> None:
        """The last resort: a record the boundary (protocol/, receiver) let through raised in a
        pipeline stage. Counted in records_failed (and so in records_lost), logged with its
        traceback once per stage and kind of exception; the loop goes on."""
        self.num_records_failed += num_records
        cause = (stage, type(exc).__name__)
        if cause not in self._failure_causes and len(self._failure_causes) < MAX_FAILURE_CAUSES:
            self._failure_causes.add(cause)
            log.error("%s: a record raised %s (counted in records_failed; logged once per cause): %s",
                      stage, type(exc).__name__, exc, exc_info=exc)

    def totals(self, receiver, intake) -> dict:
        """The receiver's accounting, plus the records left unread in the queue at the drain
        deadline (accepted by libzmq, never processed), those that failed in a stage and those
        the intake queue shed: all lost, and counted as such."""
        t = receiver.totals()
        t["records_unread_at_drain"] = self.num_unread_at_drain
        t["sources_open_at_drain"] = self.num_sources_open_at_drain
        t["sources_ended_by_page"] = self.num_sources_ended_by_page
        t["sources_closed_by_page"] = self.num_sources_closed_by_page
        t["records_lost_with_client"] = self.num_lost_with_client
        t["records_failed"] = self.num_records_failed
        t[SHED_KIND] = intake.num_shed if intake is not None else 0
        t["records_lost"] += self.num_unread_at_drain + self.num_records_failed + t[SHED_KIND]
        return t


@dataclass
class Identity:
    """Who the daemon is, for `status`: its run, where it writes, when it started, where it
    listens and within which limits."""

    run_name: str | None
    log_dir: Path
    started_wall: float
    started_mono: float
    endpoints: dict[str, str]
    limits: dict


class SelfReport:
    """`status`, the `daemon` record and the progress line, from the parts they read: the
    pipeline's stages (their stats() and counters), the memory budget, the security stage, the
    pollers, the continuity and the daemon's identity. It changes none of them."""

    def __init__(self, identity: Identity, budget: memory.Budget, pipeline: Pipeline, *, receive: ReceiveStage,
                 rare: RareStage, steps: StepsStage, fanout: FanOut, hello_infos: memory.HelloInfos, security,
                 pollers: list, continuity: Continuity, governor: memory.Governor | None,
                 heap_trims: Callable[[], int]) -> None:
        self.identity = identity
        self.budget = budget
        self.pipeline = pipeline
        self.receive, self.rare, self.steps, self.fanout = receive, rare, steps, fanout
        self.hello_infos = hello_infos
        self.security = security
        self.pollers = pollers
        self.continuity = continuity
        self.governor = governor
        self.heap_trims = heap_trims           # how often the heap was given back (core's timer)
        self._progress_logged: MetricsRecord | None = None

    def totals(self) -> dict:
        """The loss accounting: the receiver's, plus what was lost past it (Losses)."""
        return self.receive.losses.totals(self.receive.receiver, self.receive.intake)

    def counts(self) -> dict:
        """The figures `status` and the `daemon` record both carry, by their status keys."""
        totals = self.totals()
        hellos, receiver, events = self.rare.hellos, self.receive.receiver, self.rare.num_events_in
        steps = self.steps.stats()
        return {
            **totals,
            "steps_out": steps["steps_out"],
            "steps_incomplete": steps["steps_incomplete"],
            "records_late": steps["records_late"],
            "records_unannounced": steps["records_unannounced"],
            "records_unannounced_refused": steps["records_unannounced_refused"],
            "records_in_by_kind": {"hello": hellos.num_in, "event": events, "bye": receiver.num_byes,
                                   "metrics": totals["records_in"] - hellos.num_in - events - receiver.num_byes},
            "uptime_s": round(time.monotonic() - self.identity.started_mono, 3),
            "memory": self.memory_status(),
        }

    def sink_dropped(self) -> int:
        """Records an output sink never got (the analysis stages' drops are analysis skipped under
        load, not output lost: diagnosis_skipped)."""
        return sum(r.num_dropped for r in self.fanout.runners if not r.analysis)

    def status(self) -> dict:
        """The control socket's answer (`telemetry status`), also the drain's reply and drain.json:
        the daemon's counters (`counts`), each stage's (Pipeline.stats), and its run, sockets,
        limits, pollers and node links."""
        c = self.counts()
        ident, rare, goodput = self.identity, self.rare, self.steps.goodput
        return {
            **c,
            "ranks": sorted(self.steps.aggregator.world.seen | set(rare.hellos.by_rank)),
            **self.pipeline.stats(),
            "pollers": {p.name: p.stats() for p in self.pollers},
            "started_at": ident.started_wall,
            "pid": os.getpid(),
            "run_name": ident.run_name,
            "log_dir": str(ident.log_dir),
            "sink_dropped": self.sink_dropped(),
            "endpoints": ident.endpoints,
            "security": {**self.security.stats(), "redacted": rare.redactor.num_redacted},
            "limits": ident.limits,
            "goodput": goodput.stats(),
            "run": self.continuity.status(c["records_lost"]),
            "node_links": rare.links.stats() if rare.links is not None else {},
            "node_clocks": rare.clocks.stats() if rare.clocks is not None else {},
        }

    def memory_status(self) -> dict:
        """The memory budget: its split (MB), what each bounded buffer holds now, what was shed."""
        steps = self.steps
        shed = dict(steps.shed.counts)
        shed["sink_records"] = sum(r.num_dropped_for_bytes for r in self.fanout.runners)
        return {"budget_mb": self.budget.memory_mb, "split_mb": self.budget.split(),
                "rss_mb": rss_mb(), "shed": shed, "records_shed": sum(shed.values()),
                "held": {"recent_mb": round(steps.recent.num_bytes / 2**20, 1),
                         "open_records": steps.aggregator.num_open_records,
                         "hellos_mb": round(self.hello_infos.num_bytes / 2**20, 1),
                         "names": len(steps.names), "max_names": steps.names.max_names},
                "heap_trims": self.heap_trims(),
                "governor": self.governor.stats() if self.governor is not None else {}}

    def daemon_record(self) -> DaemonRecord:
        """The `daemon` record, written every daemon_record_interval_s and at the drain: the
        daemon's counters, the goodput ledger's figures, each sink's queue."""
        c = self.counts()
        runners = self.fanout.runners
        values = {}
        for name, path in STATUS_TWINS:
            v = c
            for k in path:
                v = v[k]
            values[name] = v
        # Its own: records a sink never got; the analysis stages' drops (diagnosis, held to a share
        # of the time; hang forensics) are analysis skipped under load, not output lost.
        values["telemetry/sink_dropped"] = self.sink_dropped()
        values["telemetry/diagnosis_skipped"] = sum(r.num_dropped for r in runners if r.analysis)
        values["telemetry/num_ranks"] = len(self.steps.aggregator.world.seen)
        values.update(self.security.counters())
        goodput = self.steps.goodput
        try:
            values.update(goodput_values(goodput.result()))
            values.update(goodput.settled_values())
        except Exception:    # the daemon's own record must go out whatever the ledger does
            log.exception("goodput: the ledger failed")
        for r in runners:
            values[f"telemetry/sink/{r.name}/queued"] = r.queued()
            values[f"telemetry/sink/{r.name}/dropped"] = r.num_dropped
        return DaemonRecord(time.time(), values, run=self.identity.run_name)

    def log_progress(self) -> None:
        """One line per daemon-record interval, when a step has gone out since the last."""
        rec = self.steps.latest
        if rec is None or rec is self._progress_logged:
            return
        self._progress_logged = rec
        log.info("%s", self.progress_line(rec))

    def progress_line(self, rec: MetricsRecord) -> str:
        """The run's progress at its latest aggregated step `rec`, seen from the daemon."""
        v = rec["values"]
        parts = [f"step {rec['step']}"]
        for key, label, fmt in (("train/loss", "loss", ".4f"), ("perf/tokens_per_second", "tokens/s", ",.0f"),
                                ("perf/step_time_max", "step", ".3f"), ("perf/mfu_percent", "MFU %", ".1f")):
            x = v.get(key)
            if isinstance(x, (int, float)):
                parts.append(f"{label} {x:{fmt}}" + (" s" if label == "step" else ""))
        lost = self.totals()["records_lost"]
        return f"progress: {'  '.join(parts)}  (records in {self.receive.receiver.num_in}, lost {lost})"


def rss_mb() -> float | None:
    """This process's resident memory (Linux /proc), for status; None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None
