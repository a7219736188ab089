"""Read faulthandler's all-threads dump and say where a rank is.

    Thread 0x00007f0c2a1fe640 (most recent call first):
      File "/usr/lib/python3.11/threading.py", line 324 in wait
      ...
    Current thread 0x00007f0c31b2c740 (most recent call first):
      File "/work/train.py", line 88 in load_batch
      File "/work/train.py", line 120 in <module>

The main thread is the one whose outermost frame is a module's top level (`<module>`); others
start in threading's _bootstrap. A rank "waits" when its main thread's innermost frames are in a
collective (torch.distributed, DeepSpeed's comm, the autograd engine where DDP all-reduces).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')
# Innermost frames that mean "waiting for the other ranks", and how to say it.
_COLLECTIVE_FUNCS = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast",
                     "barrier", "all_to_all", "monitored_barrier", "recv", "send", "wait")
_WAIT_FILES = (("torch/distributed/", "a collective"), ("deepspeed/comm/", "a collective"),
               ("torch/autograd/", "backward (DDP's gradient all-reduce runs inside it)"),
               ("deepspeed/runtime/zero/", "a ZeRO collective"))


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


def where(threads: list[Thread]) -> Where | None:
    t = main_thread(threads)
    if t is None or not t.frames:
        return None
    inner = t.frames[0]
    user = next((f for f in t.frames if "site-packages" not in f.file and "/lib/python" not in f.file), inner)
    for f in t.frames[:12]:      # the innermost few: a wrapper (logging, a decorator) may sit on top
        path = f.file.replace("\\", "/")
        if any(name == f.func or f.func.startswith(name + "_") or f.func.endswith("_" + name)
               for name in _COLLECTIVE_FUNCS) and ("torch" in path or "deepspeed" in path or "gloo" in path):
            return Where(True, f"wait in {f.func} ({f.where()}, called from {user.where()})", f.where())
        for part, what in _WAIT_FILES:
            if part in path:
                return Where(True, f"wait in {what} at {f.where()}, called from {user.where()}", f.where())
    return Where(False, f"is in {user.func} at {os.path.basename(user.file)}:{user.line}", user.where())
