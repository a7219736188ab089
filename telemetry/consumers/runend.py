"""Whether a run has ended, and how, from the records a consumer sees.

A run has ended when every rank that said hello has said bye (its client closed), or when a
`train_end` event came and no step after it. A rank saying hello again (a resumed run, into the
same daemon or a new one) is running again. The daemon's drain is not in the records: the
dashboard reads run.sh's drain.json, tail sees the PUB socket disconnect.
"""
from __future__ import annotations

from telemetry.shared.numbers import is_int


class RunEnd:
    def __init__(self) -> None:
        self.hello_ranks: set[int] = set()
        self.bye_ranks: set[int] = set()
        self.train_end_step: int | None = None
        self.last_step: int | None = None

    def consume(self, kind: str, rec: dict) -> None:
        rank = rec.get("rank")
        rank = rank if is_int(rank) else None
        if kind == "metrics":
            step = rec.get("step")
            if isinstance(step, int) and "rank" not in rec:
                self.last_step = step if self.last_step is None else max(self.last_step, step)
                if self.train_end_step is not None and step > self.train_end_step:
                    self.train_end_step = None   # resumed: the run goes on
        elif kind == "hello" and rank is not None:
            self.hello_ranks.add(rank)
            self.bye_ranks.discard(rank)
            self.train_end_step = None
        elif kind == "bye" and rank is not None:
            self.bye_ranks.add(rank)
        elif kind == "event" and rec.get("name") == "train_end":
            data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
            step = data.get("step")
            self.train_end_step = step if isinstance(step, int) else (self.last_step or 0)

    def how(self) -> str:
        """'' while the run goes on, else why it is over ('all 8 ranks closed; train_end at step 300')."""
        out = []
        if self.hello_ranks and self.hello_ranks <= self.bye_ranks:
            n = len(self.hello_ranks)
            out.append(f"all {n} ranks closed" if n > 1 else f"rank {next(iter(self.hello_ranks))} closed")
        if self.train_end_step is not None:
            out.append(f"train_end at step {self.train_end_step}")
        return "; ".join(out)
