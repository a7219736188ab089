"""Events once, with their ranks: every rank sends its own `checkpoint_saved` or `train_end`.

Eight ranks saving the same checkpoint are one thing that happened, not eight. An event joins
the latest group of the same name and the same data (the step, the path) when it comes within
MERGE_WINDOW_S of that group's first one; its rank is added to the group's ranks. Events with
different data (a diagnosis about rank 3 and one about rank 5) stay apart.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from telemetry.shared.numbers import is_int, is_number

# Ranks reach the same point within seconds of each other (a checkpoint save ends with a
# barrier); a repeat after this long is a new occurrence.
MERGE_WINDOW_S = 30.0


@dataclass
class EventGroup:
    """One occurrence of an event, from one or several ranks."""

    id: int
    name: str
    t: float | None
    data: dict
    ranks: list[int] = field(default_factory=list)
    num_records: int = 1

    @property
    def severity(self) -> str:
        return str(self.data.get("severity") or ("warning" if self.name.startswith("diagnosis/") else "info"))

    @property
    def message(self) -> str:
        msg = self.data.get("message")
        if msg:
            return str(msg)
        return " ".join(f"{k}={v}" for k, v in self.data.items())

    def ranks_text(self) -> str:
        """'rank 3', 'ranks 0-7' or 'ranks 0,2,5'; '' when no rank sent it (the daemon did)."""
        r = sorted(self.ranks)
        if not r:
            return ""
        if len(r) == 1:
            return f"rank {r[0]}"
        if r == list(range(r[0], r[-1] + 1)):
            return f"ranks {r[0]}-{r[-1]}"
        return "ranks " + ",".join(str(x) for x in r)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "t": self.t, "data": self.data, "ranks": sorted(self.ranks),
                "ranks_text": self.ranks_text(), "severity": self.severity, "message": self.message,
                "num_records": self.num_records}


def _data_key(data: dict) -> str:
    return json.dumps(data, sort_keys=True, default=str)


class EventGroups:
    """Feed event records with add(); each returns (group, is_new)."""

    def __init__(self) -> None:
        self.groups: list[EventGroup] = []
        self._latest: dict[tuple[str, str], EventGroup] = {}
        self.num_groups = 0   # ever made: the next group's id (forget_oldest keeps ids unique)

    def add(self, rec: dict) -> tuple[EventGroup, bool]:
        name = str(rec.get("name", ""))
        data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
        t = rec.get("t") if is_number(rec.get("t")) else None
        rank = rec.get("rank") if is_int(rec.get("rank")) else None
        key = (name, _data_key(data))
        g = self._latest.get(key)
        near = g is not None and (t is None or g.t is None or abs(t - g.t) <= MERGE_WINDOW_S)
        # A rank sending the same event twice is two occurrences, not one.
        if g is not None and near and (rank is None or rank not in g.ranks):
            g.num_records += 1
            if rank is not None:
                g.ranks.append(rank)
            return g, False
        g = EventGroup(id=self.num_groups, name=name, t=t, data=data, ranks=[] if rank is None else [rank])
        self.num_groups += 1
        self.groups.append(g)
        self._latest[key] = g
        return g, True

    def forget_oldest(self, num: int) -> list[EventGroup]:
        """Drop the `num` oldest groups (a consumer's memory bound); return them. A later event
        like one of them starts a new group."""
        gone, self.groups = self.groups[:num], self.groups[num:]
        for g in gone:
            key = (g.name, _data_key(g.data))
            if self._latest.get(key) is g:
                del self._latest[key]
        return gone
