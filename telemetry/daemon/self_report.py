"""What the daemon says of itself: its loss accounting, `status`, the `daemon` record, its progress.

- `Losses`: the records lost past the receiver's own accounting (receiver.py: malformed, dropped
  by clients, lost in transit): those that raised in a pipeline stage, those shed by the intake
  queue, those still queued at the drain deadline (read and counted, never processed), and the
  clients still open when the drain ended. `totals()` adds them to the receiver's figures:
  records_lost is summed there and nowhere else.
- `status(d)`: the control socket's answer (`telemetry status`), also the drain's reply and
  drain.json; `memory_status(d)` its memory part.
- `daemon_record(d)`: the `daemon` record written every daemon_record_interval_s and at the
  drain. Its counters are the catalogue's (telemetry/shared/catalogue.py, source "self"); one
  that `status` also has is read from the same figures (`counts`) at the path its entry names,
  so the two never say different things (telemetry/records_lost is status's records_lost).
- `progress_line(d, rec)`: the line the daemon logs at that interval (the trainer prints none:
  reading its loss would be a host-device sync).

Each reads the daemon's parts (`d`: core.Daemon) and changes none of them.
"""
from __future__ import annotations

import logging
import os
import time

from typing import TYPE_CHECKING

from protocol.output import DaemonRecord, MetricsRecord
from telemetry.daemon.goodput_stage import daemon_values as goodput_values
from telemetry.daemon.intake import SHED_KIND
from telemetry.shared.catalogue import CATALOGUE

if TYPE_CHECKING:
    from telemetry.daemon.core import Daemon

log = logging.getLogger("telemetry.daemon")

# Kinds of failure (stage, exception type) logged with a traceback; more are only counted.
MAX_FAILURE_CAUSES = 100
# The daemon record's counters that status has too: (name, path into counts()).
STATUS_TWINS = tuple((m.name, tuple(m.status.split("."))) for m in CATALOGUE if m.source == "self" and m.status)


class Losses:
    def __init__(self) -> None:
        self.num_unread_at_drain = 0           # queued at the drain deadline, read and counted lost
        self.num_sources_open_at_drain = 0     # clients still sending at the drain's end, no bye
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
        t["records_failed"] = self.num_records_failed
        t[SHED_KIND] = intake.num_shed if intake is not None else 0
        t["records_lost"] += self.num_unread_at_drain + self.num_records_failed + t[SHED_KIND]
        return t


def counts(d: Daemon) -> dict:
    """The figures `status` and the `daemon` record both carry, by their status keys."""
    totals = d.losses.totals(d.receiver, d.intake)
    hellos, receiver, events = d.hellos, d.receiver, d.rare.num_events_in
    steps = d.steps.stats()
    return {
        **totals,
        "steps_out": steps["steps_out"],
        "steps_incomplete": steps["steps_incomplete"],
        "records_late": steps["records_late"],
        "records_in_by_kind": {"hello": hellos.num_in, "event": events, "bye": receiver.num_byes,
                               "metrics": totals["records_in"] - hellos.num_in - events - receiver.num_byes},
        "uptime_s": round(time.monotonic() - d.started_mono, 3),
        "memory": memory_status(d),
    }


def status(d: Daemon) -> dict:
    """The daemon's counters (`counts`), each pipeline stage's (pipeline.Pipeline.stats), and
    what the daemon itself holds: its run, sockets, limits, pollers and node links."""
    c = counts(d)
    agg = d.aggregator
    stages = d.pipeline.stats() if d.pipeline is not None else {}
    return {
        **c,
        "ranks": sorted(agg.world.seen | set(d.hellos.by_rank)),
        **stages,
        "pollers": {p.name: p.stats() for p in d.pollers},
        "started_at": d.started_wall,
        "pid": os.getpid(),
        "run_name": d.cfg.run_name,
        "log_dir": str(d.log_dir),
        "endpoints": d.endpoints,
        "security": {**d.security.stats(), "redacted": d.redactor.num_redacted},
        "limits": {"fd_limit": d.fd_limit, "max_connections": d.max_connections,
                   "rcvhwm": d.cfg.rcvhwm, "rcvhwm_per_connection": d.cfg.connection_hwm()},
        "goodput": d.goodput.stats(),
        "run": d.continuity.status(c["records_lost"]),
        "node_links": d.links.stats() if d.links is not None else {},
        "node_clocks": d.clocks.stats() if d.clocks is not None else {},
    }


def memory_status(d: Daemon) -> dict:
    """The memory budget: its split (MB), what each bounded buffer holds now, what was shed."""
    shed = dict(d.shed.counts)
    shed["sink_records"] = sum(r.num_dropped_for_bytes for r in d.runners)
    return {"budget_mb": d.cfg.memory_mb, "split_mb": d.budget.split(),
            "rss_mb": rss_mb(), "shed": shed, "records_shed": sum(shed.values()),
            "held": {"recent_mb": round(d.recent_metrics.num_bytes / 2**20, 1),
                     "open_records": d.aggregator.num_open_records,
                     "hellos_mb": round(d.hello_infos.num_bytes / 2**20, 1),
                     "names": len(d.names), "max_names": d.names.max_names},
            "heap_trims": d.num_heap_trims,
            "governor": d.governor.stats() if d.governor is not None else {}}


def daemon_record(d: Daemon) -> DaemonRecord:
    """The `daemon` record: the daemon's counters, the goodput ledger's figures, each sink's queue."""
    c = counts(d)
    runners = d.runners
    values = {}
    for name, path in STATUS_TWINS:
        v = c
        for k in path:
            v = v[k]
        values[name] = v
    # Its own: records a sink never got; the analysis stages' drops (diagnosis, held to a share
    # of the time; hang forensics) are analysis skipped under load, not output lost.
    values["telemetry/sink_dropped"] = sum(r.num_dropped for r in runners if not r.analysis)
    values["telemetry/diagnosis_skipped"] = sum(r.num_dropped for r in runners if r.analysis)
    values["telemetry/num_ranks"] = len(d.aggregator.world.seen)
    values.update(d.security.counters())
    try:
        values.update(goodput_values(d.goodput.result()))
        values.update(d.goodput.settled_values())
    except Exception:    # the daemon's own record must go out whatever the ledger does
        log.exception("goodput: the ledger failed")
    for r in runners:
        values[f"telemetry/sink/{r.name}/queued"] = r.queued()
        values[f"telemetry/sink/{r.name}/dropped"] = r.num_dropped
    return DaemonRecord(time.time(), values, run=d.cfg.run_name)


def progress_line(d: Daemon, rec: MetricsRecord) -> str:
    """The run's progress at its latest aggregated step `rec`, seen from the daemon."""
    v = rec["values"]
    parts = [f"step {rec['step']}"]
    for key, label, fmt in (("train/loss", "loss", ".4f"), ("perf/tokens_per_second", "tokens/s", ",.0f"),
                            ("perf/step_time_max", "step", ".3f"), ("perf/mfu_percent", "MFU %", ".1f")):
        x = v.get(key)
        if isinstance(x, (int, float)):
            parts.append(f"{label} {x:{fmt}}" + (" s" if label == "step" else ""))
    lost = d.losses.totals(d.receiver, d.intake)["records_lost"]
    return f"progress: {'  '.join(parts)}  (records in {d.receiver.num_in}, lost {lost})"


def rss_mb() -> float | None:
    """This process's resident memory (Linux /proc), for status; None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None
