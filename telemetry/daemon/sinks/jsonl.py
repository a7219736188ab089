"""metrics.jsonl: the source of truth. Whole lines only, appended, fsynced on an interval.

- Opened with O_APPEND; a restarted daemon appends to the same file.
- A torn last line (a crash mid-write) is cut off at start, before anything is appended.
- A write that fails part-way (disk full) is undone with ftruncate to the last whole line, so
  the file never holds a partial line; the batch is counted as dropped by the runner.
- fsync runs on its own interval; an fsync error is counted and reported, never retried as if
  the data were safe (after a failed fsync the kernel may have dropped the dirty pages).
- Size-based rotation: metrics.jsonl -> metrics.jsonl.1, .2, ... (oldest first). The file is
  renamed while it is still open, and the old descriptor is closed only once the new file is
  open: a failed rotation keeps writing to the old file, never to a closed descriptor's number
  (which the process may have reused for a socket since).
- The file deleted or moved under the daemon (the run directory removed mid-run) is noticed on
  the flush timer (its inode is no longer the one at the path): the file is created again at its
  path if the directory is still there; lines written into a deleted file since the last look
  are counted as dropped (they went with it); with no directory, every batch is counted as
  dropped until one comes back. Logged once each.
- The loss accounting's checkpoint (sources.json) is written here, tied to the lines
  (telemetry/daemon/continuity.py): while records flow the daemon hands this sink its accounting
  as of the records it had handed out (`checkpoint`, with the number of records this sink's queue
  had taken by then); once their lines are written, sources.json is replaced with it and the
  offset where they end (`jsonl`: inode, device, end). So sources.json never counts a record the
  file does not hold, and a daemon that follows this one on the directory moves aside what lies
  past that offset (written after the last checkpoint: counted lost, so the counts are exact).
- A full disk: a small reserve file is allocated at start; at close, the last daemon record a
  full disk refused (at a drain, the final counters) is written in the room it frees, and
  `release_reserve` lets the daemon write drain.json there too.
"""
from __future__ import annotations

import errno
import logging
import os
import time
from collections import deque
from operator import attrgetter
from pathlib import Path

import msgspec

from telemetry.daemon.sinks.base import Out, Sink, StartupError
from telemetry.shared import files
from telemetry.shared.jsonlines import FILE_NAME

_line = attrgetter("line")
log = logging.getLogger("telemetry.daemon.sinks.jsonl")

# Room held on the log directory's file system for the final record and drain.json (a few KB
# each) when the disk fills; released only at the end.
RESERVE_NAME = ".telemetry-reserve"
RESERVE_BYTES = 64 * 1024


def make_reserve(log_dir: Path) -> bool:
    """Allocate the reserve file (blocks really allocated, not a sparse file); False if not."""
    path = Path(log_dir) / RESERVE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
        return True
    except OSError as exc:
        log.warning("cannot reserve %d bytes in %s for the final counters (%s): on a full disk they "
                    "may go to stderr only", RESERVE_BYTES, log_dir, exc.strerror or exc)
        try:
            path.unlink()
        except OSError:
            pass
        return False


def release_reserve(log_dir: Path) -> bool:
    """Free the reserve's room (for the last writes on a full disk); True if there was one."""
    try:
        (Path(log_dir) / RESERVE_NAME).unlink()
        return True
    except OSError:
        return False


def whole_lines_end(f, size: int) -> int:
    """Where the whole lines of the file open as `f` (binary, `size` bytes) end: past its last
    newline (0 without one). Reads its last byte, and walks back in blocks only past a torn line."""
    if size == 0:
        return 0
    f.seek(size - 1)
    if f.read(1) == b"\n":
        return size
    pos = size
    block = 64 * 1024
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        i = f.read(pos - start).rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def repair_torn_tail(path: Path) -> int:
    """Cut a partial last line off `path`; return the number of bytes removed."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        keep = whole_lines_end(f, size)
        if keep != size:
            f.truncate(keep)
        return size - keep


class JsonlSink(Sink):
    name = "jsonl"

    def __init__(self, log_dir: str | Path, fsync_interval_s: float = 5.0, rotate_bytes: int = 0,
                 sources_file: str = "sources.json") -> None:
        self.log_dir = Path(log_dir)
        self.path = self.log_dir / FILE_NAME
        self.sources_path = self.log_dir / sources_file
        # (records this sink's queue had taken when it was made, the snapshot), oldest first: from
        # the daemon's thread (checkpoint); and the records handed to consume() so far.
        self._checkpoints: deque = deque(maxlen=256)     # (a later one says all an earlier one does)
        self._consumed = 0
        self.num_checkpoints = 0
        self.num_checkpoint_errors = 0
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
        self.num_rotation_errors = 0
        self.num_reopened = 0             # the file created again at its path after it went
        self.num_lines_lost = 0           # written into a file deleted since (in num_dropped too)
        self.num_final_rescued = 0        # daemon records written at close in the reserve's room
        self._lines_in_file = 0           # written by this daemon into the open file
        self._retry_rotation_at = 0       # offset at which a failed rotation is tried again
        self._unwritten_daemon_line = b""  # the last daemon record a failed write refused
        self._warned: set[str] = set()
        # Checked here, on the daemon's thread before it says "ready": without its source of
        # truth the daemon must not run (the sink's own thread would only count drops).
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            os.close(files.open_fd(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
        except OSError as exc:
            raise StartupError(f"cannot open {self.path} for writing ({exc.strerror}); it is the run's "
                               f"source of truth") from None
        make_reserve(self.log_dir)

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.num_repaired_bytes += repair_torn_tail(self.path)     # (+: the daemon may have cut one already)
        if self.num_repaired_bytes:
            log.warning("%s: cut a torn last line of %d bytes", self.path, self.num_repaired_bytes)
        self._open()
        self._next_fsync = time.monotonic() + self.fsync_interval_s

    def _open(self) -> None:
        self._fd = files.open_fd(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)   # 0600 unless configured
        self._offset = os.fstat(self._fd).st_size

    def checkpoint(self, position: int, snapshot: dict) -> None:
        """The daemon's accounting as of the first `position` records its queue took: written as
        sources.json once their lines are (thread-safe: called on the daemon's thread)."""
        self._checkpoints.append((position, snapshot))

    def consume(self, batch: list[Out]) -> None:
        before = self._consumed
        self._consumed = before + len(batch)
        checkpoint = self._due_checkpoint() if self._checkpoints else None
        data = b"\n".join(map(_line, batch)) + b"\n"
        start = self._offset
        try:
            if self._fd < 0:                   # its directory went (see _check_file)
                raise FileNotFoundError(f"{self.path}: its directory is gone")
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError:
            self.num_write_errors += 1
            self._keep_daemon_line(batch)
            # Undo the part that made it, so no reader ever sees a partial line.
            if self._fd >= 0:
                try:
                    os.ftruncate(self._fd, start)
                except OSError:
                    pass
            raise
        self._offset = start + len(data)
        self._dirty = True
        if checkpoint is not None:
            position, snapshot = checkpoint
            lines_before = min(len(batch), max(0, position - before))
            self._write_checkpoint(snapshot, start + sum(map(len, map(_line, batch[:lines_before]))) + lines_before)
        self.num_lines += len(batch)
        self.num_bytes += len(data)
        self._lines_in_file += len(batch)
        if self._unwritten_daemon_line and any(o.kind == "daemon" for o in batch):
            self._unwritten_daemon_line = b""      # a newer one made it: the kept one is stale
        if self.rotate_bytes and self._offset >= max(self.rotate_bytes, self._retry_rotation_at):
            self._rotate()

    def _due_checkpoint(self) -> tuple[int, dict] | None:
        """The latest checkpoint whose records are all in what consume() has been handed."""
        due = None
        queue = self._checkpoints
        while queue and queue[0][0] <= self._consumed:
            due = queue.popleft()
        return due

    def _write_checkpoint(self, snapshot: dict, end: int) -> None:
        """sources.json: `snapshot` and where the lines it counts end in the open file."""
        if self._fd < 0:
            return
        try:
            st = os.fstat(self._fd)
            files.write_file(self.sources_path, msgspec.json.encode(
                {**snapshot, "jsonl": {"ino": st.st_ino, "dev": st.st_dev, "end": end}}) + b"\n")
            self.num_checkpoints += 1
        except OSError as exc:
            self.num_checkpoint_errors += 1
            self._warn_once("checkpoint", "cannot write %s (%r): a daemon restarted on this directory counts "
                            "from the last one written", self.sources_path, exc)

    def _keep_daemon_line(self, batch: list[Out]) -> None:
        for o in reversed(batch):
            if o.kind == "daemon":
                self._unwritten_daemon_line = o.line
                return

    def _rotate(self) -> None:
        """Rename the open file to the next piece, open a new one, then close the old: whatever
        fails, self._fd stays a descriptor this sink holds open (the old file's, on failure)."""
        self._fsync()
        old_fd = self._fd
        try:
            n = 1 + max((int(p.name.rsplit(".", 1)[1]) for p in self.log_dir.glob(FILE_NAME + ".*")
                         if p.name.rsplit(".", 1)[1].isdigit()), default=0)
            os.rename(self.path, self.log_dir / f"{FILE_NAME}.{n}")
        except OSError as exc:
            # Keep appending to the file as it is; try again once it has grown by another piece.
            self.num_rotation_errors += 1
            self._retry_rotation_at = self._offset + self.rotate_bytes
            self._warn_once("rotate", "cannot rotate %s (%r): writing on to it, counted in rotation_errors",
                            self.path, exc)
            return
        self.num_rotations += 1
        self._retry_rotation_at = 0
        try:
            self._open()
        except OSError as exc:
            # The old file, renamed, still takes the lines; the flush timer's look creates the
            # file again at its path (_check_file).
            self._fd = old_fd
            self._warn_once("rotate-open", "cannot open a new %s after rotating (%r): writing on to the "
                            "rotated piece", self.path, exc)
            return
        self._lines_in_file = 0
        os.close(old_fd)

    def flush(self) -> None:
        self._check_file()
        if self._checkpoints:                  # one made while nothing more came: all written
            due = self._due_checkpoint()
            if due is not None:
                self._write_checkpoint(due[1], self._offset)
        # os.write already handed the bytes to the kernel; durability is fsync's job.
        if self._dirty and time.monotonic() >= self._next_fsync:
            self._fsync()

    def _check_file(self) -> None:
        """On the flush timer, never per record: is the open file still the one at its path? If
        it was deleted, every line this daemon wrote into it went with it (dropped); if
        moved, it is kept where it went. Either way the next lines go to a file at the path,
        created again, or are dropped (counted by the runner) while its directory is gone."""
        if self._fd >= 0:
            try:
                st = os.fstat(self._fd)
            except OSError:
                st = None
            try:
                at_path = os.stat(self.path)
            except OSError:
                at_path = None
            if st is not None and at_path is not None and (at_path.st_ino, at_path.st_dev) == (st.st_ino, st.st_dev):
                return
            deleted = st is None or st.st_nlink == 0
            if deleted and self._lines_in_file:
                self.num_lines_lost += self._lines_in_file
                self.num_dropped += self._lines_in_file
            self._warn_once("gone", "%s was %s under the daemon: %s", self.path,
                            "deleted" if deleted else "moved or replaced",
                            "the %d lines this daemon wrote into it are counted as dropped"
                            % self._lines_in_file if deleted else "what it holds stays where it went")
            self._lines_in_file = 0
            self._fsync()
            os.close(self._fd)
            self._fd = -1
        if not self.log_dir.is_dir():
            self._warn_once("no-dir", "%s is gone: every record is counted as dropped until it is back",
                            self.log_dir)
            return
        try:
            self._open()
            self.num_reopened += 1
            self._warn_once("reopened", "%s created again at its path", self.path)
        except OSError as exc:
            self._warn_once("reopen", "cannot create %s again (%r): records are counted as dropped",
                            self.path, exc)

    def _warn_once(self, key: str, fmt: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.error(fmt, *args)

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
        if self._unwritten_daemon_line and self._fd >= 0:
            self._rescue_final_line()
        if self._fd >= 0:
            self._fsync()
            os.close(self._fd)
            self._fd = -1

    def _rescue_final_line(self) -> None:
        """A full disk refused the last daemon record (at a drain: the final counters): write
        it in the room the reserve frees. It stays counted as dropped with its batch."""
        line, self._unwritten_daemon_line = self._unwritten_daemon_line + b"\n", b""
        release_reserve(self.log_dir)
        start = self._offset
        try:
            if os.write(self._fd, line) != len(line):   # a few KB: whole, or undone below
                raise OSError(errno.ENOSPC, "a short write")
            self._offset = start + len(line)
            self._dirty = True
            self.num_final_rescued += 1
        except OSError as exc:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            log.error("the final daemon record could not be written to %s either (%r): it is in "
                      "drain.json or on stderr", self.path, exc)

    def stats(self) -> dict:
        return {"lines": self.num_lines, "bytes": self.num_bytes, "fsync_errors": self.num_fsync_errors,
                "write_errors": self.num_write_errors, "repaired_bytes": self.num_repaired_bytes,
                "rotations": self.num_rotations, "rotation_errors": self.num_rotation_errors,
                "reopened": self.num_reopened, "lines_lost": self.num_lines_lost,
                "final_rescued": self.num_final_rescued, "checkpoints": self.num_checkpoints,
                "checkpoint_errors": self.num_checkpoint_errors, "path": str(self.path)}

    def failed(self) -> bool:
        """Did this source of truth fail to hold what it was handed (not load shedding)?"""
        return bool(self.num_write_errors or self.num_lines_lost or self.num_fsync_errors)
