"""The run's media as the page reads them: what the daemon kept in <log_dir>/media
(telemetry/daemon/media_keeper.py wrote it; this module reads only its files).

    GET /api/media?run=ID&since=N     the run's media values after the first N, oldest first, at
                                      most MAX_ANSWER_ITEMS / MAX_ANSWER_BYTES of them:
                                      {"items": [...], "total": T, "forgotten": F, "more": bool}
    GET /api/media/file?run=ID&name=N one kept file (N.png, N.json), nothing else

The index is read as it grows (from where the last request left off); the page asks again while
the run is live, and again at once while an answer says `more`. At most MAX_ENTRIES entries and
MAX_HELD_BYTES of their lines are held per run (the oldest go first, counted in `forgotten`).
"""
from __future__ import annotations

import json
import os
import re
import stat
import threading
from pathlib import Path

from telemetry.shared import files
from telemetry.shared.media import KEPT_INDEX, KEPT_SUBDIR

MAX_ENTRIES = 20_000
MAX_HELD_BYTES = 64 << 20
MAX_ANSWER_ITEMS = 2_000
MAX_ANSWER_BYTES = 8 << 20
# A kept file larger than this is not served (the keeper writes PNGs of at most 16 Mpx, tables
# within media.max_mb).
MAX_FILE_BYTES = 256 << 20
# What one read takes from the index at most (the next request goes on from there).
MAX_READ_BYTES = 16 << 20
FILE_NAME = re.compile(r"[0-9]{1,12}\.(png|json)")
CONTENT_TYPES = {"png": "image/png", "json": "application/json"}


class MediaIndex:
    """One run's kept media values, read incrementally from its index.jsonl. Thread-safe."""

    def __init__(self, log_dir: Path | None) -> None:
        self.dir = Path(log_dir) / KEPT_SUBDIR if log_dir is not None else None
        self.entries: list[dict] = []
        self._sizes: list[int] = []       # each entry's line length
        self._held_bytes = 0
        self.num_forgotten = 0
        self._offset = 0
        self._lock = threading.Lock()

    def items(self, since: int = 0) -> dict:
        """The values after the first `since` of the run (those forgotten are not sent again)."""
        with self._lock:
            self._read()
            first = max(0, since - self.num_forgotten)
            last, size = first, 0
            while last < len(self.entries) and last - first < MAX_ANSWER_ITEMS and (size < MAX_ANSWER_BYTES or last == first):
                size += self._sizes[last]
                last += 1
            return {"items": self.entries[first:last], "total": self.num_forgotten + last,
                    "forgotten": self.num_forgotten, "more": last < len(self.entries)}

    def _read(self) -> None:
        if self.dir is None:
            return
        try:
            with files.open_regular(self.dir / KEPT_INDEX) as f:
                f.seek(self._offset)
                data = f.read(MAX_READ_BYTES)
        except OSError:
            return
        end = data.rfind(b"\n") + 1          # a line being written is read next time
        self._offset += end
        for line in data[:end].splitlines():
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError):   # not a line of the keeper's, skipped
                continue
            if isinstance(entry, dict) and isinstance(entry.get("step"), int) and isinstance(entry.get("key"), str):
                self.entries.append(entry)
                self._sizes.append(len(line))
                self._held_bytes += len(line)
        extra = 0
        while len(self.entries) - extra > MAX_ENTRIES or (self._held_bytes > MAX_HELD_BYTES and extra < len(self.entries) - 1):
            self._held_bytes -= self._sizes[extra]
            extra += 1
        if extra:
            del self.entries[:extra]
            del self._sizes[:extra]
            self.num_forgotten += extra

    def file(self, name: str) -> tuple[bytes, str] | None:
        """A kept file's bytes and content type; None for a name that is not one."""
        m = FILE_NAME.fullmatch(name or "")
        if self.dir is None or m is None:
            return None
        try:
            # Never through a symlink (a shared run dir another user can write), never a FIFO.
            fd = os.open(self.dir / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
                return None
            return f.read(MAX_FILE_BYTES), CONTENT_TYPES[m.group(1)]
