"""W&B's data types in the training process: built as in W&B, written to a file off the caller's
thread, logged by the daemon's W&B sink (telemetry/shared/media.py says how the two meet).

Passed through: `Image` (a numpy array, a torch tensor, a PIL image or a file path, with
`caption` and `mode`), `Histogram` (a sequence or `np_histogram`, with `num_bins`), `Table`
(`columns` and `data` rows). On the caller's thread a log call only takes a snapshot that later
training cannot change (`clone()` of a tensor, which on a GPU is queued, not waited for; `copy()`
of an array or image) and queues it; the writer thread reads the values (on a GPU its
`.cpu()` waits there, not on the training thread) and writes the file. The other types
(`Audio`, `Video`, `Html`, ...) are stand-ins whose logging is refused by name.
"""
from __future__ import annotations

import itertools
import json
import os
import queue
import threading
import warnings
from typing import Any

from telemetry.shared import media as shared_media

# Media waiting for the writer thread; past this a log call refuses them (counted), rather
# than hold training memory for a writer that cannot keep up.
MAX_QUEUED = 64
# W&B's largest histogram (wandb.Histogram.MAX_LENGTH).
MAX_BINS = 512
# How long finish() lets the writer finish what is queued.
CLOSE_TIMEOUT_S = 10.0


class Media:
    """A W&B data type this drop-in does not pass through: logging one is refused by name
    (it keeps nothing of what it was given)."""

    passthrough = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"wandb.{type(self).__name__}"

    def snapshot(self) -> "Media":
        """A copy later training cannot change; on the caller's thread, reading no value."""
        return self

    def describe(self) -> tuple[str, dict[str, Any]]:
        """The file's extension and what the sink needs beside it; on the caller's thread."""
        raise NotImplementedError

    def write(self, path: str) -> None:
        """Write the file; on the writer thread."""
        raise NotImplementedError


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "detach") and hasattr(x, "numel")


def _host_array(x: Any) -> Any:
    """A numpy array of a tensor or array-like; on the writer thread (a device tensor's copy to
    the host waits here, off the training thread)."""
    import numpy as np

    if _is_tensor(x):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype == object:   # never pickled into a file the daemon would have to unpickle
        raise TypeError(f"not an array of numbers: {type(x).__name__}")
    return arr


class Image(Media):
    passthrough = True

    def __init__(self, data_or_path: Any, mode: str | None = None, caption: str | None = None,
                 **unsupported: Any) -> None:
        used = sorted(k for k, v in unsupported.items() if v is not None)
        if used:
            raise NotImplementedError(f"telemetry.wandb does not support wandb.Image({', '.join(used)}=...)")
        self.data = data_or_path
        self.mode = mode
        self.caption = caption

    def snapshot(self) -> "Image":
        data = self.data
        if _is_tensor(data):
            data = data.detach().clone()
        elif hasattr(data, "copy") and not isinstance(data, str):
            data = data.copy()      # a numpy array or a PIL image
        return Image(data, mode=self.mode, caption=self.caption)

    def _kind(self) -> str:
        data = self.data
        if isinstance(data, (str, os.PathLike)):
            return "file"
        if hasattr(data, "save") and hasattr(data, "mode") and not _is_tensor(data):
            return "pil"
        return "torch" if _is_tensor(data) else "numpy"   # W&B reads a tensor as C,H,W

    def describe(self) -> tuple[str, dict[str, Any]]:
        opts = {k: v for k, v in (("mode", self.mode), ("caption", self.caption)) if v is not None}
        kind = self._kind()
        if kind == "file":
            return os.path.splitext(os.fspath(self.data))[1] or ".png", {**opts, "source": "file"}
        if kind == "pil":
            return ".png", {**opts, "source": "file"}
        return ".npy", {**opts, "source": kind}

    def write(self, path: str) -> None:
        kind = self._kind()
        if kind == "file":
            with open(os.fspath(self.data), "rb") as f_in, open(path, "wb") as f_out:
                f_out.write(f_in.read())
        elif kind == "pil":
            self.data.save(path, format="PNG")
        else:
            import numpy as np

            with open(path, "wb") as f:
                np.save(f, _host_array(self.data))


class Histogram(Media):
    passthrough = True

    def __init__(self, sequence: Any = None, np_histogram: Any = None, num_bins: int = 64) -> None:
        if sequence is None and np_histogram is None:
            raise ValueError("wandb.Histogram needs a sequence or np_histogram")
        # As W&B's: at most 512 bins (W&B finds out after computing them; here before).
        if isinstance(num_bins, int) and not isinstance(num_bins, bool) and not 1 <= num_bins <= MAX_BINS:
            raise ValueError(f"The maximum length of a histogram is {MAX_BINS}" if num_bins > MAX_BINS
                             else "num_bins must be at least 1")
        if np_histogram is not None and len(np_histogram[0]) > MAX_BINS:
            raise ValueError(f"The maximum length of a histogram is {MAX_BINS}")
        self.sequence = sequence
        self.np_histogram = np_histogram
        self.num_bins = num_bins

    def snapshot(self) -> "Histogram":
        seq = self.sequence
        if _is_tensor(seq):
            seq = seq.detach().clone()
        elif hasattr(seq, "copy"):
            seq = seq.copy()
        elif seq is not None:
            seq = list(seq)
        return Histogram(seq, self.np_histogram, self.num_bins)

    def describe(self) -> tuple[str, dict[str, Any]]:
        return ".npz", {"num_bins": self.num_bins}

    def write(self, path: str) -> None:
        import numpy as np

        with open(path, "wb") as f:
            if self.np_histogram is not None:
                hist, bins = self.np_histogram
                np.savez(f, hist=_host_array(hist), bins=_host_array(bins))
            else:
                np.savez(f, sequence=_host_array(self.sequence))


class Table(Media):
    passthrough = True

    def __init__(self, columns: Any = None, data: Any = None, **unsupported: Any) -> None:
        used = sorted(k for k, v in unsupported.items() if v is not None)
        if used:
            raise NotImplementedError(f"telemetry.wandb does not support wandb.Table({', '.join(used)}=...)")
        self.columns = list(columns) if columns is not None else None
        self.data = [list(row) for row in data] if data is not None else []

    def add_data(self, *row: Any) -> None:
        self.data.append(list(row))

    def snapshot(self) -> "Table":
        return Table(self.columns, self.data)   # rows copied; their values are read on the writer

    def describe(self) -> tuple[str, dict[str, Any]]:
        return ".json", {}

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"columns": self.columns, "data": self.data}, f, default=_json_value)


def _json_value(v: Any) -> Any:
    if _is_tensor(v) or hasattr(v, "item"):
        return v.item() if getattr(v, "ndim", 0) == 0 else _host_array(v).tolist()
    return str(v)


class MediaWriter:
    """One thread per process that writes queued media to files, then names them to the daemon.

    The caller's thread sends the `wandb/media` event at log time (so it is ordered with the
    row it belongs to) with the file name the writer will produce; the writer writes to a
    temporary name and renames, so the sink never reads half a file.
    """

    def __init__(self, max_queued: int = MAX_QUEUED) -> None:
        self._queue: queue.Queue = queue.Queue(max_queued)
        self._thread: threading.Thread | None = None
        self._names = itertools.count()
        self.num_written = 0
        self.num_failed = 0
        self.unusable = ""

    def submit(self, media: Media) -> tuple[str, dict[str, Any]] | None:
        """Queue a snapshot of `media`: the file name it will have and the options the sink needs,
        or None when the queue is full or the media directory cannot be used (`unusable` says
        why). Never raises into the training script."""
        if self.unusable:
            return None
        if self._thread is None:
            try:
                shared_media.media_dir(create=True)
            except (ValueError, OSError) as exc:   # UnsafePathError: another user's directory
                self.unusable = f"the media directory cannot be used: {exc}"
                return None
            self._thread = threading.Thread(target=self._run, name="telemetry-wandb-media", daemon=True)
            self._thread.start()
        snap = media.snapshot()
        ext, options = snap.describe()
        name = f"{os.getpid()}-{os.urandom(4).hex()}-{next(self._names)}{shared_media.safe_ext(ext)}"
        try:
            self._queue.put_nowait((name, snap))
        except queue.Full:
            return None
        return name, options

    def _run(self) -> None:
        root = shared_media.media_dir()
        while True:
            item = self._queue.get()
            if item is None:
                return
            name, media = item
            tmp = root / ("." + name)           # names starting with "." are never read by the sink
            try:
                media.write(str(tmp))
                os.replace(tmp, root / name)
                self.num_written += 1
            except Exception as exc:   # the sink must hear of it, or it waits for the file
                self.num_failed += 1
                tmp.unlink(missing_ok=True)
                with open(root / (name + shared_media.FAILED_SUFFIX), "w") as f:
                    f.write(f"{type(media).__name__}: {exc!r}\n")
                if self.num_failed == 1:
                    warnings.warn(f"telemetry.wandb: a wandb.{type(media).__name__} could not be written for the "
                                  f"daemon ({exc!r}); it is not logged (counted in the daemon's W&B sink: media_failed)",
                                  RuntimeWarning, stacklevel=1)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)
        self._thread = None


