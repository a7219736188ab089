"""Read faulthandler's all-threads dump and say where a rank is.

    Thread 0x00007f0c2a1fe640 (most recent call first):
      File "/usr/lib/python3.11/threading.py", line 324 in wait
      ...
    Current thread 0x00007f0c31b2c740 (most recent call first):
      File "/work/train.py", line 88 in load_batch
      File "/work/train.py", line 120 in <module>

The main thread is the one whose outermost frame is a module's top level (`<module>`); others
start in threading's _bootstrap. A rank "waits" when its main thread, read from the innermost
frame out, reaches a collective before any frame of its own code (a frame outside the Python
library and site-packages): torch.distributed and DeepSpeed's comm (gloo, NCCL, MPI through
them), DDP's own collectives (the buffer broadcast at the start of each forward, the parameter
and buffer broadcast as it is built, its join and sync checks), ZeRO's reduce, gather and wait
functions, and the autograd engine, where DDP waits for its gradient all-reduce at the end of
backward. A rank whose innermost telling frame is its own code (a sleep, a stuck read, a loop)
is not waiting, whatever library frames lie further out (a hook under DeepSpeed's step).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')
# Words of a library function's name (split at "_") that mean "waiting for the other ranks":
# all_reduce, reduce_ipg_grads, _all_gather_params, _sync_buffers, _distributed_broadcast_coalesced,
# wait, monitored_barrier, isend / irecv, all_to_all_single.
_COLLECTIVE_WORDS = frozenset({"allreduce", "reduce", "allgather", "gather", "scatter", "broadcast", "barrier",
                               "alltoall", "send", "isend", "recv", "irecv", "wait", "sync"})
_COLLECTIVE_PAIRS = frozenset({("all", "reduce"), ("all", "gather"), ("all", "to"), ("reduce", "scatter")})
# Library files where those names are collectives (elsewhere a "wait" may be a queue's), and
# whose they are.
_COLLECTIVE_FILES = (("torch/nn/parallel/distributed.py", "DDP's"), ("deepspeed/runtime/", "DeepSpeed's"))
# Library files all of whose frames are collective waits, and how to say it.
_WAIT_FILES = (("torch/distributed/", "a collective"), ("deepspeed/comm/", "a collective"),
               ("torch/autograd/", "backward (where DDP waits for its gradient all-reduce)"))
# Paths of the Python library and installed packages: not the user's own code.
_LIBRARY_PARTS = ("site-packages", "dist-packages", "/lib/python")

@dataclass(slots=True)
class Frame:
    file: str
    line: int
    func: str

    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line} ({self.func})"


@dataclass(slots=True)
class Thread:
    ident: str
    current: bool
    frames: list[Frame] = field(default_factory=list)    # most recent call first

    @property
    def is_main(self) -> bool:
        return bool(self.frames) and self.frames[-1].func == "<module>"


def parse(text: str) -> list[Thread]:
    threads: list[Thread] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            threads.append(Thread(m.group(2), m.group(1).lower().startswith("current")))
            continue
        f = _FRAME.match(line)
        if f and threads:
            threads[-1].frames.append(Frame(f["file"], int(f["line"]), f["func"]))
    return threads


def main_thread(threads: list[Thread]) -> Thread | None:
    for t in threads:
        if t.is_main:
            return t
    return next((t for t in threads if t.current), threads[0] if threads else None)


@dataclass(slots=True)
class Where:
    """Where a rank's main thread is: waiting in a collective or not, and a phrase for it."""
    waiting: bool
    phrase: str          # "in load_batch at data.py:88" / "wait in all_reduce (distributed_c10d.py:2501)"
    key: str             # compare ranks by this: the innermost frame


def _is_library(path: str) -> bool:
    return any(part in path for part in _LIBRARY_PARTS)


def _collective(frame: Frame) -> str | None:
    """How to say the collective `frame` waits in, or None if it is not one."""
    path = frame.file.replace("\\", "/")
    for part, what in _WAIT_FILES:
        if part in path:
            return what
    owner = next((who for part, who in _COLLECTIVE_FILES if part in path), None)
    if owner is None:
        return None
    words = [w for w in frame.func.lower().split("_") if w]
    if any(w in _COLLECTIVE_WORDS for w in words) or any(p in _COLLECTIVE_PAIRS for p in zip(words, words[1:])):
        return f"{owner} collective"
    return None


def where(threads: list[Thread]) -> Where | None:
    t = main_thread(threads)
    if t is None or not t.frames:
        return None
    inner = t.frames[0]
    user = next((f for f in t.frames if not _is_library(f.file)), inner)
    for f in t.frames[:40]:      # library frames (a wrapper, a hook's caller) may sit on top
        what = _collective(f)
        if what is not None:
            return Where(True, f"wait in {what} at {f.where()}, called from {user.where()}", f.where())
        if not _is_library(f.file):
            break                # the rank's own code, before any collective: it is not waiting
    return Where(False, f"is in {user.func} at {os.path.basename(user.file)}:{user.line}", user.where())
