"""The run's media, kept for the dashboard; the rank-written media files, deleted once.

A `wandb.Image`, `wandb.Histogram` or `wandb.Table` logged through the drop-in or an integration
reaches the daemon as a `wandb/media` event naming a file a rank writes into the media directory
(telemetry/shared/media.py). Two things in the daemon read those files: the W&B sink (which
builds the W&B object) and the keeper here, which keeps a copy in the run's log directory for the
dashboard, in a form a browser shows:

    <log_dir>/media/index.jsonl   one line per media value: its step, key, type, the rank and
                                  what the page needs (files, captions; a histogram's bins and
                                  counts inline; a table's columns and number of rows)
    <log_dir>/media/<n>.png       an image, re-encoded as PNG whatever the rank wrote (a file
                                  path, a PIL image, an array or a tensor as W&B reads them)
    <log_dir>/media/<n>.json      a table: {"columns": [...], "data": [[...], ...]}

What is kept is bounded by `media.max_mb` of the daemon config (default 1024): past it a value is
not kept (counted: status "media": not_kept, and said once in the log); W&B still gets it.

MediaFiles decides when a rank's file goes: each of its readers (the keeper, and the W&B sink
when there is one and it started) releases it when done, and the last release deletes it (and
its `.failed` marker). A file one reader released and another never will (its event dropped in a
full queue, a batch that failed) is deleted ORPHAN_S later, or when the daemon closes. A daemon
starting deletes the files nobody will read (delete_stale: their writer gone, over ORPHAN_S old).
Only names the drop-in's writer gives are read or deleted (shared/media.py: NAME). The keeper runs on its own thread, fed only media
events (ingest hands them over as they pass: nothing per metrics record); it runs on every daemon
that is not a head (a head is on another host than the ranks' files) with `media.keep: false`
too, then only releasing what it is handed.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from telemetry.shared import files
from telemetry.shared import media as shared_media
from telemetry.shared.numbers import nonfinite_as_null

# Media the W&B sink logs that the dashboard does not show (released, not kept).
NOT_KEPT = frozenset({"Html", "Audio", "Array", "List", "Chart"})

log = logging.getLogger("telemetry.daemon.media")

READER = "keeper"             # its name among MediaFiles' readers
# How long a reader waits for a media file the event names (the rank's writer thread writes it
# after sending the event; on one host this takes milliseconds).
MEDIA_WAIT_S = 10.0
MEDIA_POLL_S = 0.01
# The most files one media event may name (a list of images logged as one value).
MAX_MEDIA_ITEMS = 1024
# Media events waiting for the keeper's thread; beyond, one is not kept (counted) and released.
MAX_PENDING = 10_000
# A histogram is kept with at most this many bins (more are merged, neighbours summed).
MAX_BINS = 512
# An image larger than this many pixels is not kept (counted as failed): a page shows thumbnails.
MAX_PIXELS = 1 << 24
# A file one reader released and another never will (its event was dropped) is deleted this
# long after the first release (the keeper's sweep); a reader reads within seconds.
ORPHAN_S = 600.0
SWEEP_EVERY_S = 30.0


class MediaFiles:
    """The rank-written media files and their readers (names: "keeper", "wandb"): a file is
    deleted once each reader has released it. A reader that will never read (a W&B sink that
    could not start) is dropped (drop_reader); a file one reader released and another never will
    (its event dropped in a full queue, a batch that failed) is deleted ORPHAN_S after the first
    release (sweep). Thread-safe (the W&B sink's thread and the keeper's); never raises."""

    def __init__(self, readers: tuple[str, ...]) -> None:
        self.readers = frozenset(readers)
        self._released: dict[str, tuple[set, float]] = {}   # path -> (readers done, first release)
        self._lock = threading.Lock()
        self.num_orphaned = 0

    @staticmethod
    def wait(path: Path, timeout_s: float = MEDIA_WAIT_S) -> None:
        """Until the rank's writer has written `path`; ValueError when it said it could not (its
        .failed marker, left for the last release to delete), TimeoutError past `timeout_s`."""
        failed = path.with_name(path.name + shared_media.FAILED_SUFFIX)
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if failed.exists():
                try:
                    reason = failed.read_text()[:500].strip()
                except (OSError, ValueError) as exc:
                    reason = repr(exc)
                raise ValueError(f"the rank could not write it: {reason}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s (a rank on another "
                                   f"host, or a rank that exited first)")
            time.sleep(MEDIA_POLL_S)

    def release(self, paths: list[Path], reader: str) -> None:
        """`reader` is done with these files; the last reader's release deletes them."""
        now = time.monotonic()
        for path in dict.fromkeys(paths):          # a name twice in one event: once
            key = str(path)
            with self._lock:
                done, first = self._released.get(key, (set(), now))
                done.add(reader)
                if not self.readers <= done:
                    self._released[key] = (done, first)
                    continue
                self._released.pop(key, None)
            _unlink(path)

    def drop_reader(self, reader: str) -> None:
        """`reader` will read nothing (it could not start): what only it held goes now."""
        with self._lock:
            self.readers = self.readers - {reader}
            gone = [k for k, (done, _) in self._released.items() if self.readers <= done]
            for k in gone:
                del self._released[k]
        for k in gone:
            _unlink(Path(k))

    def sweep(self, orphan_s: float | None = None) -> int:
        """Delete the files some reader released more than `orphan_s` ago that another never
        did (counted in num_orphaned); return how many."""
        limit = time.monotonic() - (ORPHAN_S if orphan_s is None else orphan_s)
        with self._lock:
            old = [k for k, (_, first) in self._released.items() if first <= limit]
            for k in old:
                del self._released[k]
            self.num_orphaned += len(old)
        for k in old:
            _unlink(Path(k))
        return len(old)

    def close(self) -> int:
        """Delete what some reader never released (its event dropped); return how many."""
        return self.sweep(orphan_s=-1.0)


def _unlink(path: Path) -> None:
    for p in (path, path.with_name(path.name + shared_media.FAILED_SUFFIX)):
        try:
            p.unlink(missing_ok=True)
        except (OSError, ValueError) as exc:       # never a reader's end: said, and it goes on
            log.warning("media: cannot delete %s: %s", p, exc)


def delete_stale(min_age_s: float = ORPHAN_S) -> int:
    """Files in the media directory that nobody will read: their writer (the pid in the name)
    is gone and they are older than `min_age_s` (no daemon took them: none was running, or one
    was killed). Return how many went."""
    try:
        directory = shared_media.media_dir()
        names = os.listdir(directory)
    except (OSError, ValueError):
        return 0
    now = time.time()
    gone = 0
    for base, name in {n.removesuffix(shared_media.FAILED_SUFFIX): n for n in sorted(names, reverse=True)}.items():
        # (a file and its .failed marker are one: in reverse order the marker comes first and the
        # file's own name overwrites it)
        if shared_media.NAME.fullmatch(base) is None:
            continue
        pid = int(base.split("-", 1)[0])
        try:
            old = now - os.lstat(directory / name).st_mtime > min_age_s
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        except OSError:
            continue            # gone already, or a pid of another user's: alive
        if old and not alive:
            _unlink(directory / base)
            gone += 1
    return gone


def event_files(data: Any) -> tuple[list[dict], bool]:
    """A media event's items ({"file", "options"}) and whether it was a list; ValueError for an
    event that is not one (telemetry/integrations/wandb_run.py writes them)."""
    if not isinstance(data, dict):
        raise ValueError(f"a malformed media event: {data!r:.200}")
    items = data.get("items")
    as_list = isinstance(items, list)
    if not as_list:
        items = [{"file": data.get("file"), "options": data.get("options")}]
    if not isinstance(data.get("step"), int) or not isinstance(data.get("key"), str) or not items \
            or len(items) > MAX_MEDIA_ITEMS or not all(isinstance(i, dict) for i in items):
        raise ValueError(f"a malformed media event: {data!r:.200}")
    return items, as_list


def event_paths(data: Any) -> list[Path]:
    """The media files an event names (plain names in the media directory only); [] for an
    event that names none it may."""
    try:
        items, _ = event_files(data)
    except ValueError:
        return []
    paths = [shared_media.media_file(i.get("file")) for i in items]
    return [p for p in paths if p is not None]


def image_array(path: Path, options: dict):
    """The image a rank's file stands for, as W&B reads it: an HxW, HxWx1, HxWx3 or HxWx4 uint8
    array (a tensor is CxHxW; float values in [0, 1] are scaled to 0-255, as W&B does)."""
    import numpy as np

    source = options.get("source")
    if source in ("numpy", "torch"):
        a = np.load(path, allow_pickle=False)
        if source == "torch" and a.ndim == 3:
            a = np.moveaxis(a, 0, -1)
    else:
        from PIL import Image

        with Image.open(path) as im:
            if im.width * im.height > MAX_PIXELS:
                raise ValueError(f"an image of {im.width} x {im.height} pixels")
            a = np.asarray(im.convert("RGBA" if "A" in im.getbands() else "RGB"))
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (3, 4)) or a.size == 0:
        raise ValueError(f"an image of shape {a.shape}: expected H x W, H x W x 1, 3 or 4 (a tensor: C x H x W)")
    if a.shape[0] * a.shape[1] > MAX_PIXELS:
        raise ValueError(f"an image of {a.shape[1]} x {a.shape[0]} pixels")
    if a.dtype != np.uint8:
        a = a.astype(np.float64)
        a[~np.isfinite(a)] = 0.0
        if a.size and a.max() <= 1.0 and a.min() >= 0.0:
            a = a * 255.0
        a = np.clip(np.rint(a), 0, 255).astype(np.uint8)
    return a


def num_bins(options: dict) -> int:
    """A histogram event's num_bins: an int in 1..MAX_BINS (W&B's bound; it comes from the
    network), else ValueError."""
    n = options.get("num_bins", 64)
    if type(n) is not int or not 1 <= n <= MAX_BINS:
        raise ValueError(f"num_bins {n!r}: expected an integer from 1 to {MAX_BINS}")
    return n


def histogram(path: Path, options: dict) -> tuple[list[float], list[float]]:
    """A histogram file's (bin edges, counts), as W&B's Histogram makes them; at most MAX_BINS."""
    import numpy as np

    with np.load(path, allow_pickle=False) as f:
        if "hist" in f:
            counts, edges = np.asarray(f["hist"], dtype=np.float64), np.asarray(f["bins"], dtype=np.float64)
        else:
            seq = np.asarray(f["sequence"], dtype=np.float64)
            seq = seq[np.isfinite(seq)]
            counts, edges = np.histogram(seq, bins=num_bins(options))
            counts = counts.astype(np.float64)
    if counts.ndim != 1 or edges.shape != (counts.size + 1,) or not counts.size:
        raise ValueError(f"a histogram of {counts.shape} counts and {edges.shape} edges")
    while counts.size > MAX_BINS:
        m = math.ceil(counts.size / MAX_BINS)
        n = math.ceil(counts.size / m) * m
        padded = np.concatenate([counts, np.zeros(n - counts.size)])
        edges = np.concatenate([edges[::m], edges[-1:]]) if (edges.size - 1) % m else edges[::m]
        counts = padded.reshape(-1, m).sum(axis=1)
    return [float(x) for x in edges], [float(x) for x in counts]


class MediaKeeper:
    """Keeps the run's media for the dashboard (module docstring), on its own thread."""

    def __init__(self, log_dir: Path, media_files: MediaFiles, keep: bool = True, max_bytes: int = 1 << 30) -> None:
        self.dir = Path(log_dir) / shared_media.KEPT_SUBDIR
        self.media_files = media_files
        self.keep = keep
        self.max_bytes = max_bytes
        self.num_kept = 0
        self.num_not_kept = 0        # past max_bytes, or past MAX_PENDING
        self.num_failed = 0          # a file that never came, or one that is no image/histogram/table
        self.num_bytes = 0
        self.last_error = ""
        self._pending: deque = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._next = 0               # the next file's number
        self._index = None
        self._thread = threading.Thread(target=self._run, name="media-keeper", daemon=True)
        self.num_stale_deleted = 0

    def start(self) -> None:
        if self.keep:
            try:
                files.make_dir(self.dir)
                # A daemon restarted on the run: numbers and bytes go on from what is there.
                for p in self.dir.iterdir():
                    stem = p.name.split(".")[0]
                    if stem.isdigit():
                        self._next = max(self._next, int(stem) + 1)
                    if stem.isdigit() or p.name == shared_media.KEPT_INDEX:
                        self.num_bytes += p.lstat().st_size
                self._index = files.open_fd(self.dir / shared_media.KEPT_INDEX, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            except OSError as exc:      # the run goes on; its media are not kept (the files still go)
                self.keep = False
                self.last_error = f"{self.dir}: {exc}"
                log.error("media: cannot keep the run's media in %s (%s); W&B still gets them", self.dir, exc)
        self.num_stale_deleted = delete_stale()
        self._thread.start()

    def put(self, rank: int | None, data: Any) -> None:
        """A media event as it passes ingest (the daemon's thread): never blocks."""
        with self._cond:
            if len(self._pending) < MAX_PENDING and not self._stopping:
                self._pending.append((rank, data))
                self._cond.notify()
                return
        self.num_not_kept += 1
        self.media_files.release(event_paths(data), READER)

    def request_stop(self) -> None:
        """Keep what is queued, then end; put() after this releases at once (counted)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def close(self, timeout_s: float) -> bool:
        """Keep what is queued, within `timeout_s`; then stop. False if its thread is still busy
        (a file it waits for)."""
        self.request_stop()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        if self._index is not None:
            os.close(self._index)
            self._index = None
        return True

    def stats(self) -> dict:
        return {"kept": self.num_kept, "not_kept": self.num_not_kept, "failed": self.num_failed,
                "bytes": self.num_bytes, "pending": len(self._pending), "orphaned": self.media_files.num_orphaned,
                "stale_deleted": self.num_stale_deleted,
                "last_error": self.last_error}

    def _run(self) -> None:
        next_sweep = time.monotonic() + SWEEP_EVERY_S
        while True:
            with self._cond:
                while not self._pending and not self._stopping and time.monotonic() < next_sweep:
                    self._cond.wait(max(0.0, next_sweep - time.monotonic()))
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + SWEEP_EVERY_S
                    item = None
                elif not self._pending:
                    return
                else:
                    item = self._pending.popleft()
            if item is None:
                self.media_files.sweep()
                continue
            try:
                self._take(*item)
            except BaseException as exc:     # never the thread's end (a bug here costs one value)
                self.num_failed += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                log.exception("media: the keeper failed on one value (counted in media.failed)")

    def _take(self, rank: int | None, data: Any) -> None:
        """Wait for an event's files, keep them (when keeping), release them."""
        paths: list[Path] = []
        try:
            items, as_list = event_files(data)
            paths = [p for p in map(shared_media.media_file, (i.get("file") for i in items)) if p is not None]
            if len(paths) != len(items):
                raise ValueError(f"a malformed media event: {data!r:.200}")
            for path in paths:
                self.media_files.wait(path)
            if self.keep:
                self._keep(rank, data, items, paths, as_list)
        except Exception as exc:      # one value not kept, counted; the next one goes on
            self.num_failed += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            if self.num_failed == 1:
                log.error("media: a value not kept for the dashboard (counted in media.failed): %s", exc)
        finally:
            self.media_files.release(paths, READER)

    def _keep(self, rank: int | None, data: dict, items: list[dict], paths: list[Path], as_list: bool) -> None:
        kind = str(data.get("type"))
        entry: dict[str, Any] = {"step": data["step"], "key": data["key"], "type": kind, "rank": rank}
        out: list[tuple[str, bytes]] = []
        if kind == "Image":
            import io

            from PIL import Image

            entry["images"] = []
            for item, path in zip(items, paths):
                options = item.get("options") if isinstance(item.get("options"), dict) else {}
                a = image_array(path, options)
                buf = io.BytesIO()
                Image.fromarray(a).save(buf, format="PNG")
                name = f"{self._next + len(out)}.png"
                out.append((name, buf.getvalue()))
                caption = options.get("caption")
                entry["images"].append({"file": name, "width": int(a.shape[1]), "height": int(a.shape[0]),
                                        **({"caption": str(caption)[:500]} if caption is not None else {})})
            entry["list"] = as_list
        elif kind == "Histogram" and not as_list:
            options = items[0].get("options") if isinstance(items[0].get("options"), dict) else {}
            entry["bins"], entry["counts"] = histogram(paths[0], options)
        elif kind == "Table" and not as_list:
            doc = json.loads(paths[0].read_text())
            columns, rows = doc.get("columns"), doc.get("data")
            if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows) \
                    or not (columns is None or isinstance(columns, list)):
                raise ValueError("a table file without columns and rows of cells")
            name = f"{self._next}.json"
            # A missing value (NaN, inf: the drop-in writes them as W&B keeps them) is null here:
            # a browser's JSON has no NaN.
            out.append((name, json.dumps({"columns": columns, "data": nonfinite_as_null(rows)}, allow_nan=False,
                                         default=str).encode()))
            entry.update(file=name, columns=[str(c) for c in columns or []], rows=len(rows))
        elif kind in NOT_KEPT:
            return
        else:
            raise ValueError(f"unknown media type {kind!r}")
        line = (json.dumps(entry, allow_nan=False) + "\n").encode()
        size = sum(len(b) for _, b in out) + len(line)
        if self.num_bytes + size > self.max_bytes:
            self.num_not_kept += 1
            if self.num_not_kept == 1:
                log.warning("media: %.0f MB kept for the dashboard, media.max_mb reached: later values are not "
                            "kept (counted in media.not_kept; W&B still gets them)", self.num_bytes / 2**20)
            return
        for name, body in out:
            files.write_file(self.dir / name, body)
        self._next += len(out)
        os.write(self._index, line)       # one write of one line: appended whole
        self.num_bytes += size
        self.num_kept += 1
