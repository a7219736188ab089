"""The run's media as the page reads them: what the daemon kept in <log_dir>/media
(telemetry/daemon/media_keeper.py wrote it; this module reads only its files).

    GET /api/media?run=ID&since=N     the run's media values after the first N, oldest first:
                                      {"items": [...], "total": T, "forgotten": F}
    GET /api/media/file?run=ID&name=N one kept file (N.png, N.json), nothing else

The index is read as it grows (from where the last request left off); the page asks again while
the run is live. At most MAX_ENTRIES are held per run (the oldest go first, counted).
"""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from telemetry.shared import files

MEDIA_SUBDIR = "media"           # as media_keeper.py writes it (the daemon package is not imported here)
INDEX_NAME = "index.jsonl"
MAX_ENTRIES = 20_000
# What one read takes from the index at most (the next request goes on from there).
MAX_READ_BYTES = 16 << 20
FILE_NAME = re.compile(r"^[0-9]{1,12}\.(png|json)$")
CONTENT_TYPES = {"png": "image/png", "json": "application/json"}


class MediaIndex:
    """One run's kept media values, read incrementally from its index.jsonl. Thread-safe."""

    def __init__(self, log_dir: Path | None) -> None:
        self.dir = Path(log_dir) / MEDIA_SUBDIR if log_dir is not None else None
        self.entries: list[dict] = []
        self.num_forgotten = 0
        self._offset = 0
        self._lock = threading.Lock()

    def items(self, since: int = 0) -> dict:
        """The values after the first `since` of the run (those forgotten are not sent again)."""
        with self._lock:
            self._read()
            first = max(0, since - self.num_forgotten)
            return {"items": self.entries[first:], "total": self.num_forgotten + len(self.entries),
                    "forgotten": self.num_forgotten}

    def _read(self) -> None:
        if self.dir is None:
            return
        try:
            with files.open_regular(self.dir / INDEX_NAME) as f:
                f.seek(self._offset)
                data = f.read(MAX_READ_BYTES)
        except OSError:
            return
        end = data.rfind(b"\n") + 1          # a line being written is read next time
        self._offset += end
        for line in data[:end].splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("step"), int) and isinstance(entry.get("key"), str):
                self.entries.append(entry)
        if len(self.entries) > MAX_ENTRIES:
            extra = len(self.entries) - MAX_ENTRIES
            del self.entries[:extra]
            self.num_forgotten += extra

    def file(self, name: str) -> tuple[bytes, str] | None:
        """A kept file's bytes and content type; None for a name that is not one."""
        m = FILE_NAME.match(name or "")
        if self.dir is None or m is None:
            return None
        try:
            with files.open_regular(self.dir / name) as f:
                return f.read(), CONTENT_TYPES[m.group(1)]
        except OSError:
            return None
