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

import _thread
import collections
import sys
import threading
import time
from typing import Any, Callable

from telemetry.client.fastlog import PyLogState

# Records waiting for their tensors; past this, submit() refuses and the caller counts a drop.
# At one log() per step the sender is idle almost always; this only bounds a stalled GPU (each
# such record holds a pinned buffer).
MAX_PENDING = 1024
# Pinned buffers kept per (dtype, length): the sender gives each back after reading it, so a
# steady loop needs two or three; the rest only cover a backlog.
MAX_POOLED_BUFFERS = 8
# The sender thread's poll period right after a record: at a step of a millisecond or less the
# thread wakes once per this long, and sends what came meanwhile as one batch (at a step of a
# millisecond, a much shorter period costs the process about as much CPU per record as a send on
# the caller's thread; this one, markedly less: benchmarks/RESULTS.md, Client cost).
POLL_INTERVAL_S = 0.005
# Each empty poll doubles the period, up to this: the most latency a record waits here (the
# emit -> subscriber budget is 20 ms), and ~10 wake-ups (a GIL hand-over each in a
# training thread that runs Python) per record at a step of 100 ms.
MAX_POLL_INTERVAL_S = 0.010
# After this long without a record the thread parks; the next item queued wakes it (a lock
# release: a system call that wakes a thread, which on a busy machine may pre-empt the caller).
# The client sends a record logged this long after the previous one itself, so a loop this slow
# leaves the thread parked (TelemetryClient.log: DIRECT_AFTER_NS).
PARK_AFTER_IDLE_S = 0.02

def host_scalar(v: Any) -> float | int | bool:
    """A host value (numpy scalar, Decimal ...) as a wire number; never called on a tensor. A
    numpy bool is a bool, as a Python bool is on the wire (W&B keeps true/false, not 1/0)."""
    if v.__class__ is bool:
        return v
    item = getattr(v, "item", None)
    if item is not None:  # numpy scalars: a host read, no device involved
        return item()
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
    """One background thread per client: it does every send on the client's socket, in the order
    of the client's calls.

    The caller's thread encodes a record (or, for tensors and spans, snapshots it into a Job)
    and appends it to a deque: no system call, no ZeroMQ call, no lock. This thread takes what
    the deque holds as one batch, resolves the Jobs' tensors and spans (which may wait on a
    device, here only), and sends each frame with NOBLOCK. One socket carries every record of
    the client, in the order of its calls (two sockets are two pipes, which the daemon's ingest
    socket interleaves in any order). The caller's thread sends on that socket itself only the
    rare records (a hello, an event) and only while nothing is queued here: the pending count
    (two counters, each written by one thread) says whose the socket is, and the GIL orders the
    hand-over (the full memory barrier ZeroMQ asks for when a socket changes threads).

    Handing a record over must not cost the training thread a wake-up syscall (a futex wake is
    several µs, more than the rest of log()). So the thread polls the deque: every
    POLL_INTERVAL_S right after a record, the period doubling with each empty poll up to
    MAX_POLL_INTERVAL_S, and sends what came meanwhile as one batch (one wake-up of this thread
    and of ZeroMQ's I/O thread per batch, not per record). After PARK_AFTER_IDLE_S without a
    record it parks on a lock that the next item queued releases. (The client does not queue
    the record of a loop slower than that, but sends it itself: see TelemetryClient.log.)

    Bounded: at most `max_queued` items wait here (of them at most `max_jobs` Jobs, which hold
    pinned buffers while a device is stalled); past that submit() refuses and the caller counts
    a drop, which rides in-band in its next records.

    Args:
        send: sends one frame on the client's socket without blocking; raises zmq.ZMQError when
            it cannot (queue full, socket closed). Called on the sender thread only while an
            item is pending.
        encode: (job, values) -> frame bytes, or a list of frames (a row split for the wire).
        on_sent, on_dropped: counters, called on the sender thread only, with a count.
        state: where the counters the client's log() reads live (telemetry/client/fastlog.py):
            `submitted`, `done`, `room`, `parked`; a state of its own when None.
    """

    # The counters the client's log() reads (or, its common case in C, writes), kept in its state.
    _num_submitted = property(lambda self: self._st.submitted, lambda self, v: setattr(self._st, "submitted", v))
    _num_done = property(lambda self: self._st.done, lambda self, v: setattr(self._st, "done", v))
    _room = property(lambda self: self._st.room, lambda self, v: setattr(self._st, "room", v))
    _parked = property(lambda self: self._st.parked, lambda self, v: setattr(self._st, "parked", v))

    def __init__(self, send: Callable[[bytes], Any], encode: Callable[[Job, dict], "bytes | list[bytes]"],
                 on_sent: Callable[[int], None], on_dropped: Callable[[int], None],
                 max_pending: int = MAX_PENDING, max_queued: int | None = None, state: Any = None) -> None:
        self._st = state if state is not None else PyLogState()
        self._send = send
        self._encode = encode
        self._on_sent = on_sent
        self._on_dropped = on_dropped
        self._max_jobs = max_pending
        self._max_queued = max_queued or max_pending
        self._jobs: collections.deque = collections.deque()  # append/popleft: atomic, no lock
        # A binary semaphore: held while nobody asked for a wake-up; a parked thread blocks on
        # acquire() until a submit releases it (a plain lock: the cheapest wake CPython has).
        self._bell = _thread.allocate_lock()
        self._bell.acquire()
        self._parked = False
        self._closing = False
        # Counters, each written by one thread only, so pending() needs no lock: items handed
        # over and items done (the caller's: submitted; the sender's: done), and the same for
        # Jobs alone.
        self._num_submitted = 0
        self._num_done = 0
        self._num_jobs = 0
        self._num_jobs_done = 0
        self._thread: threading.Thread | None = None
        # What the caller may append without calling submit() (log()'s common case, fastlog.py,
        # for ready frames): 0 until the thread runs and once closing.
        self._room = 0
        self.pool = PinnedPool()

    def submit(self, job: "Job | Later | bytes") -> bool:
        """Hand an item over: a ready frame, a Job (tensors, spans, a row to split) or a Later;
        False (the caller counts a drop) when the queue is full or the sender is closing."""
        if self._num_submitted - self._num_done >= self._max_queued or self._closing:
            return False        # (after close(): a thread stuck on a device may never send it)
        if job.__class__ is not bytes:
            if self._num_jobs - self._num_jobs_done >= self._max_jobs:
                return False
            self._num_jobs += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="telemetry-sender", daemon=True)
            self._thread.start()
            self._room = self._max_queued
        self._num_submitted += 1
        self._jobs.append(job)
        if self._parked:  # read after the append: see _park for why no item is missed
            self._ring()
        return True

    def _ring(self) -> None:
        self._parked = False
        try:
            self._bell.release()
        except RuntimeError:    # already released (a second ring before the thread woke): fine
            pass

    def pending(self) -> int:
        return self._num_submitted - self._num_done

    def flush(self, timeout_s: float) -> bool:
        """Wait until what was submitted before this call has been handed to the socket (or
        dropped), at most `timeout_s`; True if it has. Never on the hot path (stats())."""
        target = self._num_submitted
        if self._num_done >= target or self._thread is None:
            return True
        deadline = time.monotonic() + timeout_s
        self._ring()
        while self._num_done < target and self._thread.is_alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0002)
        return self._num_done >= target

    def _park(self) -> None:
        self._parked = True
        # A submit() that appended before this line is seen here; one that appends after it
        # reads _parked == True and releases the bell. Either way the item is not left waiting
        # (a release that finds the thread not blocked only makes its next park return at once).
        if not self._jobs and not self._closing:
            self._bell.acquire()
        self._parked = False

    def _run(self) -> None:
        import zmq

        send = self._send
        jobs = self._jobs
        popleft = jobs.popleft
        ZMQError = zmq.ZMQError
        idle_since = time.monotonic()
        period = POLL_INTERVAL_S
        while True:
            try:
                job = popleft()
            except IndexError:
                if self._closing:
                    # close() sets _closing after the caller's last submit(): an item appended
                    # between the empty pop above and this check is seen now, not left behind.
                    if jobs:
                        continue
                    return
                if time.monotonic() - idle_since < PARK_AFTER_IDLE_S:
                    # A sleep that flush() and close() can cut short (log() rings only a parked
                    # thread: no system call on its path while this one polls).
                    self._bell.acquire(timeout=period)
                    period = min(2 * period, MAX_POLL_INTERVAL_S)
                else:
                    self._park()
                    idle_since = time.monotonic()
                    period = POLL_INTERVAL_S
                continue
            # One batch: this item and what is queued behind it now. Ready frames are sent in a
            # tight loop; a Job is resolved first (it may wait for its device), the items behind
            # it wait their turn. The counts are updated before the items are marked done: once
            # pending() says 0, stats() adds up.
            sent = dropped = done = 0
            for _ in range(len(jobs) + 1):
                if job is None:
                    job = popleft()
                if job.__class__ is bytes:
                    try:
                        send(job)
                        sent += 1
                    except ZMQError:  # Again (queue full, no daemon) or the socket going away
                        dropped += 1
                    done += 1
                    job = None
                    continue
                if done:               # what is sent so far counts now, before a possibly long wait
                    self._settle(sent, dropped, done)
                    sent = dropped = done = 0
                frames: Any = None
                try:
                    frames = job.make() if job.__class__ is Later else self._encode(job, resolve(job))
                except Exception:  # a value that is no number: lose this record, not the thread
                    dropped += getattr(job, "num_seqs", 1)
                job = None
                if frames is not None:
                    for frame in ((frames,) if frames.__class__ is bytes else frames):
                        try:
                            send(frame)
                            sent += 1
                        except ZMQError:
                            dropped += 1
                self._num_jobs_done += 1
                self._settle(sent, dropped, 1)
                sent = dropped = done = 0
                if jobs:
                    # Hand the GIL back to the training thread between records that took work
                    # here, so it waits at most one record's resolution, not a switch interval.
                    time.sleep(0)
            if done:
                self._settle(sent, dropped, done)
            idle_since = time.monotonic()
            period = POLL_INTERVAL_S

    def _settle(self, sent: int, dropped: int, done: int) -> None:
        if sent:
            self._on_sent(sent)
        if dropped:
            self._on_dropped(dropped)
        # Last: once nothing is pending the caller may use the socket again.
        self._num_done += done

    def close(self, timeout_s: float) -> bool:
        """Stop after the queued items; True if the thread finished (it no longer uses the
        socket; False: it is stuck on a device, and may still send when that wakes it)."""
        if self._thread is None:
            return True
        self._room = 0
        self._closing = True
        self._ring()
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
        nums = g.tensor.tolist()  # pinned/CPU memory: no sync (another device: one, here); bools stay bools
        values.update(zip(g.names, nums))
        if g.pool is not None:
            g.pool.give(g.pool_key, g.tensor)
    if job.spans is not None:
        values.update(job.spans.resolve())
    return values

