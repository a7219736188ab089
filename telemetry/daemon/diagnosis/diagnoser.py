"""Diagnoser: feeds records to the rules, rate limits what they find, and returns event records.

    d = Diagnoser(DiagnosisConfig())
    events = d.consume(record)   # any record dict of the JSONL contract; [] most of the time
    events += d.tick(time.time())  # about once a second, for the time-based rules

Each event is a record of the JSONL contract:
    {"kind": "event", "t": <unix s>, "rank": int | None, "name": "diagnosis/<rule>",
     "data": {"message": "<sentence with numbers>", "rule": str, "severity": "warning"|"critical",
              "subject": str, "num_suppressed": int, ...the rule's numbers}}
"num_suppressed" counts findings of the same rule and subject dropped by the rate limit since
the previous event. With cfg.log_events the message also goes to the "telemetry.daemon.diagnosis" logger
(WARNING, or ERROR when critical); leave it off where the caller logs the events it emits.

consume and tick never raise: a rule that throws is logged once and counted, and the others go on.
"""
from __future__ import annotations

import logging
import re
import math
from typing import Any

from protocol.output import EventRecord, OutputRecord
from telemetry.daemon.diagnosis.config import DiagnosisConfig
from telemetry.daemon.diagnosis.rules import RULES, Finding, Rule
from telemetry.daemon.diagnosis.rules.base import metrics_facts

log = logging.getLogger("telemetry.daemon.diagnosis")


def _json_safe(v: Any) -> Any:
    # JSON has no NaN/Inf; a rule's numbers must not make the JSONL sink write invalid lines.
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class Diagnoser:
    """Run the registered rules (minus cfg.disabled_rules) over the daemon's records.

    Args:
        cfg: thresholds and rate limit; None = defaults.
        rules: explicit rule instances instead of the registry (tests).
    """

    def __init__(self, cfg: DiagnosisConfig | None = None, *, rules: list[Rule] | None = None,
                 unit: str = "rank") -> None:
        """unit: what the daemon's "ranks" are: "node" on a head, whose world is its nodes (each
        node's aggregate is one "rank" there): its findings say node, not rank; "group" on a job
        head fed by group heads (the daemon sets it when their hellos say so)."""
        self.cfg = cfg if cfg is not None else DiagnosisConfig()
        self.unit = unit
        if rules is None:
            rules = [] if not self.cfg.enabled else [
                cls(self.cfg) for name, cls in RULES.items() if name not in self.cfg.disabled_rules]
        self.rules = rules
        self._by_kind: dict[str, list[Rule]] = {}
        for r in rules:
            for kind in r.kinds:
                self._by_kind.setdefault(kind, []).append(r)
        self._last_event_t: dict[tuple[str, str], float] = {}
        self._num_suppressed: dict[tuple[str, str], int] = {}
        self.num_events = 0
        self.num_suppressed = 0
        self.num_rule_errors: dict[str, int] = {}

    def consume(self, record: OutputRecord | dict) -> list[EventRecord]:
        """Event records caused by this record (usually none)."""
        if not isinstance(record, (OutputRecord, dict)):    # (a dict: a record read back from a file)
            return []
        kind = record.get("kind")
        out: list[EventRecord] = []
        facts = metrics_facts(record, self.cfg) if kind == "metrics" else None
        for rule in self._by_kind.get(kind, ()):  # type: ignore[arg-type]
            if facts is None or rule.judges(*facts):
                out += self._run(rule, rule.consume, record)
        return out

    def tick(self, now: float) -> list[EventRecord]:
        """Event records of the time-based rules at unix time now."""
        out: list[EventRecord] = []
        for rule in self.rules:
            out += self._run(rule, rule.tick, now)
        return out

    def stats(self) -> dict[str, Any]:
        """Counters for the daemon's status."""
        return {"rules": [r.name for r in self.rules], "unit": self.unit, "num_events": self.num_events,
                "num_suppressed": self.num_suppressed, "num_rule_errors": dict(self.num_rule_errors)}

    def _run(self, rule: Rule, fn: Any, arg: Any) -> list[EventRecord]:
        try:
            findings = fn(arg)
        except Exception:
            n = self.num_rule_errors[rule.name] = self.num_rule_errors.get(rule.name, 0) + 1
            if n == 1:  # a broken rule on a per-record path must not flood the daemon log
                log.exception("diagnosis rule %s failed (further failures are counted)", rule.name)
            return []
        return [e for e in (self._event(rule, f) for f in findings) if e is not None]

    def _event(self, rule: Rule, f: Finding) -> EventRecord | None:
        key = (rule.name, f.subject)
        last = self._last_event_t.get(key)
        if last is not None and f.t - last < self.cfg.min_interval_s:
            self._num_suppressed[key] = self._num_suppressed.get(key, 0) + 1
            self.num_suppressed += 1
            return None
        self._last_event_t[key] = f.t
        data = {k: _json_safe(v) for k, v in f.data.items()}
        message, subject = f.message, f.subject
        unit = self.unit
        if unit != "rank":               # a head: its ranks are nodes (or groups of nodes)
            message, subject = as_unit(message, unit), as_unit(subject, unit)
            data["unit"] = unit
        data.update(message=message, rule=rule.name, severity=f.severity, subject=subject,
                    num_suppressed=self._num_suppressed.pop(key, 0))
        self.num_events += 1
        if self.cfg.log_events:
            log.log(logging.ERROR if f.severity == "critical" else logging.WARNING, "%s", message)
        return EventRecord(f.t, f.rank, f"diagnosis/{rule.name}", data)


_RANK_WORD = re.compile(r"\b([Rr])ank(s?)(?=\b|\d)")


def as_unit(text: str, unit: str) -> str:
    """A finding of a head's rules in its own terms: "rank 3" / "ranks" / "rank3" are nodes there
    (unit "node"), or groups of nodes on a job head fed by group heads (unit "group")."""
    return _RANK_WORD.sub(lambda m: (unit[0].upper() if m.group(1) == "R" else unit[0]) + unit[1:] + m.group(2), text)
