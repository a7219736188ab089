"""Tensor values, read back off the training thread.

Reading a CUDA tensor's value (`.item()`, `float()`, `.cpu()`) makes the host wait for the GPU
queue to drain: a host-device sync on the step path. So the caller's thread only *snapshots*
tensors (`snapshot`): it stacks the 0-dim tensors of one device and dtype into one vector
(one kernel), and on CUDA copies that vector with `non_blocking=True` into a reusable pinned
host buffer and records a CUDA event behind the copy. The `DeferredSender` thread waits on the
event (a blocking-sync event: the thread sleeps, it does not spin) and only then turns the
buffer into Python numbers and sends the record on its own socket.

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
    """One record waiting for the sender thread; `spans` is a telemetry.client.spans.PendingSpans."""
    __slots__ = ("seq", "t_ns", "step", "plain", "groups", "spans", "parts")

    def __init__(self, seq: int, t_ns: int, step: int, plain: dict[str, Any], groups: list[TensorGroup],
                 spans: Any = None, parts: int = 1) -> None:
        self.parts = parts      # TelemetryClient.log's: records this rank sends for the step
        self.seq = seq
        self.t_ns = t_ns
        self.step = step
        self.plain = plain
        self.groups = groups
        self.spans = spans


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


def snapshot(names: list[str], tensors: list[Any], pool: PinnedPool) -> tuple[list[TensorGroup], int]:
    """Freeze the current values of `tensors` without reading them (caller's thread).

    Returns the groups and how many values had to be skipped (not a single element).
    The common case, every tensor 0-dim with one dtype on one device, is one `torch.stack`.
    """
    torch = sys.modules["torch"]
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype is not dtype:
            break  # torch.stack would promote: an int64 count in float32 loses digits
    else:
        try:
            return [_freeze(torch, names, torch.stack(tensors), pool)], 0
        except RuntimeError:  # mixed devices or shapes: the slow path below sorts them out
            pass
    groups: dict[tuple, tuple[list[str], list[Any]]] = {}
    num_skipped = 0
    for name, t in zip(names, tensors):
        if t.dim() != 0:
            if t.numel() != 1:
                num_skipped += 1
                continue
            t = t.reshape(())
        g = groups.setdefault((t.device, t.dtype), ([], []))
        g[0].append(name)
        g[1].append(t)
    out = [_freeze(torch, n, torch.stack(ts), pool) for n, ts in groups.values()]
    return out, num_skipped


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

    Handing a job over must not cost the training thread a wake-up syscall (a futex wake is
    several µs, more than the rest of log()). So the thread polls a deque every
    POLL_INTERVAL_S while records keep coming, and only after PARK_AFTER_IDLE_S without one
    parks on an Event that the next submit() sets: a loop that logs at least once a second
    never pays a wake-up; one that logs less often pays one per record, which it can afford.

    Args:
        make_socket: called on the sender thread to create its own PUSH socket (ZeroMQ sockets
            are not shared between threads; the caller's socket stays lock-free).
        encode: (job, values) -> frame bytes.
        on_sent, on_dropped: counters, called on the sender thread only.
    """

    def __init__(self, make_socket: Callable[[], Any], encode: Callable[[Job, dict], bytes],
                 on_sent: Callable[[], None], on_dropped: Callable[[int], None],
                 max_pending: int = MAX_PENDING) -> None:
        self._make_socket = make_socket
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
        self._linger_ms = 0
        self.pool = PinnedPool()

    def submit(self, job: Job) -> bool:
        """Hand a job over; False (caller counts a drop) when the backlog is full."""
        if self._num_submitted - self._num_done >= self._max_pending:
            return False
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

        sock = self._make_socket()
        jobs = self._jobs
        idle_since = time.monotonic()
        try:
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
                try:
                    values = resolve(job)
                    frame = self._encode(job, values)
                except Exception:  # a value that is no number: lose this record, not the thread
                    self._on_dropped(1)
                else:
                    try:
                        sock.send(frame, zmq.NOBLOCK)
                        self._on_sent()
                    except zmq.ZMQError:  # Again (queue full) or the socket going away
                        self._on_dropped(1)
                self._num_done += 1
                idle_since = time.monotonic()
                if jobs:
                    # A backlog: hand the GIL back to the training thread between records, so
                    # it waits at most one record's resolution, not a 5 ms switch interval.
                    time.sleep(0)
        finally:
            sock.close(linger=self._linger_ms)

    def close(self, timeout_s: float, linger_ms: int) -> bool:
        """Stop after the queued jobs; True if the thread finished (its socket is closed)."""
        if self._thread is None:
            return True
        self._linger_ms = linger_ms
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

