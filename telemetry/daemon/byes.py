"""Byes held behind their client's records.

A bye travels on a connection of its own (telemetry/client/core.py close) and may arrive before
the last records of its client. Its record goes out once they are all in, or once none of them
has come for BYE_HOLD_S (a daemon loaded behind a flood takes them in for longer than any fixed
hold would allow: a bye written before its client's last records), or after BYE_HOLD_MAX_S in all. The forensics stage knows of the bye when it arrives, held or not (core.py).
"""
from __future__ import annotations

from typing import Any, Mapping

BYE_HOLD_S = 2.0
BYE_HOLD_MAX_S = 60.0


class HeldByes:
    """The byes waiting for their records: `hold` one as it arrives, `release` them as they are due."""

    def __init__(self) -> None:
        # [release by, records of its src in when last looked, release at the latest, bye]
        self._held: list[list] = []

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, bye: Any, src: Any, now: float) -> bool:
        """Hold `bye` if records of its client (`src`, the receiver's accounting of it) are still
        on their way; False: nothing is missing, write it now."""
        if src is None or src.transit() <= 0:
            return False
        self._held.append([now + BYE_HOLD_S, src.received, now + BYE_HOLD_MAX_S, bye])
        return True

    def release(self, now: float, sources: Mapping[int, Any], everything: bool = False) -> list:
        """The held byes due now, in the order they came: their records are all in, stopped
        coming for BYE_HOLD_S, or BYE_HOLD_MAX_S has passed (`everything`: all, at the drain)."""
        due, held, self._held = [], self._held, []
        for entry in held:
            until, seen, latest, bye = entry
            src = sources.get(bye.src)
            if src is not None and src.received != seen:     # its records still come: hold on
                entry[0], entry[1] = now + BYE_HOLD_S, src.received
            if everything or now >= entry[0] or now >= latest or src is None or src.transit() == 0:
                due.append(bye)
            else:
                self._held.append(entry)
        return due
