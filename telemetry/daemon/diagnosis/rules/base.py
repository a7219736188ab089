"""What a diagnosis rule is: a small stateful object fed records, returning Findings.

A rule declares the record kinds it reads and which metrics records it judges (aggregated only,
past the warm-up, complete steps only); the Diagnoser feeds it only those, turns its Findings
into event records, rate limits them per (rule, subject) and never lets a rule's exception out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from telemetry.daemon.diagnosis.config import DiagnosisConfig
from telemetry.shared.numbers import is_int, is_number


@dataclass(slots=True)
class Finding:
    """One thing a rule noticed.

    Attributes:
        subject: what it is about, the rate-limit key within the rule ("run", "rank3", "node0/gpu2").
        message: one human sentence with the numbers and a likely cause.
        t: unix seconds (the triggering record's t, or tick's now).
        rank: the rank it is about, None for the run or a GPU/host.
        severity: "warning" or "critical".
        data: the numbers behind the message (JSON scalars).
    """

    subject: str
    message: str
    t: float
    rank: int | None = None
    severity: str = "warning"
    data: dict[str, Any] = field(default_factory=dict)


class Rule:
    """Base class. Subclasses set name and kinds and implement consume (and tick if time-based).

    The metrics records a rule is fed are narrowed by three class flags, checked once by the
    Diagnoser before consume (records of other kinds always reach it):
        aggregated_only: only the across-ranks records (no "rank"), not each rank's own;
        after_warmup: only steps >= cfg.warmup_steps (compilation and allocator growth look alarming);
        complete_only: only steps with every rank (a partial sum or mean is no signal).
    """

    name: ClassVar[str] = ""
    kinds: ClassVar[frozenset[str]] = frozenset()
    aggregated_only: ClassVar[bool] = False
    after_warmup: ClassVar[bool] = False
    complete_only: ClassVar[bool] = False

    def __init__(self, cfg: DiagnosisConfig) -> None:
        self.cfg = cfg

    def judges(self, aggregated: bool, warm: bool, whole: bool) -> bool:
        """Whether a metrics record with these facts (see metrics_facts) reaches consume."""
        return (aggregated or not self.aggregated_only) and (warm or not self.after_warmup) \
            and (whole or not self.complete_only)

    def consume(self, record: dict) -> list[Finding]:
        """Findings caused by this record (kind is one of self.kinds; a metrics record it judges)."""
        return []

    def tick(self, now: float) -> list[Finding]:
        """Findings caused by the passing of time (e.g. silence); now is unix seconds."""
        return []


def num(values: Any, key: str) -> float | None:
    """values[key] as a finite-or-not float, or None if absent or not a number."""
    if not isinstance(values, dict):
        return None
    v = values.get(key)
    if not is_number(v):
        return None
    return float(v)


def finite(values: Any, key: str) -> float | None:
    """values[key] as a finite float, or None."""
    v = num(values, key)
    return v if v is not None and math.isfinite(v) else None


def is_aggregated_metrics(record: dict) -> bool:
    """A metrics record the daemon aggregated across ranks (no "rank" key, or rank None)."""
    return record.get("kind") == "metrics" and record.get("rank") is None


def complete(record: dict) -> bool:
    """False for an aggregated step emitted without some ranks: its sums and means are partial."""
    return not record.get("missing_ranks")


def step_of(record: dict) -> int | None:
    s = record.get("step")
    return s if is_int(s) else None


def t_of(record: dict) -> float:
    t = record.get("t")
    return float(t) if is_number(t) else 0.0


def past_warmup(record: dict, cfg: DiagnosisConfig) -> bool:
    s = step_of(record)
    return s is not None and s >= cfg.warmup_steps


def metrics_facts(record: dict, cfg: DiagnosisConfig) -> tuple[bool, bool, bool]:
    """(aggregated, past the warm-up, complete) of a metrics record: what Rule.judges reads."""
    return is_aggregated_metrics(record), past_warmup(record, cfg), complete(record)
