"""A window in which host-device syncs on the training thread are errors (GPU) or recorded (CPU).

Two layers, because neither sees everything:
  - on CUDA, torch.cuda.set_sync_debug_mode("error"): every cudaStreamSynchronize /
    cudaDeviceSynchronize / synchronous copy torch makes (`.item()`, `.cpu()`, `nonzero`,
    boolean indexing, a non-pinned device-to-host copy, torch.cuda.synchronize()) raises a
    RuntimeError in the thread that made it. It is process-wide, and it does not cover
    cudaEventSynchronize (torch.cuda.Event.synchronize): the telemetry sender thread's wait is
    therefore allowed, and so would be an Event.synchronize() on the step path, which is why:
  - a Python-level tracer on the training thread only: Tensor.item / tolist / numpy / cpu /
    __bool__ / __float__ / __int__ and torch.cuda.{synchronize, Event.synchronize,
    Stream.synchronize} are wrapped and each call is recorded with the first calling frame
    outside torch. On CUDA only reads of CUDA tensors count (a read of host memory is no sync).
    On CPU every tensor is a host tensor, so the CPU form of the check is narrower: a read made
    directly by project code (trainer/, telemetry/, benchmarks/) fails unless it is one of the
    two places built to turn tensors into numbers (ALLOWED_FILES); reads made inside libraries
    (torch.optim's host-side step counters, transformers) are listed, not failed, because
    whether they sync depends on where the tensor lives on a GPU, which only the GPU check sees.

mode="warn" (CUDA): torch's sync debug mode "warn" instead of "error", so a run goes on past a
library's own sync (DeepSpeed reads its overflow flag and its global norm on the host; in "error"
mode the first such read ends the step) and every sync of the window is seen. Each is attributed
to the innermost frame outside torch: project code (trainer/, telemetry/, benchmarks/) fails the
check, a library's (deepspeed, transformers) is listed with its count and first step. Syncs on
other threads (the client's sender waits on its copies there, by design) are counted apart.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any

# Files allowed to read tensors on the training thread on CPU: HostFlag.poll reads a host copy
# behind a completed event, and the client's deferred module resolves CPU tensors inline.
ALLOWED_FILES = (os.path.join("trainer", "metrics.py"), os.path.join("telemetry", "deferred.py"))
_TENSOR_METHODS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__")
MAX_RECORDED = 50  # distinct sites kept per table


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_HERE = os.path.abspath(__file__)


def _sites(f: Any) -> tuple[str, str, bool]:
    """(immediate caller, nearest project frame, whether the immediate caller is project code),
    for the frame `f` that made the read or the sync (inside torch for a read torch makes
    itself); project code is anything under the repository root that is not a virtual environment.
    """
    direct = _where(f) if f is not None else "?"
    direct_in_project = f is not None and _in_project(os.path.abspath(f.f_code.co_filename))
    project = "?"
    while f is not None:
        if _in_project(os.path.abspath(f.f_code.co_filename)):
            project = _where(f)
            break
        f = f.f_back
    return direct, project, direct_in_project


def _where(f: Any) -> str:
    return f"{_short(os.path.abspath(f.f_code.co_filename))}:{f.f_lineno} {f.f_code.co_name}"


def _in_project(path: str) -> bool:
    return (path.startswith(_ROOT + os.sep) and f"{os.sep}site-packages{os.sep}" not in path
            and path != _HERE)


def _short(path: str) -> str:
    for marker in (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}"):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.relpath(path, _ROOT) if _in_project(path) else path


class SyncWindow:
    """start() ... stop(): syncs on the training thread in between are errors / records.

    Args:
        cuda: turn on torch's sync debug mode and count only reads of CUDA tensors.
        mode: "error" (the first sync raises) or "warn" (every sync recorded and attributed).
    """

    def __init__(self, cuda: bool, mode: str = "error") -> None:
        if mode not in ("error", "warn"):
            raise ValueError(f"mode must be 'error' or 'warn', not {mode!r}")
        self.cuda = cuda
        self.mode = mode
        self.num_syncs_other_threads = 0  # warn mode: syncs torch reported on other threads
        self._warn_state: tuple[Any, Any] | None = None
        self.active = False
        self.thread_id: int | None = None
        self.num_reads = 0            # counted host reads / synchronize calls on the training thread
        self.num_allowed = 0          # CPU: reads by ALLOWED_FILES
        self.num_library_reads = 0    # CPU: reads made inside libraries (listed, not failed)
        # (what, site, via) -> {"count", "first_step"}: the sites, each once, in order of first use
        self.reads: dict[tuple[str, str, str], dict] = {}
        self.library_reads: dict[tuple[str, str, str], dict] = {}
        self.step: int | None = None  # the trainer step being run (set by the caller)
        self.first_step: int | None = None  # steps the window covered (set by the caller)
        self.last_step: int | None = None
        self._saved: list[tuple[Any, str, Any]] = []

    # -- the window ------------------------------------------------------------------------------
    def start(self) -> None:
        import torch

        if self.active:
            return
        self.thread_id = threading.get_ident()
        for name in _TENSOR_METHODS:
            self._wrap(torch.Tensor, name, tensor_arg=True)
        if self.cuda:
            self._wrap(torch.cuda, "synchronize", tensor_arg=False)
            self._wrap(torch.cuda.Event, "synchronize", tensor_arg=False)
            self._wrap(torch.cuda.Stream, "synchronize", tensor_arg=False)
            if self.mode == "warn":
                self._warn_state = (warnings.showwarning, warnings.filters[:])
                warnings.filterwarnings("always", message=".*synchronizing CUDA operation")
                warnings.showwarning = self._on_warning
            torch.cuda.set_sync_debug_mode(self.mode)
        self.active = True

    def stop(self) -> None:
        if not self.active:
            return
        if self.cuda:
            import torch

            torch.cuda.set_sync_debug_mode(0)
        if self._warn_state is not None:
            warnings.showwarning, warnings.filters[:] = self._warn_state
            self._warn_state = None
        for owner, name, original in reversed(self._saved):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved.clear()
        self.active = False

    def summary(self) -> dict:
        return {"mode": f"cuda sync debug '{self.mode}' + host-read tracer" if self.cuda else "host-read tracer (CPU)",
                "num_syncs_other_threads": self.num_syncs_other_threads,
                "first_step": self.first_step, "last_step": self.last_step,
                "num_reads": self.num_reads, "num_allowed_reads": self.num_allowed, "reads": _rows(self.reads),
                "num_library_reads": self.num_library_reads, "library_reads": _rows(self.library_reads)}

    # -- wrapping --------------------------------------------------------------------------------
    def _wrap(self, owner: Any, name: str, tensor_arg: bool) -> None:
        original_attr = owner.__dict__.get(name)  # None: inherited, restored by deleting ours
        fn = getattr(owner, name)
        window = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if window.active and threading.get_ident() == window.thread_id:
                window._note(name, args[0] if tensor_arg and args else None)
            return fn(*args, **kwargs)

        wrapper.__name__ = name
        if isinstance(original_attr, staticmethod):
            wrapper = staticmethod(wrapper)  # type: ignore[assignment]
        self._saved.append((owner, name, original_attr))
        setattr(owner, name, wrapper)

    def _on_warning(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                    line: Any = None) -> None:
        """warn mode: torch's "called a synchronizing CUDA operation", attributed to its caller."""
        if "synchronizing CUDA operation" not in str(message):
            assert self._warn_state is not None
            self._warn_state[0](message, category, filename, lineno, file, line)
            return
        if threading.get_ident() != self.thread_id:
            self.num_syncs_other_threads += 1
            return
        f = sys._getframe(1)
        while f is not None and (_is_torch(f.f_code.co_filename) or os.path.abspath(f.f_code.co_filename) == _HERE
                                 or f.f_code.co_filename.endswith("warnings.py")):
            f = f.f_back
        direct, project, direct_in_project = _sites(f)
        self._count("cuda sync", direct, project, library=f is not None and not direct_in_project)

    def _note(self, what: str, tensor: Any) -> None:
        if tensor is not None and self.cuda and not getattr(tensor, "is_cuda", False):
            return  # a host tensor: reading it is no sync
        if self.cuda and self.mode == "warn" and tensor is not None:
            return  # torch's own warning names this sync (and its caller): counted there, once
        direct, project, direct_in_project = _sites(sys._getframe(2))   # the wrapped method's caller
        if not self.cuda and direct_in_project and any(a in direct for a in ALLOWED_FILES):
            self.num_allowed += 1
            return
        # A library's own read or synchronize(), listed, not failed: on CPU (torch.optim's host-side
        # step counter: whether it syncs depends on where that tensor lives on a GPU, which the GPU
        # check decides), and in warn mode (DeepSpeed's timers, its comms logger).
        library = not direct_in_project and (not self.cuda or self.mode == "warn")
        self._count(what, direct, project, library)

    def _count(self, what: str, site: str, via: str, library: bool) -> None:
        if library:
            self.num_library_reads += 1
            self._record(self.library_reads, what, site, via)
        else:
            self.num_reads += 1
            self._record(self.reads, what, site, via)

    def _record(self, table: dict, what: str, site: str, via: str) -> None:
        row = table.get((what, site, via))
        if row is not None:
            row["count"] += 1
        elif len(table) < MAX_RECORDED:
            table[(what, site, via)] = {"count": 1, "first_step": self.step}


def _is_torch(path: str) -> bool:
    return f"{os.sep}torch{os.sep}" in path


def _rows(table: dict) -> list[dict]:
    return [{"what": w, "site": s, "via": v, **row} for (w, s, v), row in table.items()]
