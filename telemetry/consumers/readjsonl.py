"""Reading what the daemon wrote: find a run's metrics files and stream their whole records.

A consumer may be pointed at the run dir (holding telemetry/metrics.jsonl) or at the telemetry
dir itself; both are accepted. The metrics may be rotated (metrics.jsonl.1, .2, ..., oldest
first) and the last line may be torn (a crash mid-write): whole lines are read in order, a
partial last line and lines that are not JSON objects are skipped and counted, never fatal.
Nothing is written: a report of a live run must not race the daemon's own repair.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

FILE_NAME = "metrics.jsonl"


def find_log_dir(path: str | Path) -> Path:
    """The directory holding metrics.jsonl (or its rotated pieces) for a run dir or telemetry dir.

    Raises FileNotFoundError with the places looked at when there is none.
    """
    path = Path(path)
    if path.is_file() and path.name.startswith(FILE_NAME):
        return path.parent
    candidates = [path, path / "telemetry"]
    for c in candidates:
        if (c / FILE_NAME).exists() or any(c.glob(FILE_NAME + ".*")):
            return c
    raise FileNotFoundError(f"no {FILE_NAME} in {' or '.join(str(c) for c in candidates)}")


def run_dir_of(log_dir: Path) -> Path:
    """The run dir: the telemetry dir's parent when the layout is <run>/telemetry/, else itself."""
    log_dir = log_dir.resolve()
    return log_dir.parent if log_dir.name == "telemetry" else log_dir


@dataclass
class ReadStats:
    """What a read skipped: torn last lines (one per file at most) and lines that are not records."""

    num_files: int = 0
    num_lines: int = 0
    num_torn: int = 0
    num_bad: int = 0


def read_records(log_dir: Path, stats: ReadStats | None = None) -> Iterator[dict]:
    """Every whole record of a run's metrics files, oldest first."""
    from telemetry.sinks.jsonl import rotated_files

    stats = stats if stats is not None else ReadStats()
    for path in rotated_files(Path(log_dir)):
        stats.num_files += 1
        try:
            f = open(path, "rb")
        except FileNotFoundError:  # rotated away between listing and opening
            continue
        with f:
            for line in f:
                if not line.endswith(b"\n"):
                    stats.num_torn += 1  # only a last line can lack its newline
                    break
                try:
                    rec = json.loads(line)
                except ValueError:
                    stats.num_bad += 1
                    continue
                if not isinstance(rec, dict) or not isinstance(rec.get("kind"), str):
                    stats.num_bad += 1
                    continue
                stats.num_lines += 1
                yield rec
