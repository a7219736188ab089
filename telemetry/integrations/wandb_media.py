"""W&B's data types in the training process: built as in W&B, written to a file off the caller's
thread, logged by the daemon's W&B sink (telemetry/shared/media.py says how the two meet).

Passed through: `Image` (a numpy array, a torch tensor, a PIL image or a file path, with
`caption` and `mode`), `Histogram` (a sequence or `np_histogram`, with `num_bins`), `Table`
(`columns` and `data` rows), `Html` (literal HTML, an IO object or a ".html" file, read as W&B
reads them, with `inject`), `Audio` (a file path, or raw samples with `sample_rate`, which W&B
writes with soundfile, so it needs soundfile as W&B does, with `caption`); and two plain values
W&B keeps in its history that are too large to travel in an event: a numpy array of more than
INLINE_ARRAY elements (`Array`: W&B stores it as a 32-bin histogram) and a list of more than
INLINE_LIST items or of values that are not plain (`List`), each logged by the daemon's W&B run
as the value itself, so W&B applies its own rule to it. On the caller's thread a log call only takes a snapshot that later
training cannot change (`clone()` of a tensor, which on a GPU is queued, not waited for; `copy()`
of an array or image) and queues it; the writer thread reads the values (on a GPU its
`.cpu()` waits there, not on the training thread) and writes the file. The other types
(`Video`, `Object3D`, ...) are stand-ins whose logging is refused by name.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import os
import pathlib
import queue
import threading
import warnings
from typing import Any

from telemetry.shared import media as shared_media
from telemetry.shared.numbers import is_int

# Media waiting for the writer thread; past this a log call refuses them (counted), rather
# than hold training memory for a writer that cannot keep up.
MAX_QUEUED = 64
# W&B's largest histogram (wandb.Histogram.MAX_LENGTH).
MAX_BINS = 512
# A numpy array up to this size, or a list of plain values up to this length, goes in the row's
# event (W&B's rule: an array of up to 32 elements is stored as a list); larger ones as a file.
INLINE_ARRAY = 32
INLINE_LIST = 256
# The characters of text (a value, or the items of a list) a row's event carries; past them, a
# value goes as a file (Text, List). At most 4 bytes a character in UTF-8, so the event stays
# well within what the daemon takes (protocol.constants.MAX_FRAME_BYTES).
INLINE_TEXT_CHARS = 1 << 17
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
        if is_int(num_bins) and not 1 <= num_bins <= MAX_BINS:
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

    def as_json(self) -> dict[str, Any]:
        """W&B's JSON of the histogram (what its run.summary holds for one set there): computed
        here, a tensor read to the host (a summary is set once, not on a training step)."""
        import numpy as np

        if self.np_histogram is not None:
            hist, bins = (_host_array(x) for x in self.np_histogram)
        else:
            hist, bins = np.histogram(_host_array(self.sequence), bins=self.num_bins)
        return {"_type": "histogram", "values": np.asarray(hist).tolist(), "bins": np.asarray(bins).tolist()}

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

    def __init__(self, columns: Any = None, data: Any = None, log_mode: str | None = "IMMUTABLE",
                 **unsupported: Any) -> None:
        used = [f"{k}=..." for k in sorted(k for k, v in unsupported.items() if v is not None)]
        if log_mode not in (None, "IMMUTABLE", "MUTABLE"):
            used.append(f"log_mode={log_mode!r}")
        if used:
            raise NotImplementedError(f"telemetry.wandb does not support wandb.Table({', '.join(used)})")
        self.columns = list(columns) if columns is not None else None
        self.data = [list(row) for row in data] if data is not None else []
        self._mutable = log_mode == "MUTABLE"
        self._logged: Table | None = None

    def add_data(self, *row: Any) -> None:
        self.data.append(list(row))

    def snapshot(self) -> "Table":
        """The rows as they are now (copied; their values are read on the writer). W&B's
        default log_mode, "IMMUTABLE", logs a table as it was when first logged: a later log of
        the same object logs that again, whatever rows were added since ("MUTABLE": as it is)."""
        if self._logged is not None and not self._mutable:
            return self._logged
        snap = Table(self.columns, self.data, log_mode="MUTABLE")
        if not self._mutable:
            self._logged = snap
        return snap

    def describe(self) -> tuple[str, dict[str, Any]]:
        return ".json", {}

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"columns": self.columns, "data": self.data}, f, default=_json_value)


class Html(Media):
    """wandb.Html: the HTML is taken as W&B takes it, at construction (a path to an existing
    ".html" file unless `data_is_not_path`, a str, or an IO object, read); the daemon's run builds
    the W&B object from it (so W&B injects its stylesheet, as `inject` says)."""

    passthrough = True

    def __init__(self, data: Any, inject: bool = True, data_is_not_path: bool = False) -> None:
        if isinstance(data, (str, pathlib.Path)) and not data_is_not_path and os.path.isfile(data) \
                and os.path.splitext(data)[1] == ".html":
            with open(data, encoding="utf-8") as f:
                self.html = f.read()
        elif isinstance(data, str):
            self.html = data
        elif hasattr(data, "read"):
            if hasattr(data, "seek"):
                data.seek(0)
            self.html = data.read()
        else:
            raise ValueError("data must be a string or an io object")
        self.inject = bool(inject)

    def describe(self) -> tuple[str, dict[str, Any]]:
        return ".html", {"inject": self.inject}

    def write(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html)


class Audio(Media):
    """wandb.Audio: a file path (copied as it is), or raw samples with `sample_rate` (W&B writes
    them as WAV with soundfile: without soundfile installed, W&B's error at construction)."""

    passthrough = True

    def __init__(self, data_or_path: Any, sample_rate: int | None = None, caption: str | None = None) -> None:
        self.sample_rate = sample_rate
        self.caption = caption
        if isinstance(data_or_path, (str, pathlib.Path)):
            path = str(data_or_path)
            if "://" in path:
                raise NotImplementedError("telemetry.wandb does not support wandb.Audio of a reference (a URI): "
                                          "pass a local file or the samples")
            self.path, self.data = path, None
            return
        if sample_rate is None:
            raise ValueError('Argument "sample_rate" is required when instantiating wandb.Audio with raw data.')
        if importlib.util.find_spec("soundfile") is None:
            from telemetry.integrations.wandb_objects import Error

            raise Error('Raw audio requires the soundfile package. To get it, run "pip install soundfile"')
        self.path, self.data = None, data_or_path

    def snapshot(self) -> "Audio":
        if self.data is None:
            return self
        data = self.data
        data = data.detach().clone() if _is_tensor(data) else data.copy() if hasattr(data, "copy") else list(data)
        snap = Audio.__new__(Audio)
        snap.sample_rate, snap.caption, snap.path, snap.data = self.sample_rate, self.caption, None, data
        return snap

    def describe(self) -> tuple[str, dict[str, Any]]:
        opts = {k: v for k, v in (("sample_rate", self.sample_rate), ("caption", self.caption)) if v is not None}
        if self.path is not None:
            return os.path.splitext(self.path)[1] or ".wav", {**opts, "source": "file"}
        return ".npy", {**opts, "source": "numpy"}

    def write(self, path: str) -> None:
        if self.path is not None:
            with open(self.path, "rb") as f_in, open(path, "wb") as f_out:
                f_out.write(f_in.read())
        else:
            import numpy as np

            with open(path, "wb") as f:
                np.save(f, _host_array(self.data))


class Array(Media):
    """A numpy array logged as a value (not a W&B type): the daemon's run logs the array itself,
    so W&B stores it by its own rule (more than 32 elements: a 32-bin histogram)."""

    passthrough = True

    def __init__(self, array: Any) -> None:
        self.array = array

    def snapshot(self) -> "Array":
        return Array(self.array.copy())

    def describe(self) -> tuple[str, dict[str, Any]]:
        return ".npy", {}

    def write(self, path: str) -> None:
        import numpy as np

        with open(path, "wb") as f:
            np.save(f, _host_array(self.array))


class List(Media):
    """A list or tuple logged as a value, too long or not plain enough for the row's event: a
    shallow copy, written as JSON on the writer thread (numbers in it as numbers, tensors and
    arrays as their values, anything else as its str); the daemon's run logs the list."""

    passthrough = True

    def __init__(self, items: Any) -> None:
        self.items = items

    def snapshot(self) -> "List":
        return List(list(self.items))

    def describe(self) -> tuple[str, dict[str, Any]]:
        return ".json", {}

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.items, f, default=_json_value)


class Text(Media):
    """A text value past what the row's event carries (Run._inline_texts): written as JSON on
    the writer thread; the daemon's run logs the text, as W&B keeps it in its history."""

    passthrough = True

    def __init__(self, text: str) -> None:
        self.text = text

    def snapshot(self) -> "Text":
        return self                     # a str does not change

    def describe(self) -> tuple[str, dict[str, Any]]:
        return ".json", {}

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.text, f)


# wandb.plot's functions that a Chart passes through (W&B's common charts).
CHARTS = frozenset({"line", "scatter", "bar", "histogram", "line_series", "confusion_matrix", "pr_curve",
                    "roc_curve"})
TABLE_ARG = "__wandb_table__"


class Chart(Media):
    """What `wandb.plot.<name>(...)` returns here: the call, its arguments kept (tables, arrays
    and lists copied, as W&B's chart holds their values); the daemon's W&B run makes the same call
    with the real wandb.plot and logs the chart W&B builds (its table, its Vega spec in the
    config). Arguments W&B would refuse are refused there (counted in media_failed)."""

    passthrough = True

    def __init__(self, name: str, args: tuple, kwargs: dict) -> None:
        self.name = name
        self.args = args
        self.kwargs = kwargs

    def snapshot(self) -> "Chart":
        return Chart(self.name, tuple(map(_copied, self.args)), {k: _copied(v) for k, v in self.kwargs.items()})

    def describe(self) -> tuple[str, dict[str, Any]]:
        return ".json", {"chart": self.name}

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"args": [_chart_arg(a) for a in self.args],
                       "kwargs": {k: _chart_arg(v) for k, v in self.kwargs.items()}}, f, default=_json_value)


def _copied(v: Any) -> Any:
    """A value later training cannot change; on the caller's thread, reading no tensor."""
    if isinstance(v, Table):
        return v.snapshot()
    if _is_tensor(v):
        return v.detach().clone()
    if hasattr(v, "copy") and not isinstance(v, (str, dict)):
        return v.copy()
    return list(v) if isinstance(v, (list, tuple)) else v


def _chart_arg(v: Any) -> Any:
    if isinstance(v, Table):
        return {TABLE_ARG: {"columns": v.columns, "data": v.data}}
    return v


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


