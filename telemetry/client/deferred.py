"""Tensor values, read back off the training thread.

Reading a CUDA tensor's value (`.item()`, `float()`, `.cpu()`) makes the host wait for the GPU
queue to drain: a host-device sync on the step path. So the caller's thread only *snapshots*
tensors (`snapshot`): it stacks the 0-dim tensors of one device and dtype into one vector
(one kernel), and on CUDA copies that vector with `non_blocking=True` into a reusable pinned
host buffer and records a CUDA event behind the copy. The `DeferredSender` thread waits on the
event (a blocking-sync event: the thread sleeps, it does not spin) and only then turns the
buffer into Python numbers and sends the record on the client's socket (see DeferredSender for
how the two threads take turns on it).

This module is the only one that turns a tensor into a number, and it does so only on the
sender thread. It never imports torch: a tensor can only reach it from a caller that already
did, so `sys.modules["torch"]` is there when needed.
"""
from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any, Callable

# Records waiting for their tensors; past this, submit() refuses and the caller counts a drop.
# At one log() per step the sender is idle almost always; this only bounds a stalled GPU.
MAX_PENDING = 1024
# Pinned buffers kept per (dtype, length): the sender gives each back after reading it, so a
# steady loop needs two or three; the rest only cover a backlog.
MAX_POOLED_BUFFERS = 8
# The sender thread's poll period while records keep coming: adds at most this much latency
# to a tensor record (the emit -> subscriber budget is 20 ms) for ~500 cheap wake-ups a second.
POLL_INTERVAL_S = 0.002
# After this long without a record the thread parks, and the next submit() wakes it.
PARK_AFTER_IDLE_S = 1.0


def host_scalar(v: Any) -> float | int:
    """A host value (numpy scalar, bool, Decimal ...) as a wire number; never called on a tensor."""
    if v.__class__ is bool:
        return int(v)
    item = getattr(v, "item", None)
    if item is not None:  # numpy scalars: a host read, no device involved
        v = item()
        return int(v) if v.__class__ is bool else v
    return float(v)


_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1    # what msgpack and the daemon's decoder take


def tensor_refusal(t: Any) -> str:
    """Why a tensor cannot be sent as one number ("" if it can); reads metadata only."""
    if t.is_meta:
        return "a meta tensor (it has no value)"
    if t.is_complex():
        return f"a complex tensor ({t.dtype})"
    if t.is_quantized:
        return f"a quantized tensor ({t.dtype})"
    if t.numel() != 1:
        return f"a tensor of {t.numel()} elements"
    return ""


def wire_number(v: Any, read_tensors: bool = False) -> tuple[Any, str]:
    """(v as a number the protocol takes, "") or (None, why it is not one). A tensor is read only
    with `read_tensors` (the sender thread); the caller's thread snapshots its tensors instead."""
    c = v.__class__
    if c is float or c is bool or v is None:
        return v, ""
    if c is int:
        return (v, "") if _INT_MIN <= v <= _INT_MAX else (None, "an int beyond 64 bits")
    if c is str or c is bytes:
        return None, f"{c.__name__} is not a number"
    if hasattr(v, "detach"):
        why = tensor_refusal(v) if read_tensors else "a tensor"
        if why:
            return None, why
        # CPU-GPU sync point on a device tensor, on the sender thread only: a value of a row too
        # wide to snapshot on the caller's thread (TelemetryClient.log).
        return wire_number(v.detach().reshape(()).item())
    try:
        num = host_scalar(v)
    except Exception:
        return None, f"{c.__name__} is not a number"
    if num.__class__ not in (float, int, bool):
        return None, f"{c.__name__} is not a number"
    return wire_number(num)


class TensorGroup:
    """Some of one record's tensor values, stacked: `names[i]` is `tensor[i]`.

    `tensor` is a pinned CPU buffer on the CUDA path (`event` marks the copy into it and
    `pool` takes it back once read), else the stacked values themselves.
    """
    # Plain __slots__ classes, not dataclasses: `import telemetry` must stay cheap.
    __slots__ = ("names", "tensor", "event", "pool", "pool_key")

    def __init__(self, names: list[str], tensor: Any, event: Any = None, pool: "PinnedPool | None" = None,
                 pool_key: tuple | None = None) -> None:
        self.names = names
        self.tensor = tensor
        self.event = event
        self.pool = pool
        self.pool_key = pool_key


class Job:
    """One record waiting for the sender thread; `spans` is a telemetry.client.spans.PendingSpans.
    `num_seqs`: the sequence numbers it holds from `seq` on (more than one: a row wider than a
    record takes, sent as that many records)."""
    __slots__ = ("seq", "t_ns", "step", "plain", "groups", "spans", "parts", "num_seqs", "unchecked")

    def __init__(self, seq: int, t_ns: int, step: int, plain: dict[str, Any], groups: list[TensorGroup],
                 spans: Any = None, parts: int = 1, num_seqs: int = 1, unchecked: bool = False) -> None:
        self.parts = parts      # TelemetryClient.log's: records this rank sends for the step
        self.num_seqs = num_seqs
        self.unchecked = unchecked   # `plain` is the caller's row as it came: the sender sorts it
        self.seq = seq
        self.t_ns = t_ns
        self.step = step
        self.plain = plain
        self.groups = groups
        self.spans = spans


class Later:
    """A frame made on the sender thread (`make()` returns it): a record whose making costs more
    than the caller's thread may spend (a hello with a huge config), in turn with the others."""
    __slots__ = ("make",)

    def __init__(self, make: Callable[[], bytes]) -> None:
        self.make = make


class PinnedPool:
    """Reusable page-locked host buffers, so a log step allocates no pinned memory.

    `take` runs on the caller's thread, `give` on the sender thread; deque append/pop are
    atomic in CPython, so no lock is needed.
    """

    def __init__(self) -> None:
        self._free: dict[tuple, Any] = {}

    def take(self, torch: Any, dtype: Any, n: int) -> tuple[Any, tuple]:
        key = (dtype, n)
        free = self._free.get(key)
        if free:
            try:
                return free.pop(), key
            except IndexError:
                pass
        return torch.empty(n, dtype=dtype, pin_memory=True), key

    def give(self, key: tuple, buf: Any) -> None:
        free = self._free.get(key)
        if free is None:
            free = self._free.setdefault(key, collections.deque())
        if len(free) < MAX_POOLED_BUFFERS:
            free.append(buf)


def snapshot(names: list[str], tensors: list[Any], pool: PinnedPool) -> tuple[list[TensorGroup], list[tuple[str, str]]]:
    """Freeze the current values of `tensors` without reading them (caller's thread).

    Returns the groups and the values that cannot be sent, as (name, why): not one element,
    meta, complex, quantized, or one torch cannot copy. The common case, every tensor 0-dim with
    one good dtype on one device, is one `torch.stack`.
    """
    torch = sys.modules["torch"]
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype is not dtype:
            break  # torch.stack would promote: an int64 count in float32 loses digits
    else:
        try:
            stacked = torch.stack(tensors)
        except RuntimeError:  # mixed devices or shapes, quantized: the slow path below sorts them out
            pass
        else:
            if stacked.dim() == 1 and not (stacked.is_meta or stacked.is_complex() or stacked.is_quantized):
                return [_freeze(torch, names, stacked, pool)], []
    groups: dict[tuple, tuple[list[str], list[Any]]] = {}
    bad: list[tuple[str, str]] = []
    for name, t in zip(names, tensors):
        why = tensor_refusal(t)
        if why:
            bad.append((name, why))
            continue
        if t.dim() != 0:
            t = t.reshape(())
        g = groups.setdefault((t.device, t.dtype), ([], []))
        g[0].append(name)
        g[1].append(t)
    out = []
    for n, ts in groups.values():
        try:
            out.append(_freeze(torch, n, torch.stack(ts), pool))
        except RuntimeError:      # one by one: only the tensor torch cannot copy is left out
            for name, t in zip(n, ts):
                try:
                    out.append(_freeze(torch, [name], t.reshape(1), pool))
                except RuntimeError as exc:
                    bad.append((name, f"torch cannot copy it ({str(exc).splitlines()[0][:120]})"))
    return out, bad


def _freeze(torch: Any, names: list[str], stacked: Any, pool: PinnedPool) -> TensorGroup:
    if stacked.requires_grad:  # a loss logged before .detach(): hold values, not the graph
        stacked = stacked.detach()
    if stacked.is_cuda:
        buf, key = pool.take(torch, stacked.dtype, stacked.shape[0])
        # Enqueued on the current stream after the work that produced the values, so the
        # buffer holds exactly the values as of this log() call; nothing waits here.
        buf.copy_(stacked, non_blocking=True)
        # blocking=True: the sender thread's synchronize() sleeps instead of spinning a core.
        event = torch.cuda.Event(blocking=True)
        event.record(torch.cuda.current_stream(stacked.device))
        return TensorGroup(names, buf, event, pool, key)
    # CPU (or another device): the stack is already a private copy of the values; the sender
    # reads it (for a non-CPU device that read waits on the sender thread, never here).
    return TensorGroup(names, stacked)


class DeferredSender:
    """One background thread per client: resolves jobs' tensors and spans, then sends.

    It sends on the client's own socket, and only while it has a job: the caller sends on that
    socket only while nothing is pending here, and queues its records behind the jobs otherwise
    (a ready frame, `submit_frame`). So one socket carries every record of the client, in the
    order of its calls (two sockets are two pipes, which the daemon's ingest socket interleaves
    in any order), and the socket passes between the two threads without a lock: the pending
    count (two counters, each written by one thread) says whose it is, and the GIL orders the
    hand-over (the full memory barrier ZeroMQ asks for when a socket changes threads).

    Handing a job over must not cost the training thread a wake-up syscall (a futex wake is
    several µs, more than the rest of log()). So the thread polls a deque every
    POLL_INTERVAL_S while records keep coming, and only after PARK_AFTER_IDLE_S without one
    parks on an Event that the next submit() sets: a loop that logs at least once a second
    never pays a wake-up; one that logs less often pays one per record, which it can afford.

    Args:
        send: sends one frame on the client's socket without blocking; raises zmq.ZMQError when
            it cannot (queue full, socket closed). Called on the sender thread only while a job
            is pending.
        encode: (job, values) -> frame bytes, or a list of frames (a row split for the wire).
        on_sent, on_dropped: counters, called on the sender thread only.
    """

    def __init__(self, send: Callable[[bytes], Any], encode: Callable[[Job, dict], "bytes | list[bytes]"],
                 on_sent: Callable[[], None], on_dropped: Callable[[int], None],
                 max_pending: int = MAX_PENDING) -> None:
        self._send = send
        self._encode = encode
        self._on_sent = on_sent
        self._on_dropped = on_dropped
        self._max_pending = max_pending
        self._jobs: collections.deque = collections.deque()  # append/popleft: atomic, no lock
        self._wake = threading.Event()
        self._parked = False
        self._closing = False
        # Two counters, each written by one thread only, so pending() needs no lock.
        self._num_submitted = 0
        self._num_done = 0
        self._thread: threading.Thread | None = None
        self.pool = PinnedPool()

    def submit(self, job: "Job | Later | bytes") -> bool:
        """Hand a job over (a Job, or a ready frame that must wait its turn behind the jobs before
        it); False (caller counts a drop) when the backlog is full."""
        if self._num_submitted - self._num_done >= self._max_pending or self._closing:
            return False        # (after close(): a thread stuck on a device may never send it)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="telemetry-sender", daemon=True)
            self._thread.start()
        self._num_submitted += 1
        self._jobs.append(job)
        if self._parked:  # read after the append: see _park for why no job is missed
            self._wake.set()
        return True

    def pending(self) -> int:
        return self._num_submitted - self._num_done

    def _park(self) -> None:
        self._wake.clear()
        self._parked = True
        # A submit() that appended before this line is seen here; one that appends after it
        # reads _parked == True and sets the event. Either way the job is not left waiting.
        if not self._jobs and not self._closing:
            self._wake.wait()
        self._parked = False

    def _run(self) -> None:
        import zmq

        send = self._send
        jobs = self._jobs
        idle_since = time.monotonic()
        while True:
            try:
                job = jobs.popleft()
            except IndexError:
                if self._closing:
                    # close() sets _closing after the caller's last submit(): a job appended
                    # between the empty pop above and this check is seen now, not left behind.
                    if jobs:
                        continue
                    return
                if time.monotonic() - idle_since < PARK_AFTER_IDLE_S:
                    time.sleep(POLL_INTERVAL_S)
                else:
                    self._park()
                    idle_since = time.monotonic()
                continue
            frames: Any = job
            if job.__class__ is not bytes:
                try:
                    frames = job.make() if job.__class__ is Later else self._encode(job, resolve(job))
                except Exception:  # a value that is no number: lose this record, not the thread
                    frames = None
                    self._on_dropped(getattr(job, "num_seqs", 1))
            if frames is not None:
                for frame in ((frames,) if frames.__class__ is bytes else frames):
                    try:
                        send(frame)
                        self._on_sent()
                    except zmq.ZMQError:  # Again (queue full) or the socket going away
                        self._on_dropped(1)
            # Last: from here on the caller may use the socket again (see the class docstring).
            self._num_done += 1
            idle_since = time.monotonic()
            if jobs:
                # A backlog: hand the GIL back to the training thread between records, so
                # it waits at most one record's resolution, not a 5 ms switch interval.
                time.sleep(0)

    def close(self, timeout_s: float) -> bool:
        """Stop after the queued jobs; True if the thread finished (it no longer uses the
        socket; False: it is stuck on a device, and may still send when that wakes it)."""
        if self._thread is None:
            return True
        self._closing = True
        self._wake.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


def resolve(job: Job) -> dict[str, float | int]:
    """Turn a job's tensors into numbers (sender thread only: this may wait on the device)."""
    values = dict(job.plain)
    for g in job.groups:
        if g.event is not None:
            # CPU-GPU sync point, on the sender thread only: waits (sleeping: a blocking-sync
            # event) until the copy into the pinned buffer has landed.
            g.event.synchronize()
        nums = g.tensor.tolist()  # pinned/CPU memory: no sync (another device: one, here)
        if nums and nums[0].__class__ is bool:
            nums = [int(x) for x in nums]
        values.update(zip(g.names, nums))
        if g.pool is not None:
            g.pool.give(g.pool_key, g.tensor)
    if job.spans is not None:
        values.update(job.spans.resolve())
    return values

