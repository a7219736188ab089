"""The daemon's inner loops in plain Python: the definition of what `_hotpath.c` computes.

Each function here has a twin of the same name and signature in the optional C extension
(`telemetry/daemon/_hotpath.c`); `hotpath.loops` is whichever runs. They are leaves: plain
inputs in (frames, decoded records, the records of closed steps), plain values out; they keep
no state, read no attribute of any class of ours but the records' fields, and know no metric
name. tests/test_hotpath.py keeps the twins equal on random input, value by value.

    read_frames(next_frame, empty, max_frames) -> list[bytes]
    tally(recs, metrics_type, bye_type, good_names) -> (all_metrics, num_byes, per_src, unknown)
    gather(groups) -> (ranks, t_ns, names, columns)
    reduce_column(column, op) -> values       (defined in reductions.py, with the column functions)
    rate_sums(counts, times) -> rates
    step_values(names, reduced) -> list[dict]
"""
from __future__ import annotations

from operator import truediv
from typing import Callable

from telemetry.daemon.reductions import reduce_column  # noqa: F401  (one of the twins)

# One row of tally's per-source accounting: (src, rank, count, min_seq, dropped_at_min, max_seq, max_dropped).
SrcRow = tuple[int, int, int, int, int, int, int]


def read_frames(next_frame: Callable[[], bytes], empty: type[BaseException], max_frames: int) -> list:
    """Call next_frame() until it raises `empty` or max_frames frames were read."""
    frames = []
    for _ in range(max_frames):
        try:
            frames.append(next_frame())
        except empty:
            break
    return frames


def tally(recs: list, metrics_type: type, bye_type: type,
          good_names: dict) -> tuple[bool, int, list[SrcRow], list[int]]:
    """The receiver's accounting of a batch of decoded records.

    Returns whether every record is a metrics record; how many are byes; per source (`src`), in
    order of first appearance, (src, rank, count, min_seq, dropped_at_min, max_seq,
    max_dropped) over the batch, where min_seq and dropped_at_min come from the first record
    with the lowest seq; and the indexes of the metrics records whose key set is not in
    `good_names` yet (their names are unchecked: the caller checks them and tallies again).
    """
    all_metrics = True
    num_byes = 0
    unknown: list[int] = []
    per_src: dict[int, list] = {}
    for i, rec in enumerate(recs):
        if type(rec) is metrics_type:
            if tuple(rec.values) not in good_names:
                unknown.append(i)
        else:
            all_metrics = False
            if type(rec) is bye_type:
                num_byes += 1
        row = per_src.get(rec.src)
        if row is None:
            per_src[rec.src] = [rec.src, rec.rank, 1, rec.seq, rec.dropped, rec.seq, rec.dropped]
            continue
        row[2] += 1
        if rec.seq < row[3]:
            row[3], row[4] = rec.seq, rec.dropped
        if rec.seq > row[5]:
            row[5] = rec.seq
        if rec.dropped > row[6]:
            row[6] = rec.dropped
    return all_metrics, num_byes, [tuple(row) for row in per_src.values()], unknown


def gather(groups: list[list]) -> tuple[list[tuple], list[int], list[tuple], dict[str, list]]:
    """Turn the records of closed steps (one list per step, in order of arrival) into columns.

    Returns, per step: its ranks (in order of first report), its time (the latest t_ns of its
    records) and its metric names (in order of first appearance); and one column per metric
    name over the steps: for each step, a tuple with one value per rank of that step (None:
    that rank did not log it), or None when no rank of the step logged that name. A rank that
    logged a step twice counts once; its later value of a name replaces the earlier one.
    """
    num_steps = len(groups)
    ranks_out: list[tuple] = []
    t_out: list[int] = []
    names_out: list[tuple] = []
    columns: dict[str, list] = {}
    for s, records in enumerate(groups):
        ranks = tuple(dict.fromkeys([rec.rank for rec in records]))
        keys = tuple(records[0].values)
        if len(ranks) == len(records) and [tuple(rec.values) for rec in records].count(keys) == len(records):
            # The usual case: each rank once, all with the same keys in the same order.
            cells = dict(zip(keys, zip(*[rec.values.values() for rec in records])))
        else:
            cells = _cells(records, ranks)
        for name, cell in cells.items():
            column = columns.get(name)
            if column is None:
                column = columns[name] = [None] * num_steps
            column[s] = cell
        ranks_out.append(ranks)
        t_out.append(max([rec.t_ns for rec in records]))
        names_out.append(tuple(cells))
    return ranks_out, t_out, names_out, columns


def _cells(records: list, ranks: tuple) -> dict[str, tuple]:
    """gather's cells of one step, value by value: name -> one value per rank (None: none)."""
    where = {rank: i for i, rank in enumerate(ranks)}
    cells: dict[str, list] = {}
    for rec in records:
        i = where[rec.rank]
        for name, value in rec.values.items():
            row = cells.get(name)
            if row is None:
                row = cells[name] = [None] * len(ranks)
            row[i] = value
    return {name: tuple(row) for name, row in cells.items()}


# Below 2**53 an int is a double exactly, so n / t in doubles is Python's n / t (the C twin's).
_EXACT_INT_LIMIT = 2**53
_INF = float("inf")


def rate_sums(counts: list, times: list) -> list:
    """Per pair of cells (one count and one time per rank of a step; MFU's tokens and step
    times): sum(count_i / time_i), or None where either cell is None or empty, or where a value
    is not a positive finite float or a positive int up to 2**53 (bools, NaN, 0: the caller
    goes value by value). Pairs as zip() makes them."""
    out = []
    for ns, ts in zip(counts, times):
        if ns is None or ts is None or not ns or not ts or not all(map(_positive_finite, ns)) \
                or not all(map(_positive_finite, ts)):
            out.append(None)
        else:
            out.append(sum(map(truediv, ns, ts)))
    return out


def _positive_finite(x) -> bool:
    if type(x) is float:
        return 0.0 < x < _INF
    return type(x) is int and 0 < x <= _EXACT_INT_LIMIT


def step_values(names: list[tuple], reduced: dict[str, list]) -> list[dict]:
    """Each step's values dict from the reduced columns (every name of every step has its
    column in `reduced`, one value per step), its metrics in its own order."""
    first = names[0] if names else ()
    if first and names.count(first) == len(names):     # every step has the same metrics (the usual case)
        rows = zip(*[reduced[name] for name in first])
        return [dict(zip(first, row)) for row in rows]
    return [{name: reduced[name][i] for name in step_names} for i, step_names in enumerate(names)]
