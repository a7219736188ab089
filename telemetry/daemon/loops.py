"""The daemon's inner loops in plain Python: the definition of what `_hotpath.c` computes.

Each function here has a twin of the same name and signature in the optional C extension
(`telemetry/daemon/_hotpath.c`); `hotpath.loops` is whichever runs. They are leaves: plain
inputs in (frames, decoded records, the records of closed steps), plain values out; they keep
no state, read no attribute of any class of ours but the records' fields, and know no metric
name. tests/test_hotpath.py keeps the twins equal on random input, value by value. This module
holds exactly the twins (hotpath.TWINS); a loop without a C twin lives with its user.

    read_frames_upto(next_frame, empty, max_frames, max_bytes) -> (list[bytes], their bytes)
    read_ring(ring, r, out, max_frames, max_bytes, max_frame) -> (read position, frames, bytes)
    decode_frames(frames, decode, metrics_type, limits, cache) -> list of records
    tally(recs, metrics_type, bye_type, good_names) -> (all_metrics, num_byes, per_src, unknown)
    gather(groups) -> (ranks, t_ns, names, columns)
    reduce_column(column, op) -> values
    rate_sums(counts, times) -> rates
    phase_straggler(columns, step_times, ranks, values, floor_fraction, keys) -> None

reduce_column is defined in reductions.py, beside the column functions it dispatches to (one
definition of each reduction, which the per-value path uses too), and named here so that this
module and the C extension offer the same set.
"""
from __future__ import annotations

import math
from operator import truediv
from typing import Callable

from telemetry.daemon.reductions import reduce_column  # noqa: F401  (one of the twins)
from telemetry.shared.numbers import EXACT_INT_LIMIT

def read_frames_upto(next_frame: Callable[[], bytes], empty: type[BaseException], max_frames: int,
                     max_bytes: int) -> tuple[list, int]:
    """Call next_frame() until it raises `empty`, max_frames frames were read, or their lengths
    reached max_bytes (the frame that reaches it is kept); return the frames and their lengths'
    sum. What a read holds at once is then at most max_bytes plus one frame."""
    frames = []
    total = 0
    for _ in range(max_frames):
        if total >= max_bytes:
            break
        try:
            frame = next_frame()
        except empty:
            break
        frames.append(frame)
        total += len(frame)
    return frames, total


# A record ring's layout (telemetry/shared/ring.py): the header's bytes, where its capacity and its
# write and read positions are, a record's head, the length that marks a wrap.
RING_HEADER, RING_CAPACITY_AT, RING_WPOS_AT, RING_RPOS_AT, RING_RECORD_HEAD, RING_SKIP = 256, 8, 64, 128, 8, 0xFFFFFFFF
RING_RCOUNT_AT = 136                    # the records read (the writer's bound counts with it)


def read_ring(ring, r: int, out: list, max_frames: int, max_bytes: int, max_frame: int) -> tuple[int, int, int]:
    """Frames of a record ring (a writable buffer over one: telemetry/shared/ring.py) from read
    position `r`: appended to `out` until the write position, `max_frames`, or their lengths
    reach `max_bytes` (the frame that reaches it is kept). The records read are added to the
    ring's count of them and the new read position stored (after the frames are copied out: the
    writer may then reuse their room), and returned with how many frames and bytes were read. Raises ValueError, the read position
    stored at the last good record, on positions or a length no writer makes (a length above
    `max_frame`, a record past the write position or the ring's end)."""
    m = memoryview(ring).cast("B")
    cap = int.from_bytes(m[RING_CAPACITY_AT:RING_CAPACITY_AT + 8], "little")
    w = int.from_bytes(m[RING_WPOS_AT:RING_WPOS_AT + 8], "little")
    start = r
    taken = size = 0
    try:
        if cap == 0 or len(m) != RING_HEADER + cap or w < r or w - r > cap:
            raise ValueError(f"write position {w}, read position {r}, capacity {cap}")
        while r < w and taken < max_frames and size < max_bytes:
            off = r % cap
            at = RING_HEADER + off
            n = int.from_bytes(m[at:at + 4], "little")
            if n == RING_SKIP:
                r += cap - off
                continue
            rec = RING_RECORD_HEAD + ((n + 7) & ~7)
            if n > max_frame or off + rec > cap or r + rec > w:
                raise ValueError(f"a record of {n} bytes at {r} (write position {w})")
            out.append(m[at + RING_RECORD_HEAD:at + RING_RECORD_HEAD + n].tobytes())
            r += rec
            taken += 1
            size += n
    finally:
        if taken:
            count = int.from_bytes(m[RING_RCOUNT_AT:RING_RCOUNT_AT + 8], "little") + taken
            m[RING_RCOUNT_AT:RING_RCOUNT_AT + 8] = (count & (1 << 64) - 1).to_bytes(8, "little")
        if r != start:
            m[RING_RPOS_AT:RING_RPOS_AT + 8] = r.to_bytes(8, "little")
    return r, taken, size


def decode_frames(frames: list, decode: Callable, metrics_type: type, limits: tuple, cache: list) -> list:
    """Each frame's record, decode(frame) of each (raising what it raises for a bad one).

    The C twin reads the metrics frames that have the shape every client writes by hand (the
    header's bounds, `metrics_type`'s fields in order, limits = (max rank, max values, max
    parts)) and the rest with decode, for the same records; it keeps the names of the last
    records of a few key sets in `cache` (a list the caller keeps between calls), so that a
    record with the same names takes those str objects instead of decoding its own. Here:
    decode, and no cache."""
    return list(map(decode, frames))


def tally(recs: list, metrics_type: type, bye_type: type,
          good_names: dict) -> tuple[bool, int, list[tuple], list[int]]:
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
_EXACT_INT_LIMIT = EXACT_INT_LIMIT   # (telemetry.shared.numbers.positive_finite, inlined below)
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


def phase_straggler(columns: list, step_times: list | None, ranks: list, values: list,
                    floor_fraction: float, keys: tuple) -> None:
    """Per step, the slowest rank of the phase most likely to be the cause (straggler_view.py
    says why), written into that step's dict of `values`.

    columns         [(phase index, column), ...] in the order causes are looked for; a column
                    is a StepBatch column (per step a tuple with one value per rank, or None)
    step_times      the step time column, or None
    ranks           per step, the tuple of its ranks (StepBatch.ranks)
    floor_fraction  an excess at least this fraction of the step's time is significant
    keys            the four names written: phase index, rank, median, excess

    A value counts if it is an int or a float (not a bool) that is finite as a float; anything
    else (None, NaN, inf, an int past the float range, bools, other types) is as if not logged.
    A phase's counted values are paired with the step's ranks as zip() pairs them; with two or
    more: t_slow is the largest, the median is that of the others (n = count - 1: the middle
    one for odd n, the mean of the two middle ones for even n), excess = t_slow - median, all as
    floats; the slowest rank is the first (in the step's rank order) whose value is t_slow. The
    floor is floor_fraction * the largest counted step time of the step (0.0 without one). The
    cause is the first phase of `columns` with floor > 0 and excess >= floor, else the phase
    with the largest excess (the first of equal ones); with no phase of two counted values the
    step gets nothing. A column shorter than the steps has None for the steps past its end; a
    cell that is neither a tuple nor None, or a step's ranks that are not a tuple, raise
    TypeError (the steps before it have their values). Writes, where there is a pick:
    keys[0] the phase index (as given), keys[1] the rank (the object in `ranks`), keys[2] the
    median, keys[3] the excess.
    """
    k_phase, k_rank, k_median, k_excess = keys
    for i, (v, step_ranks) in enumerate(zip(values, ranks)):
        if not isinstance(step_ranks, tuple):
            raise TypeError("phase_straggler: a step's ranks are not a tuple")
        step, _ = _counted(_cell(step_times, i), None)
        floor = floor_fraction * max(step) if step else 0.0
        pick = None                                   # (phase index, rank, median, excess)
        for phase, column in columns:
            times, where = _counted(_cell(column, i), step_ranks)
            if len(times) < 2:
                continue
            ordered = sorted(times)                   # stable: equal floats (0.0, -0.0) keep their order
            n = len(ordered) - 1                      # the others: all but the slowest
            t_slow, mid = ordered[n], n // 2
            median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
            excess = t_slow - median
            significant = floor > 0 and excess >= floor
            if significant or pick is None or excess > pick[3]:
                pick = (phase, where[times.index(t_slow)], median, excess)
            if significant:
                break
        if pick is not None:
            v[k_phase], v[k_rank], v[k_median], v[k_excess] = pick


def _cell(column: list | None, i: int):
    """Step i's cell of a column; None without the column or past its end."""
    return column[i] if column is not None and i < len(column) else None


_FLOAT = {float}


def _counted(cell, ranks: tuple | None) -> tuple:
    """The counted values of a cell as floats (phase_straggler's docstring) and their ranks,
    paired as zip() pairs them (ranks None: every value of the cell, the ranks not wanted)."""
    if cell is None:
        return (), ()
    if not isinstance(cell, tuple):
        raise TypeError("phase_straggler: a cell is neither a tuple nor None")
    if set(map(type, cell)) == _FLOAT and math.isfinite(sum(cell)) and (ranks is None or len(cell) == len(ranks)):
        return cell, ranks          # the usual case, in C-level builtins: every value a finite float
    times, where = [], []
    for x, r in zip(cell, cell if ranks is None else ranks):
        if isinstance(x, float) or (isinstance(x, int) and not isinstance(x, bool)):
            try:
                t = float(x)
            except OverflowError:   # an int past the float range
                continue
            if math.isfinite(t):
                times.append(t)
                where.append(r)
    return times, where
