"""A zoomed step range, read again from the run's files: the store keeps a long run's series
thinned to its memory budget (store.py), the files keep every value.

    GET /api/range?run=ID&x0=A&x1=B&width=PX&key=K&key=K...

answers, for each step-axis key (`train/loss`, `acc`, a per-rank `train/loss@rank1`), its points
with A <= step <= B, downsampled per pixel column (a minimum and a maximum per column) to PX:
from the store where it holds the series whole, else from the run's metrics files. Those are
found through a small index (StepBlocks): per block of a file (BLOCK_BYTES), the smallest and
largest step of the `metrics` lines beginning in it, built the first time it is asked and
extended as the files grow (a rotated piece never changes). A range reads only the blocks whose
steps meet it, at most MAX_READ_BYTES per request (beyond, the answer says `truncated` and the
page keeps what the store has).
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import numpy as np

from protocol import output
from telemetry.consumers.series import last_per_x, minmax_downsample
from telemetry.shared import files
from telemetry.shared.jsonlines import rotated_files
from telemetry.shared.numbers import is_int, is_number, nonfinite_as_null

BLOCK_BYTES = 4 << 20
# What one request may read, in bytes and in seconds (beyond either: `truncated`, the page keeps
# what the store has); its points are downsampled as they come (memory: a few per pixel column).
MAX_READ_BYTES = 256 << 20
MAX_READ_S = 10.0
MAX_KEYS = 256
# A key's points are downsampled once they pass this many per pixel column.
POINTS_PER_BUCKET_HELD = 8
# The daemon writes a metrics record's kind, time and step first: {"kind":"metrics","t":...,"step":N,
# (a step is a 64-bit int: 19 digits at most; more is not the daemon's line, nor an int() to take)
_STEP = re.compile(rb'^\{"kind":"metrics","t":[^,]*,"step":(-?\d{1,19})[,}]')
_RANK = re.compile(r"^(.*)@rank(\d+)$")


class StepBlocks:
    """The index of one run's metrics files by step (module docstring). Thread-safe."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self._files: dict[str, dict] = {}     # name -> {"inode", "size" indexed, "blocks": [[off, end, lo, hi]]}
        self._lock = threading.Lock()

    def _update(self) -> list[tuple[Path, list]]:
        out = []
        for path in rotated_files(self.log_dir):
            try:
                f = files.open_regular(path)
            except OSError:
                continue
            with f:
                st = os.fstat(f.fileno())
                info = self._files.get(path.name)
                if info is None or info["inode"] != st.st_ino or st.st_size < info["size"]:
                    info = self._files[path.name] = {"inode": st.st_ino, "size": 0, "blocks": []}
                self._index(f, info, st.st_size)
            out.append((path, info["blocks"]))
        return out

    @staticmethod
    def _index(f, info: dict, size: int) -> None:
        """Index from info["size"] (a line start) to the last whole line before `size`."""
        pos = info["size"]
        while pos < size:
            f.seek(pos)
            data = f.read(min(BLOCK_BYTES, size - pos))
            end = data.rfind(b"\n") + 1
            if end == 0:
                if size - pos < BLOCK_BYTES:
                    return                       # a line being written: indexed next time
                # One line longer than a block: read on to its end.
                rest = b""
                while b"\n" not in rest:
                    more = f.read(BLOCK_BYTES)
                    if not more:
                        return
                    rest += more
                data += rest[:rest.index(b"\n") + 1]
                end = len(data)
            lo = hi = None
            for line in data[:end].split(b"\n"):
                m = _STEP.match(line)
                if m:
                    s = int(m.group(1))
                    lo = s if lo is None or s < lo else lo
                    hi = s if hi is None or s > hi else hi
            if lo is not None:
                info["blocks"].append([pos, pos + end, lo, hi])
            pos += end
            info["size"] = pos

    def read(self, x0: float, x1: float, want: set[str], max_bytes: int = MAX_READ_BYTES,
             num_buckets: int = 4096, max_s: float = MAX_READ_S) -> tuple[dict, bool, int]:
        """{key: (steps, values)} of the wanted keys within [x0, x1] from the files (at most a
        few points per one of num_buckets columns: each key's points are downsampled as they
        pile up), whether the read stopped at max_bytes or max_s, and the bytes read."""
        by_rank: dict[tuple[str, int | None], str] = {}
        for key in want:
            m = _RANK.match(key)
            by_rank[(m.group(1), int(m.group(2))) if m else (key, None)] = key
        names = {n for n, _ in by_rank}
        quoted = [b'"' + json.dumps(n)[1:-1].encode() + b'":' for n in names]
        got: dict[str, tuple[list, list]] = {k: ([], []) for k in want}
        held = POINTS_PER_BUCKET_HELD * num_buckets
        read = 0
        truncated = False
        deadline = time.monotonic() + max_s
        with self._lock:
            pieces = self._update()
        for path, blocks in pieces:
            hits = [b for b in blocks if b[3] >= x0 and b[2] <= x1]
            if not hits:
                continue
            try:
                f = files.open_regular(path)
            except OSError:
                continue
            with f:
                for off, end, _lo, _hi in hits:
                    if read + (end - off) > max_bytes or time.monotonic() > deadline:
                        truncated = True
                        break
                    f.seek(off)
                    data = f.read(end - off)
                    read += len(data)
                    for line in data.split(b"\n"):
                        m = _STEP.match(line)
                        if not m or not x0 <= int(m.group(1)) <= x1 or not any(q in line for q in quoted):
                            continue
                        rec = output.decode(line)
                        if rec is None:
                            continue
                        values, step = rec.get("values"), rec.get("step")
                        if not isinstance(values, dict) or not is_int(step):   # a hand-made line
                            continue
                        rank = rec.get("rank")
                        for name in names & values.keys():
                            key = by_rank.get((name, rank if isinstance(rank, int) else None))
                            v = values[name]
                            if key is not None and (v is None or is_number(v)):
                                xs, ys = got[key]
                                xs.append(step)
                                ys.append(np.nan if v is None else float(v))
                                if len(xs) > held:        # memory: a few points per pixel column
                                    got[key] = _thinned(xs, ys, num_buckets, x0, x1)
            if truncated:
                break
        return got, truncated, read


def _thinned(xs: list, ys: list, num_buckets: int, x0: float, x1: float) -> tuple[list, list]:
    """A key's points so far, downsampled on the request's columns (its whole range, so each
    column's extremes survive every later thinning)."""
    x, y = last_per_x(np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64))
    x, y = minmax_downsample(x, y, num_buckets, x_range=(x0, x1))
    return x.tolist(), y.tolist()


def downsampled(xs: list, ys: list, num_buckets: int) -> tuple[list, list]:
    """Points in step order, the last value of a step logged twice (a resumed run), a minimum and
    a maximum per pixel column; NaN (a gap) as None."""
    if not xs:
        return [], []
    x, y = last_per_x(np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64))
    x, y = minmax_downsample(x, y, num_buckets)
    return x.tolist(), nonfinite_as_null(y.tolist())
