"""The rare records' stage: a batch that is not all metrics, taken in each client's program order
(a client's two pipes interleave on the socket: `in_program_order`), its metrics runs passed to
the steps stage and the rest handled as they come: hellos (hellos.py: each rank's info, the
world's size, a node link's identity, MFU's model), events (secrets redacted; media routed to
the media keeper), byes (held behind their client's records: byes.py), and on a head each
node's clock (node_clocks.py) read from its hellos and clock events.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from protocol import Bye, Event, Hello, Metrics
from protocol.output import ByeRecord, EventRecord, HelloRecord, OutputRecord
from telemetry.daemon.byes import HeldByes
from telemetry.daemon.hellos import Hellos
from telemetry.daemon.node_clocks import CLOCK_EVENTS, NodeClocks
from telemetry.daemon.node_links import NodeLinks
from telemetry.daemon.pipeline import Stage
from telemetry.daemon.receiver import Receiver
from telemetry.daemon.self_report import Losses
from telemetry.daemon.stages.steps import StepsStage
from telemetry.shared.media import EVENT as MEDIA_EVENT
from telemetry.shared.security.redact import Redactor

log = logging.getLogger("telemetry.daemon")


class RareStage(Stage):
    name = "rare"
    drain_share = 0.5

    def __init__(self, receiver: Receiver, hellos: Hellos, steps: StepsStage, losses: Losses,
                 redactor: Redactor, emit: Callable[[OutputRecord], None], *, forwards: bool,
                 head: bool) -> None:
        self.receiver = receiver
        self.hellos = hellos
        self.steps = steps
        self.losses = losses
        self.redactor = redactor
        self._emit = emit
        self.forwards = forwards           # a node daemon: it waits for the ranks it has seen
        self.head = head                   # it has a remote ingest (node daemons send to it)
        self.byes = HeldByes()             # byes behind their records (byes.py)
        self.links: NodeLinks | None = None      # a head's: which node each link is (set at start)
        self.clocks: NodeClocks | None = None    # a head's: each node's clock against its own
        self.diagnoser = None              # its unit ("rank", "node", "group") follows the hellos
        self.forensics = None              # told of each bye (a finished rank's exit is no crash)
        self.media = None                  # the MediaKeeper (not on a head)
        self.diagnosis = None              # the DiagnosisStage: told of each node link's news
        self.num_events_in = 0

    def consume(self, batch: list) -> None:
        run: list = []               # metrics in a row; other kinds are handled in order of arrival
        clocks = self.clocks
        for rec in in_program_order(batch):
            kind = type(rec)
            if kind is Metrics:
                run.append(rec)
                continue
            if run:
                self.steps.consume(run)
                run = []
            try:
                if clocks is not None:
                    if kind is Hello or kind is Event and rec.name in CLOCK_EVENTS:
                        self._observe_clock(rec)
                    off = clocks.offset_ns.get(rec.src)
                    if off is not None:
                        rec = clocks.correct_one(rec, off)
                if kind is Event:
                    self.num_events_in += 1
                    data = self.redactor(rec.data)
                    self._emit(EventRecord(rec.t_ns / 1e9, rec.rank, rec.name, data))
                    if rec.name == MEDIA_EVENT and self.media is not None:
                        self.media.put(rec.rank, data)
                elif kind is Hello:
                    self.receiver.note_hello(rec.src)
                    self._on_hello(rec)
                elif kind is Bye:
                    self._on_bye(rec)
            except Exception as exc:          # the boundary should have caught it: counted, go on
                self.losses.failed(kind.__name__.lower(), exc, 1)
        if run:
            self.steps.consume(run)

    def tick(self, now: float) -> None:
        """The loop's housekeeping: the held byes that are due (byes.py); on a head, the news of
        its node links (a node gone without a bye: node_links.py)."""
        if self.byes:
            self._write_byes(self.byes.release(now, self.receiver.sources))
        if self.links is not None and self.links.busy():
            for rec in self.links.due(now, self.receiver.sources):
                self._emit(rec)
                if self.diagnosis is not None:
                    self.diagnosis.note(rec)      # the rules read no event but this kind

    def drain(self, deadline: float) -> bool:
        """Every held bye goes out (after the open steps: the steps stage drains first)."""
        self._write_byes(self.byes.release(time.monotonic(), self.receiver.sources, everything=True))
        return True

    def stats(self) -> dict:
        return {"hellos_not_kept": self.hellos.num_not_kept}

    def _on_bye(self, rec: Bye) -> None:
        """Counted by the receiver; passed on so the diagnosis knows a silent rank finished,
        after the records of its client that are still on their way (held up to BYE_HOLD_S)."""
        self.receiver.note_bye(rec.src)
        if self.forensics is not None:
            self.forensics.note_bye(rec.rank)      # this rank finished: its exit is no crash
        if not self.byes.hold(rec, self.receiver.sources.get(rec.src), time.monotonic()):
            self._write_byes([rec])

    def _write_byes(self, byes: list[Bye]) -> None:
        for rec in byes:
            self._emit(ByeRecord(rec.t_ns / 1e9, rec.rank, rec.stats))

    def _on_hello(self, rec: Hello) -> None:
        info = self.hellos.take(rec.rank, rec.info)
        world = self.steps.aggregator.world
        world.announce(rec.rank)           # of the world: its records count toward their steps
        if not self.forwards:
            ws = self.hellos.world_size(rec.rank, info)
            if ws is not None:
                world.note_size(ws)
        diagnoser = self.diagnoser
        if info.get("forwarded_by") == "group head" and self.head and diagnoser is not None \
                and diagnoser.unit != "group":
            # A job head fed by group heads: its "ranks" are groups of nodes, and its findings say so.
            diagnoser.unit = "group"
        if self.links is not None and info.get("forwarded_by"):
            self.links.on_hello(rec.rank, info, rec.src)
        self.steps.derived.on_hello(info)
        # A pid in a hello is a claim: the forensics stage verifies it before the pollers or the
        # forensics act on it (telemetry/daemon/forensics/verify.py).
        self._emit(HelloRecord(rec.t_ns / 1e9, rec.rank, info))

    def _observe_clock(self, rec) -> None:
        """A node's record made as it was sent: its clock against this daemon's (node_clocks.py)."""
        change = self.clocks.observe(rec.src, rec.rank, rec.t_ns, time.time_ns())
        if change is None:
            return
        self._emit(change)
        off = change["data"]["offset_s"]
        unit = self.diagnoser.unit if self.diagnoser is not None else "node"
        if off:
            log.warning("%s %d's clock is %.1f s %s this daemon's: its records' times are moved by that from "
                        "now on (an event clock_offset says so)", unit, rec.rank, abs(off),
                        "ahead of" if off > 0 else "behind")
        else:
            log.warning("%s %d's clock agrees with this daemon's again: its records' times are no longer moved",
                        unit, rec.rank)


def in_program_order(recs: list) -> list:
    """A batch with each client's records in the order it made them (by seq), in the slots its
    records held; the others' order is kept. A client sends its metrics with tensor values from
    its sender thread, on that thread's own socket (telemetry/client/deferred.py), and everything
    else on its main socket: two pipes, which the ingest socket interleaves in any order. So an
    event sent before a step's record (wandb/nested: how W&B must store that step's keys;
    wandb/values: the text values of its row) could be handled after the step went out (a
    loaded machine, both in one batch). Costs a pass over batches that hold other kinds than
    metrics; a sort only where a client's records came out of order."""
    last: dict[int, int] = {}
    for rec in recs:
        src, seq = rec.src, rec.seq
        if last.get(src, -1) > seq:
            break
        last[src] = seq
    else:
        return recs
    slots: dict[int, list[int]] = {}
    for i, rec in enumerate(recs):
        slots.setdefault(rec.src, []).append(i)
    out = list(recs)
    for idx in slots.values():
        if len(idx) > 1:
            for i, rec in zip(idx, sorted((recs[i] for i in idx), key=_by_seq)):
                out[i] = rec
    return out


def _by_seq(rec) -> int:
    return rec.seq
