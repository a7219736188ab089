"""metrics.jsonl: the source of truth. Whole lines only, appended, fsynced on an interval.

- Opened with O_APPEND; a restarted daemon appends to the same file.
- A torn last line (a crash mid-write) is cut off at start, before anything is appended.
- A write that fails part-way (disk full) is undone with ftruncate to the last whole line, so
  the file never holds a partial line; the batch is counted as dropped by the runner.
- fsync runs on its own interval; an fsync error is counted and reported, never retried as if
  the data were safe (after a failed fsync the kernel may have dropped the dirty pages).
- Size-based rotation: metrics.jsonl -> metrics.jsonl.1, .2, ... (oldest first).
"""
from __future__ import annotations

import logging
import os
import time
from operator import attrgetter
from pathlib import Path

from telemetry.daemon.sinks.base import Out, Sink, StartupError
from telemetry.shared import files

_line = attrgetter("line")
log = logging.getLogger("telemetry.daemon.sinks.jsonl")

FILE_NAME = "metrics.jsonl"


def repair_torn_tail(path: Path) -> int:
    """Cut a partial last line off `path`; return the number of bytes removed."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # Walk back to the last newline in blocks.
        pos = size
        block = 64 * 1024
        keep = 0
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        f.truncate(keep)
        return size - keep


def rotated_files(log_dir: Path) -> list[Path]:
    """All pieces of a run's metrics, oldest first: metrics.jsonl.1, .2, ..., metrics.jsonl."""
    pieces = []
    for p in log_dir.glob(FILE_NAME + ".*"):
        suffix = p.name[len(FILE_NAME) + 1:]
        if suffix.isdigit():
            pieces.append((int(suffix), p))
    out = [p for _, p in sorted(pieces)]
    current = log_dir / FILE_NAME
    if current.exists():
        out.append(current)
    return out


class JsonlSink(Sink):
    name = "jsonl"

    def __init__(self, log_dir: str | Path, fsync_interval_s: float = 5.0, rotate_bytes: int = 0) -> None:
        self.log_dir = Path(log_dir)
        self.path = self.log_dir / FILE_NAME
        self.fsync_interval_s = fsync_interval_s
        self.rotate_bytes = rotate_bytes
        self._fd = -1
        self._offset = 0
        self._next_fsync = 0.0
        self._dirty = False
        self.num_lines = 0
        self.num_bytes = 0
        self.num_fsync_errors = 0
        self.num_write_errors = 0
        self.num_repaired_bytes = 0
        self.num_rotations = 0
        # Checked here, on the daemon's thread before it says "ready": without its source of
        # truth the daemon must not run (the sink's own thread would only count drops).
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            os.close(files.open_fd(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
        except OSError as exc:
            raise StartupError(f"cannot open {self.path} for writing ({exc.strerror}); it is the run's "
                               f"source of truth") from None

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.num_repaired_bytes = repair_torn_tail(self.path)
        if self.num_repaired_bytes:
            log.warning("%s: cut a torn last line of %d bytes", self.path, self.num_repaired_bytes)
        self._open()
        self._next_fsync = time.monotonic() + self.fsync_interval_s

    def _open(self) -> None:
        self._fd = files.open_fd(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)   # 0600 unless configured
        self._offset = os.fstat(self._fd).st_size

    def consume(self, batch: list[Out]) -> None:
        data = b"\n".join(map(_line, batch)) + b"\n"
        start = self._offset
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError:
            self.num_write_errors += 1
            # Undo the part that made it, so no reader ever sees a partial line.
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise
        self._offset = start + len(data)
        self._dirty = True
        self.num_lines += len(batch)
        self.num_bytes += len(data)
        if self.rotate_bytes and self._offset >= self.rotate_bytes:
            self._rotate()

    def _rotate(self) -> None:
        self._fsync()
        os.close(self._fd)
        n = 1 + max((int(p.name.rsplit(".", 1)[1]) for p in self.log_dir.glob(FILE_NAME + ".*")
                     if p.name.rsplit(".", 1)[1].isdigit()), default=0)
        os.rename(self.path, self.log_dir / f"{FILE_NAME}.{n}")
        self.num_rotations += 1
        self._open()

    def flush(self) -> None:
        # os.write already handed the bytes to the kernel; durability is fsync's job.
        if self._dirty and time.monotonic() >= self._next_fsync:
            self._fsync()

    def _fsync(self) -> None:
        if not self._dirty:
            return
        try:
            os.fsync(self._fd)
            self._dirty = False
        except OSError as exc:
            # Never retry as if it succeeded: the dirty pages may be gone. Count and report.
            self.num_fsync_errors += 1
            self._dirty = False
            log.error("fsync of %s failed: %r; data since the last fsync may not be durable", self.path, exc)
        self._next_fsync = time.monotonic() + self.fsync_interval_s

    def close(self) -> None:
        if self._fd >= 0:
            self._fsync()
            os.close(self._fd)
            self._fd = -1

    def stats(self) -> dict:
        return {"lines": self.num_lines, "bytes": self.num_bytes, "fsync_errors": self.num_fsync_errors,
                "write_errors": self.num_write_errors, "repaired_bytes": self.num_repaired_bytes,
                "rotations": self.num_rotations, "path": str(self.path)}
