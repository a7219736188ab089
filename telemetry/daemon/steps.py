"""StepBatch: the steps the aggregator closed together, as columns; what every later stage reads.

    steps    [120, 121, ...]                       the step numbers, in the order they closed
    t_ns     [t, ...]                              per step, the latest t_ns of its records
    ranks    [(0, 1, 2, 3), ...]                   per step, its ranks in order of first report
    names    [("train/loss", ...), ...]            per step, its metric names, first seen first
    columns  {"train/loss": [(2.1, 2.3, 2.0, 2.2), ...], ...}
             per metric, per step: one value per rank of that step (None: that rank did not
             log it), or None when no rank of the step logged it

Uniform steps (every rank logged the same keys) and the rest (ranks with different keys, a
rank that logged a step twice, one rank alone) have this same shape. The reductions across
ranks (reductions.py), the straggler view (aggregator.py), throughput and MFU (derived.py) are
each computed once from it.
"""
from __future__ import annotations

from dataclasses import dataclass

# The time and rank columns the straggler view, throughput and MFU read.
STEP_TIME = "perf/step_time"
TOKENS = "perf/tokens"
ATTN_DOC_LEN_SQ = "perf/attn_doc_len_sq"


@dataclass(slots=True)
class StepBatch:
    steps: list[int]
    t_ns: list[int]
    ranks: list[tuple[int, ...]]
    names: list[tuple[str, ...]]
    columns: dict[str, list[tuple | None]]

    def __len__(self) -> int:
        return len(self.steps)

    def column(self, name: str) -> list[tuple | None]:
        """The per-rank values of `name` for every step (None for a step without it)."""
        column = self.columns.get(name)
        return column if column is not None else [None] * len(self.steps)

    @classmethod
    def gather(cls, steps: list[int], groups: list[list], gather) -> "StepBatch":
        """Columns from the records of each closed step (`gather`: loops.gather or its C twin)."""
        ranks, t_ns, names, columns = gather(groups)
        return cls(steps=steps, t_ns=t_ns, ranks=ranks, names=names, columns=columns)
