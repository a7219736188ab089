"""Whole lines out of the chunks of a JSON-lines file (metrics.jsonl), never a line held whole
beyond a bound: what the consumers (telemetry/consumers/readjsonl.py) and the daemon's goodput
stage (reading the files a restarted daemon finds) both read it with."""
from __future__ import annotations

from pathlib import Path
from typing import Any

# The daemon's output file in its log directory; rotated pieces are FILE_NAME.1, .2, ... (oldest
# first), written by the JSONL sink (telemetry/daemon/sinks/jsonl.py).
FILE_NAME = "metrics.jsonl"

# Files are read in chunks, never whole. A line longer than MAX_LINE_BYTES is not one of the
# daemon's records (a frame is at most 1 MiB of msgpack; its JSON line a few times that): it is
# skipped and counted, never held whole.
READ_CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 16 << 20


class Lines:
    """Whole lines out of chunks of a file, each at most `max_line_bytes`; the rest of a line
    longer than that is skipped (counted in stats.num_bad once its end comes). `stats`: any
    object with an int `num_bad`."""

    def __init__(self, stats: Any, max_line_bytes: int) -> None:
        self.stats = stats
        self.max_line_bytes = max_line_bytes
        self.partial = b""      # the start of a line whose newline has not come yet
        self.skipping = False   # inside a line too long to keep

    def feed(self, chunk: bytes) -> list[bytes]:
        if self.skipping:
            end = chunk.find(b"\n")
            if end < 0:
                return []
            chunk, self.skipping = chunk[end + 1:], False
            self.stats.num_bad += 1
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()  # b"" after a whole last line
        if len(self.partial) > self.max_line_bytes:
            self.partial, self.skipping = b"", True
        return lines


def rotated_files(log_dir: Path) -> list[Path]:
    """All pieces of a run's metrics, oldest first: metrics.jsonl.1, .2, ..., metrics.jsonl."""
    pieces = []
    for p in Path(log_dir).glob(FILE_NAME + ".*"):
        suffix = p.name[len(FILE_NAME) + 1:]
        if suffix.isdigit():
            pieces.append((int(suffix), p))
    out = [p for _, p in sorted(pieces)]
    current = Path(log_dir) / FILE_NAME
    if current.exists():
        out.append(current)
    return out
