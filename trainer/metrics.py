"""Step metrics kept on the device, and phase timers that are read without waiting.

Nothing here turns a device tensor into a Python number: values leave as 0-dim tensors for
the telemetry client, which resolves them on its own thread. Accumulators are reset in place
only after the tensors handed out have been computed from them (new tensors, queued on the
same stream before the reset), so a late read-back still sees the right values.
"""
from __future__ import annotations

import collections
import time

import torch


class DatasetMetrics:
    """Per-dataset loss sum, correct-token count and token count, accumulated with index_add_."""

    def __init__(self, names: list[str], device: torch.device) -> None:
        self.names = names
        n = len(names)
        self.loss_sum = torch.zeros(n, dtype=torch.float32, device=device)
        self.correct = torch.zeros(n, dtype=torch.float32, device=device)
        self.count = torch.zeros(n, dtype=torch.float32, device=device)

    @torch.no_grad()
    def update(self, token_loss: torch.Tensor, correct: torch.Tensor, labels_valid: torch.Tensor,
               dataset_ids: torch.Tensor) -> None:
        """Add one micro-batch; all arguments [B, S] on device."""
        # Invalid positions go to dataset 0 with weight 0: no boolean indexing (that would sync
        # to learn the output size).
        idx = dataset_ids.clamp(min=0).view(-1)
        w = labels_valid.view(-1).float()
        self.loss_sum.index_add_(0, idx, token_loss.detach().view(-1).float() * w)
        self.correct.index_add_(0, idx, correct.view(-1).float() * w)
        self.count.index_add_(0, idx, w)

    def values(self, prefix: str = "dataset") -> dict[str, torch.Tensor]:
        """0-dim tensors per dataset (loss, accuracy, tokens); NaN where a dataset had no tokens."""
        denom = self.count
        loss = self.loss_sum / denom
        acc = self.correct / denom
        out = {}
        for i, name in enumerate(self.names):
            out[f"{prefix}/{name}/loss"] = loss[i]
            out[f"{prefix}/{name}/accuracy"] = acc[i]
            out[f"{prefix}/{name}/tokens"] = self.count[i].clone()
        return out

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.correct.zero_()
        self.count.zero_()


class PhaseTimer:
    """Times step phases: CUDA events on GPU (read once complete, never waited on), perf_counter on CPU.

    Per step: `start(phase)` / `stop(phase)` around each phase (a phase may repeat, e.g. one
    forward per micro-batch), then `end_step()`. `latest()` returns the summed seconds per phase
    of the newest step whose events have all completed (on GPU that may be a step or two back).
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pending: collections.deque = collections.deque()
        self._current: list = []
        self._open: dict = {}
        self._latest: dict[str, float] = {}
        self._parts: dict[str, str] = {}    # phase -> its part that ends at the last lap()
        self._laps: dict[str, object] = {}  # part -> the stamp of its latest lap in the open phase

    def _stamp(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def start(self, phase: str) -> None:
        self._open[phase] = self._stamp()

    def is_open(self, phase: str) -> bool:
        return phase in self._open

    def stop(self, phase: str) -> None:
        begun, now = self._open.pop(phase), self._stamp()
        self._current.append((phase, begun, now))
        part = self._parts.get(phase)
        if part is not None:  # no lap in this phase (a micro-batch without a collective): all of it
            self._current.append((part, begun, self._laps.pop(part, now)))

    def split(self, phase: str, part: str) -> None:
        """Time `part` of every `phase`: from the phase's start to its last `lap(part)`, or the
        whole phase where it had none."""
        self._parts[phase] = part

    def lap(self, part: str) -> None:
        """`part` of its open phase lasts until now (the latest lap in the phase counts)."""
        self._laps[part] = self._stamp()

    def end_step(self) -> None:
        self._pending.append(self._current)
        self._current = []
        while len(self._pending) > 16:  # bounded backlog; a few steps in flight is normal on GPU
            self._pending.popleft()

    def latest(self) -> dict[str, float]:
        while self._pending:
            spans = self._pending[0]
            if self.cuda and spans and not spans[-1][2].query():
                break  # not done yet: keep the older reading, never wait
            durs: dict[str, float] = {}
            for phase, a, b in spans:
                d = a.elapsed_time(b) / 1e3 if self.cuda else b - a
                durs[phase] = durs.get(phase, 0.0) + d
            self._latest = durs
            self._pending.popleft()
        return self._latest


def time_update(optimizer: torch.optim.Optimizer, timer: PhaseTimer, on_begin) -> tuple:
    """Time the optimizer's own update (its step(), which holds no collective even where the
    engine's step does, as under ZeRO 1-3) as the phase "optimizer_update", nested in the
    optimizer phase; `on_begin()` runs as it begins (fault injection). A step pre- and post-hook:
    a timestamp each (a CUDA event on GPU), no sync. Returns the hooks' handles (`.remove()`)."""
    def begins(*_) -> None:  # a step pre-hook: what it returns would replace step()'s arguments
        timer.start("optimizer_update")
        on_begin()

    def ends(*_) -> None:
        timer.stop("optimizer_update")

    return optimizer.register_step_pre_hook(begins), optimizer.register_step_post_hook(ends)


def _forward_wait_hooks(timer: PhaseTimer, phase: str) -> tuple:
    """Two forward pre-hooks that bracket a wait inside a training forward as `phase`: `before`
    (registered to run ahead of the waiting hook or module) starts it, `after` stops it. Only in a
    training forward (not eval, not a checkpointed recompute in backward)."""
    def before(mod, _args) -> None:  # a forward pre-hook: what it returns would replace the inputs
        if mod.training and timer.is_open("forward"):
            timer.start(phase)

    def after(mod, _args) -> None:
        if timer.is_open(phase):
            timer.stop(phase)

    return before, after


def time_gather_waits(model: torch.nn.Module, timer: PhaseTimer) -> list:
    """ZeRO-3 with partitioned parameters: time the waits for the parameter all-gathers inside
    forward as the phase "forward_gather_wait" (nested in forward), so that forward minus it is
    the rank's own compute. DeepSpeed gathers a module's parameters in a forward pre-hook; around
    it go two more, one run before it (prepend) and one after: the time between them is that
    module's gather, its wait for the slowest rank included (on a GPU, CUDA events on the compute
    stream, which waits for the gather there: no sync). Only in a training forward (not eval, not
    a checkpointed recompute in backward). Returns the hooks' handles (`.remove()`)."""
    before, after = _forward_wait_hooks(timer, "forward_gather_wait")
    handles = []
    for m in model.modules():
        if next(m.parameters(recurse=False), None) is None:
            continue                 # DeepSpeed gathers a module's own parameters: none, no wait
        handles.append(m.register_forward_pre_hook(before, prepend=True))
        handles.append(m.register_forward_pre_hook(after))
    return handles


def ddp_of(model: torch.nn.Module):
    """The DistributedDataParallel wrapper in `model` (compiled or not), or None."""
    from torch.nn.parallel import DistributedDataParallel
    model = getattr(model, "_orig_mod", model)   # torch.compile's wrapper
    return model if isinstance(model, DistributedDataParallel) else None


def time_ddp_waits(ddp, timer: PhaseTimer) -> list:
    """DDP: time its two collective waits apart, so that forward and backward minus them are
    this rank's own compute (a rank slow in forward or backward then shows in its compute, not in
    the others' waits).

    forward: DDP's forward broadcasts the buffers from rank 0 (broadcast_buffers, at every
    training forward of a model with buffers: rotary inv_freq, norms' running stats) before it
    calls the wrapped module; the ranks wait there for the slowest. A forward pre-hook on the
    wrapper (run before its forward) and one on the wrapped module (run after DDP's own work)
    bracket it as "forward_sync_wait", nested in forward.
    backward: DDP launches a bucket's gradient all-reduce as the bucket fills and waits for them
    all at the end of backward. A communication hook (the default all-reduce, called through
    torch's own allreduce_hook) laps "backward_compute" as it launches each bucket: the phase's
    start to the last launch is this rank's backward compute; the rest is the wait. On a GPU the
    stamps are CUDA events: no sync.
    Returns the hooks' handles (`.remove()`; the communication hook stays: it is DDP's default)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    before, after = _forward_wait_hooks(timer, "forward_sync_wait")

    def launch(process_group, bucket):
        timer.lap("backward_compute")
        return allreduce_hook(process_group, bucket)

    timer.split("backward", "backward_compute")
    ddp.register_comm_hook(None, launch)
    return [ddp.register_forward_pre_hook(before, prepend=True), ddp.module.register_forward_pre_hook(after)]


class HostFlag:
    """A device counter copied to host behind an event; `poll()` answers without waiting."""

    def __init__(self, device: torch.device, size: int = 1) -> None:
        self.cuda = device.type == "cuda"
        self.value = torch.zeros(size, dtype=torch.float32, device=device)
        self._host = torch.zeros(size, dtype=torch.float32, pin_memory=self.cuda)
        self._event = torch.cuda.Event() if self.cuda else None
        self._in_flight = False

    def add(self, x: torch.Tensor) -> None:
        self.value += x

    def start_readback(self) -> None:
        if self._in_flight:
            return
        self._host.copy_(self.value, non_blocking=True)
        if self._event is not None:
            self._event.record()
        self._in_flight = True

    def poll(self) -> list[float] | None:
        """The counter as of the last start_readback(), once the copy has landed; else None."""
        if not self._in_flight or (self._event is not None and not self._event.query()):
            return None
        self._in_flight = False
        # The copy has completed (event queried above, or a CPU copy): a host read, not a sync.
        return self._host.tolist()


def memory_stats(device: torch.device) -> dict[str, float]:
    """CUDA caching-allocator counters: host-side bookkeeping, no device sync. Empty on CPU."""
    if device.type != "cuda":
        return {}
    s = torch.cuda.memory_stats(device)
    gb = 1024 ** 3
    return {"memory/allocated_gb": s.get("allocated_bytes.all.current", 0) / gb,
            "memory/max_allocated_gb": s.get("allocated_bytes.all.peak", 0) / gb,
            "memory/reserved_gb": s.get("reserved_bytes.all.current", 0) / gb,
            "memory/alloc_retries": s.get("num_alloc_retries", 0),
            "memory/num_ooms": s.get("num_ooms", 0)}
