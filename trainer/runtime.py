"""Process-level plumbing for the trainer: distributed setup, stop signals, side logs.

Kept out of train.py so the loop there reads top to bottom.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import socket
import threading
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.engine import DistInfo

# A stop code above every signal number: nonfinite_action=stop asks for it, agreed like a signal.
STOP_NONFINITE = 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(need_process_group: bool) -> DistInfo:
    """Read torchrun's / the deepspeed launcher's env; gloo on CPU, nccl on GPU.

    A single process without a launcher gets a 1-rank group only when the engine needs one
    (DeepSpeed always does).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if (world > 1 or need_process_group) and not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("WORLD_SIZE", str(world))
        os.environ.setdefault("LOCAL_RANK", str(local_rank))
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, rank=rank, world_size=world,
                                device_id=device if device.type == "cuda" else None)
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world, device=device)


class StopSignal:
    """SIGTERM / SIGINT set a flag; every rank agrees on it at step boundaries.

    The agreement is an all-reduce of a CPU int on a gloo group, started at the end of one step
    and waited at the end of the next, so it overlaps a whole step and never touches the device.
    Every rank stops at the same step, which a collective checkpoint needs.
    """

    def __init__(self, world_size: int) -> None:
        self.signum = 0
        self._group = dist.new_group(backend="gloo") if world_size > 1 and dist.is_initialized() else None
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._work = None
        self._previous = {}
        for s in (signal.SIGTERM, signal.SIGINT):
            self._previous[s] = signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signum = self.signum or signum

    def request(self, code: int) -> None:
        """Ask every rank to stop, from the training thread (STOP_NONFINITE); a signal wins if first."""
        self.signum = self.signum or code

    def should_stop(self) -> int:
        """Called once per step on every rank; returns the agreed signal number or 0."""
        if self._group is None:
            return self.signum
        agreed = 0
        if self._work is not None:
            self._work.wait()  # a host-side collective, started a step ago: already done
            agreed = int(self._flag.tolist()[0])
        self._flag.fill_(self.signum)
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return agreed

    def restore(self) -> None:
        if self._work is not None:
            self._work.wait()
            self._work = None
        for s, h in self._previous.items():
            signal.signal(s, h)


class LossLog:
    """debug_loss_log: per-step loss and grad norm to JSONL, read on a thread of its own.

    For tests and debugging: the tensors are turned into numbers on the writer thread, never on
    the training thread (that read would be a host-device sync per step).
    """

    def __init__(self, path: str, rank: int) -> None:
        self._file = None
        # One file per rank with "{rank}" in the path, else rank 0's only.
        if not path or ("{rank}" not in path and rank != 0):
            return
        path = path.replace("{rank}", str(rank))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a")
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="trainer-loss-log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            step, values = item
            # Off the training thread: may wait for the device, which is fine here.
            row = {"step": step, **{k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in values.items()}}
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()

    def log(self, step: int, values: dict) -> None:
        if self._file is not None:
            self._queue.put((step, values))

    def close(self) -> None:
        if self._file is not None:
            self._queue.put(None)
            self._thread.join(timeout=60)
            self._file.close()
            self._file = None
