"""Reading what the daemon wrote: find a run's metrics files and stream their whole records.

A consumer may be pointed at the run dir (holding telemetry/metrics.jsonl) or at the telemetry
dir itself; both are accepted. The metrics may be rotated (metrics.jsonl.1, .2, ..., oldest
first) and the last line may be torn (a crash mid-write): whole lines are read in order, a
partial last line and lines that are not JSON objects are skipped and counted, never fatal.
Nothing is written: a report of a live run must not race the daemon's own repair.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from protocol import output
from protocol.output import OutputRecord
from telemetry.shared import files
from telemetry.shared import jsonlines
from telemetry.shared.jsonlines import Lines

FILE_NAME = "metrics.jsonl"
# The chunk and line bounds (telemetry/shared/jsonlines.py), module globals here so that a test
# can set them for this reader alone.
READ_CHUNK_BYTES = jsonlines.READ_CHUNK_BYTES
MAX_LINE_BYTES = jsonlines.MAX_LINE_BYTES


class Unreadable(OSError):
    """A run's metrics file (or the directory holding them) is there but cannot be read: its
    mode, another user's run. Bad input, as a path that holds no run is: the commands that read
    a run say it in one line and exit 2."""

    def __str__(self) -> str:
        return f"{self.filename}: cannot read it ({self.strerror})"


def _unreadable(exc: OSError, path: Path) -> Unreadable:
    return Unreadable(exc.errno, exc.strerror or str(exc), exc.filename or os.fspath(path))


def find_log_dir(path: str | Path) -> Path:
    """The directory holding metrics.jsonl (or its rotated pieces) for a run dir or telemetry dir.

    Raises FileNotFoundError with the places looked at when there is none, and Unreadable naming
    the first metrics file (or directory) that is there but cannot be read: found here, before a
    command prints or serves anything, not as a traceback halfway through reading. A piece that
    is not a regular file is left to the reader, which skips and counts it.
    """
    path = Path(path)
    try:
        if path.is_file() and path.name.startswith(FILE_NAME):
            log_dir = path.parent
        else:
            candidates = [path, path / "telemetry"]
            log_dir = next((c for c in candidates if (c / FILE_NAME).exists() or any(c.glob(FILE_NAME + ".*"))),
                           None)
            if log_dir is None:
                raise FileNotFoundError(f"no {FILE_NAME} in {' or '.join(str(c) for c in candidates)}")
        pieces = jsonlines.rotated_files(log_dir)
    except PermissionError as exc:    # a directory on the way that may not be searched
        raise _unreadable(exc, path) from None
    for piece in pieces:
        try:
            files.open_regular(piece).close()
        except (FileNotFoundError, files.NotRegularFile):   # rotated away meanwhile; a FIFO
            continue
        except OSError as exc:
            raise _unreadable(exc, piece) from None
    return log_dir


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
    num_not_regular: int = 0    # a FIFO, device or directory at a metrics file's name: not read
    num_bytes: int = 0          # read so far, whole lines or not (a progress line's measure)


def _parse(line: bytes, stats: ReadStats) -> OutputRecord | dict | None:
    rec = output.decode(line)
    if rec is None:
        stats.num_bad += 1
        return None
    stats.num_lines += 1
    return rec


def read_records(log_dir: Path, stats: ReadStats | None = None,
                 on_chunk: Callable[[], None] | None = None) -> Iterator[OutputRecord | dict]:
    """Every whole record of a run's metrics files, oldest first. on_chunk: called after each
    chunk read (READ_CHUNK_BYTES), when stats.num_bytes has grown: a progress line."""
    from telemetry.shared.jsonlines import rotated_files

    stats = stats if stats is not None else ReadStats()
    for path in rotated_files(Path(log_dir)):
        yield from _file_records(path, stats, on_chunk)


def history_bytes(log_dir: Path | None) -> int:
    """The size of a run's metrics files (rotated pieces and metrics.jsonl) now; 0 for None."""
    from telemetry.shared.jsonlines import rotated_files

    if log_dir is None:
        return 0
    total = 0
    for path in rotated_files(Path(log_dir)):
        try:
            total += path.stat().st_size
        except OSError:
            pass
    return total


def _Lines(stats: ReadStats) -> Lines:
    """Whole lines out of a file's chunks (telemetry/shared/jsonlines.py), at most MAX_LINE_BYTES each."""
    return Lines(stats, MAX_LINE_BYTES)


def _records_of_lines(lines: list[bytes], stats: ReadStats) -> Iterator[OutputRecord | dict]:
    for line in lines:
        if len(line) > MAX_LINE_BYTES:
            stats.num_bad += 1
            continue
        rec = _parse(line, stats)
        if rec is not None:
            yield rec


def _file_records(path: Path, stats: ReadStats,
                  on_chunk: Callable[[], None] | None = None) -> Iterator[OutputRecord | dict]:
    """The whole records of one file."""
    stats.num_files += 1
    try:
        f = files.open_regular(path)   # a FIFO there never blocks the reader, /dev/zero never fills it
    except FileNotFoundError:  # rotated away between listing and opening
        return
    except files.NotRegularFile:
        stats.num_not_regular += 1
        return
    except OSError as exc:   # made unreadable since find_log_dir looked
        raise _unreadable(exc, path) from None
    lines = _Lines(stats)
    with f:
        while chunk := f.read(READ_CHUNK_BYTES):
            stats.num_bytes += len(chunk)
            if on_chunk is not None:
                on_chunk()
            yield from _records_of_lines(lines.feed(chunk), stats)
    if lines.partial or lines.skipping:
        stats.num_torn += 1  # only a last line can lack its newline


class Follower:
    """The records of a run's metrics as they are written: everything so far on the first
    poll() (rotated pieces oldest first, then metrics.jsonl), then what was appended since.

    A line without its newline yet is kept back until it is whole (the daemon writes whole
    lines, but a reader can catch one mid-write). When the daemon rotates metrics.jsonl, the
    rest of the old file is read before the new one. Lines that are not records are counted
    in stats.num_bad. Nothing is written. A file that can no longer be read (its mode, its
    directory's) raises Unreadable from poll(); a later poll tries again from where it was.
    """

    def __init__(self, log_dir: Path, stats: ReadStats | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.stats = stats if stats is not None else ReadStats()
        self._file = None
        self._inode: int | None = None
        self._lines = _Lines(self.stats)
        self._started = False
        self._not_regular = False

    def _read_open_file(self) -> Iterator[OutputRecord | dict]:
        while chunk := self._file.read(READ_CHUNK_BYTES):
            yield from _records_of_lines(self._lines.feed(chunk), self.stats)

    def _open_current(self) -> bool:
        try:
            f = files.open_regular(self.log_dir / FILE_NAME)
        except FileNotFoundError:
            return False
        except files.NotRegularFile:     # counted once, then looked at again as if absent
            if not self._not_regular:
                self._not_regular = True
                self.stats.num_not_regular += 1
            return False
        except OSError as exc:
            raise _unreadable(exc, self.log_dir / FILE_NAME) from None
        self._file, self._inode, self._lines = f, os.fstat(f.fileno()).st_ino, _Lines(self.stats)
        self.stats.num_files += 1
        return True

    def poll(self) -> list[OutputRecord | dict]:
        return list(self.records())

    def records(self) -> Iterator[OutputRecord | dict]:
        """What poll() returns, one record at a time (a long history is never a list in memory)."""
        if not self._started:
            self._started = True
            from telemetry.shared.jsonlines import rotated_files

            for path in rotated_files(self.log_dir):
                if path.name != FILE_NAME:
                    yield from _file_records(path, self.stats)
        if self._file is None and not self._open_current():
            return
        yield from self._read_open_file()
        try:
            inode = os.stat(self.log_dir / FILE_NAME).st_ino
        except FileNotFoundError:
            inode = None
        except OSError as exc:    # the directory made unsearchable, replaced by a file; a symlink loop
            raise _unreadable(exc, self.log_dir / FILE_NAME) from None
        if inode != self._inode:  # rotated: the old file is complete, go on with the new one
            yield from self._read_open_file()
            if self._lines.partial or self._lines.skipping:
                self.stats.num_torn += 1
            self._file.close()
            self._file = None
            if self._open_current():
                yield from self._read_open_file()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

