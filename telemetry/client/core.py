"""TelemetryClient: the only telemetry code that runs inside a training process.

`log()` is the whole cost a training step pays for telemetry, so it does as little as a Python
call can. Where the daemon reads rings (a local daemon of this version: telemetry/shared/ring.py),
it encodes the record and writes it into the client's record ring, shared memory the daemon
polls: a copy and a store, no system call, no thread woken, at any cadence; only the bye goes on
the socket. Otherwise (a daemon over TCP, one of a version before rings, or
$TELEMETRY_TRANSPORT=zmq) it is one msgpack encode of a prebuilt tuple and one append to the client's
queue, which a sender thread (telemetry/client/deferred.py) drains in batches onto the client's
one ZeroMQ socket: no system call on the training thread, and at a step of a millisecond a small fraction of
what a send costs it there (a send after other work wakes ZeroMQ's I/O thread, which on a busy
machine pre-empts the caller). A loop slower than DIRECT_AFTER_NS per record, with nothing
queued, sends itself (NOBLOCK): the sender thread has parked by then, and waking it per record
costs more CPU than the send. It never waits. When a queue is full (the client's or the
socket's, SNDHWM each), or no daemon is there to drain them, the record is dropped and counted;
the count and a per-client sequence number ride in every record, so the daemon reports loss
exactly (loss per src = max seq + 1 - records received).

Tensor values are never read on the caller's thread (reading a CUDA tensor is a host-device
sync). The encoder meets a tensor only through its `default` hook, which aborts the encode; that
record then takes the deferred path (telemetry/client/deferred.py): the tensors are stacked and, on
CUDA, copied non-blocking into pinned memory behind an event; a sender thread waits on the
event and sends, on the client's one socket, while every later record waits behind it: the
daemon gets a client's records in the order of its calls. A record of plain floats and ints,
pays no per-value Python work at all: msgpack checks the types in C. (msgpack, not msgspec, on this side: the
same bytes, and it imports several times faster than msgspec, which the start-up budget needs.)

Threads and processes: log/event/hello/span/close are meant for the one thread that trains.
A forked child (a DataLoader worker) never touches the parent's sockets: an at-fork hook marks
every client, and the child's first call opens its own context, socket and `src`.
"""
from __future__ import annotations

import abc
import atexit
import functools
import operator
import os
import sys
import time
import warnings
import weakref
from typing import Any, Callable, Mapping

import zmq

from protocol import codec
from protocol.constants import (CLIENT_TIME_KEY, KIND_METRICS, MAX_FRAME_BYTES, MAX_NAME_CHARS, MAX_PARTS, MAX_STEP,
                                MAX_VALUES, PROTOCOL_VERSION)
from telemetry.shared import endpoints, ring
from telemetry.shared.client_page import ClientPage, private_seqs
from telemetry.client.deferred import (PARK_AFTER_IDLE_S, DeferredSender, Job, Later, host_scalar, snapshot,
                                       wire_number)
from telemetry.client.fastlog import new_state
from telemetry.client.spans import Span, SpanRecorder
from telemetry.client.stacks import register as register_stacks
from telemetry.shared.numbers import is_int
from telemetry.shared.stacks_file import proc_start_time, proc_started_at
from telemetry.shared.security.redact import Redactor

# Records queued before log() starts dropping (in a ring: 256 bytes each, 2.44 MiB per rank):
# minutes of a daemon restart at one log per step, and bounded.
SNDHWM = 10_000
# How long close() lets queued records drain to a live daemon; a gone daemon costs this much
# at exit, never more.
LINGER_MS = 1000
CLOSE_TIMEOUT_S = 1.5
# stats() waits at most this long for the sender thread to hand over the records logged before it.
STATS_FLUSH_S = 0.5
# atexit gives every still-open client this long: a trainer that forgot close() must still exit.
ATEXIT_CLOSE_TIMEOUT_S = 0.5

# The environment launchers set, in the order we trust them: torchrun and the deepspeed
# launcher set RANK/LOCAL_RANK/WORLD_SIZE; the rest cover mpirun and srun.
_RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
_LOCAL_RANK_ENV = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
_WORLD_SIZE_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")

_NOBLOCK = zmq.NOBLOCK
_perf_ns = time.perf_counter_ns
_monotonic_ns = time.monotonic_ns
_time_ns = time.time_ns
_ZMQError = zmq.ZMQError
# A log() call this long (or more) after the previous one, with nothing queued, sends on the
# caller's thread; a closer one is queued for the sender thread (DeferredSender). The sender
# parks after as long without a record: at a slower cadence it would be woken for every record,
# a wake-up (and its empty polls before) costing the process more CPU than the send itself.
DIRECT_AFTER_NS = int(PARK_AFTER_IDLE_S * 1e9)
# The time this client spent inside its log() and event() calls on the caller's thread, as a
# cumulative number of seconds (every call timed, with CLOCK_MONOTONIC), rides along in a metrics
# record at most once a second (the goodput ledger's telemetry bucket; the catalogue has it).
OWN_TIME_KEY = CLIENT_TIME_KEY
OWN_TIME_EVERY_NS = 1_000_000_000
# A row of more values than this is sent as records of at most this many: one such record fits
# MAX_FRAME_BYTES whatever its names (each name at most MAX_NAME_CHARS characters of up to 4
# UTF-8 bytes, 3 bytes of header, a value of at most 9 bytes).
MAX_WIRE_VALUE_BYTES = 3 + 9
FRAME_HEADER_BYTES = 128
SPLIT_VALUES = (MAX_FRAME_BYTES - FRAME_HEADER_BYTES) // (4 * MAX_NAME_CHARS + MAX_WIRE_VALUE_BYTES)
# A record of more than MAX_VALUES values encodes to at least this many bytes (a value is at least
# a one-character name and a one-byte number, each with a one-byte header): a shorter frame needs
# no look at its width.
ROOMY_FRAME_BYTES = 3 * MAX_VALUES
# hello(): an info of more entries than this (its own and those of the maps directly in it) is
# copied on the caller's thread (C speed) and redacted, encoded and fitted to MAX_FRAME_BYTES on the
# sender thread: a config of 200,000 keys costs the training thread no Python work per key.
HELLO_INLINE_ENTRIES = 4096
# Values left out of records are named in a warning each, up to this many names in all.
MAX_WARNED_NAMES = 64

_live_clients: "weakref.WeakSet[TelemetryClient]" = weakref.WeakSet()
# A forked child's inherited zmq objects: kept referenced so no destructor ever runs on them
# in the child (they belong to the parent's I/O thread, which the child does not have).
_abandoned_after_fork: list[Any] = []
# What a close() could not shut because its sender thread had not finished (see close()): never
# garbage-collected before the process exits.
_left_to_exit: list[Any] = []
# Each open client's context and sockets, until its close(): a client dropped unclosed (a failed
# test's, a script's that forgot) would leave them to the garbage collector, whose pyzmq
# Context.__del__ terminates the context and can wait for ever on a socket it has not closed
# (a hang of the whole process in whatever allocation set the collector off). Held here, they go
# with the process (pyzmq does not terminate a context at exit); the atexit hook closes the
# clients still referenced.
_held_until_close: dict[int, Any] = {}


class _NeedsDeferral(Exception):
    """Raised by the encoder hook on a tensor: this record goes the deferred path."""


def _wire_hook(obj: Any) -> Any:
    # Called by msgpack only for a type it does not encode natively, i.e. never for a record
    # of plain floats and ints.
    if hasattr(obj, "detach"):
        raise _NeedsDeferral
    return host_scalar(obj)


def _info_hook(obj: Any) -> Any:
    """Free-form maps (hello info, event data): numbers stay numbers, anything else is text."""
    if hasattr(obj, "detach"):
        raise TypeError("tensors belong in log(), not in event()/hello() data")
    try:
        return host_scalar(obj)
    except (TypeError, ValueError):
        return str(obj)


_PLAIN = (str, int, float, bool, type(None))
# Nesting kept in hello info and event data; deeper levels become text (the daemon refuses
# frames nested beyond its decoder's limit, and a config is never this deep).
MAX_INFO_DEPTH = 32


def _to_wire(obj: Any, depth: int) -> Any:
    if isinstance(obj, _PLAIN):
        return obj
    if depth >= MAX_INFO_DEPTH:
        return str(obj)
    if isinstance(obj, Mapping):
        return {k if isinstance(k, str) else str(k): _to_wire(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_to_wire(v, depth + 1) for v in obj]
    return _info_hook(obj)


def _to_wire_map(data: Mapping[str, Any] | None) -> dict[str, Any]:
    """Hello info and event data as plain maps, lists, strings and numbers (str keys)."""
    if not data:
        return {}
    return _to_wire(dict(data), 0)


def _env_int(names: tuple[str, ...], default: int) -> int:
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"${n}={v!r} is not an integer") from None
    return default


def _disabled(endpoint: str | None) -> bool:
    return endpoint == "" or endpoints.telemetry_disabled()


def _new_src() -> int:
    # os.urandom, not `random`: unaffected by a seeded training run, distinct after fork.
    return int.from_bytes(os.urandom(8), "little") >> 1


class TelemetryClient(metaclass=abc.ABCMeta):   # ABCMeta: DisabledClient registers as one
    """Send training telemetry to the daemon without ever blocking or syncing the caller.

    Args:
        endpoint: the daemon's ingest socket; None: $TELEMETRY_ENDPOINT or the default ipc
            socket (telemetry.shared.endpoints). "" or $TELEMETRY_DISABLED=1 gives a DisabledClient.
        rank: global rank; None: $RANK (or the mpirun/srun equivalents), else 0.
        sndhwm: records queued before drops start, in the client's queue (for its sender
            thread) and again in the socket's.
        linger_ms: at close, how long queued records may take to reach the daemon.
        send_hello: send a minimal hello (host, pid, ranks) at once, so the daemon knows this
            rank even if hello(info) is never called.
    """

    def __new__(cls, endpoint: str | None = None, rank: int | None = None, **kwargs: Any):
        if cls is TelemetryClient and _disabled(endpoint):
            # Not a subclass: returned built, and Python does not run TelemetryClient.__init__ on it.
            return DisabledClient(endpoint, rank)
        return super().__new__(cls)

    def __init__(self, endpoint: str | None = None, rank: int | None = None, *, sndhwm: int = SNDHWM,
                 linger_ms: int = LINGER_MS, send_hello: bool = True) -> None:
        if sndhwm < 1:
            raise ValueError(f"sndhwm must be >= 1, got {sndhwm}")
        if linger_ms < 0:
            raise ValueError(f"linger_ms must be >= 0, got {linger_ms}")
        try:
            self.endpoint = endpoints.resolve("ingest", endpoint, create_dir=True)
            self._refused = ""
        except endpoints.UnsafePathError as exc:
            # Another local user could read what we send there: send nothing, count every record
            # as dropped, and keep training (telemetry is never fatal).
            self.endpoint, self._refused = "", str(exc)
            warnings.warn(f"telemetry: not connecting: {exc}", RuntimeWarning, stacklevel=2)
        self.rank = rank if rank is not None else _env_int(_RANK_ENV, 0)
        if self.rank < 0:
            raise ValueError(f"rank must be >= 0, got {self.rank}")
        self.local_rank = _env_int(_LOCAL_RANK_ENV, 0)
        self.world_size = _env_int(_WORLD_SIZE_ENV, 1)
        if endpoint is None and self.endpoint.startswith("ipc://"):
            _no_silent_discard(self.endpoint)
        self.host = os.uname().nodename  # gethostname() without importing socket
        self._sndhwm = sndhwm
        self._linger_ms = linger_ms
        self._hello_info: dict[str, Any] = {}
        self._warned: set[str] = set()
        # Built once: the hook routes tensors to the deferred path and numpy scalars to numbers.
        self._encoder = codec.new_packer(default=_wire_hook)
        # The common record (a dict of plain numbers under good names, a good step) in C,
        # msgpack's bytes; None for any other, which the slow path sorts out. Without the C part,
        # its contract in Python.
        self._pack_ints_map = codec.pack_ints_map or codec.checked_pack(self._encoder)
        self._bg_encoder = codec.new_packer(default=host_scalar)  # the sender thread's own
        self._open()
        # Stacks on the daemon's signal when a step hangs (stacks.py); once, off the hot path.
        self._stacks_hello = register_stacks(self.endpoint, self.rank)[0] if self.endpoint else {}
        _live_clients.add(self)
        if send_hello:
            self._send_hello()

    def _open(self) -> None:
        # With the pid it names this process for good: the daemon checks both in /proc before it
        # acts on this rank (telemetry/daemon/forensics/verify.py).
        self._start_time = proc_start_time()
        self._started_at = proc_started_at()   # unix s: the goodput ledger's start of start-up
        # log()'s common case and the counters it shares with the sender thread and the span
        # recorder (telemetry/client/fastlog.py); the properties below read and write them.
        self._st = new_state(self._pack_ints_map, codec.pack_ints_map)
        self._forked = False
        self._closed = False
        self._src = _new_src()
        # The next seq lives in the client's page (shared memory the daemon reads if this
        # process dies without a bye; telemetry/shared/client_page.py): `_seq` reads and writes it.
        self._page = ClientPage.create(self.endpoint, self._src, self.rank)
        self._seqs = self._page.seqs
        self._own_ns = 0               # ns spent in log() and event() so far (OWN_TIME_KEY)
        self._own_sent_at = -OWN_TIME_EVERY_NS   # monotonic_ns when it was last sent
        # Counters are split by the thread that writes them, so no increment is ever lost and
        # the hot path takes no lock: the caller's thread and the sender thread.
        self._num_sent = 0
        self._num_dropped = 0
        self._num_sent_bg = 0
        self._num_dropped_bg = 0
        self._num_skipped_values = 0
        self._num_skipped_bg = 0
        self._ctx = zmq.Context(io_threads=1)
        # Whether a daemon ever took this client's connection (a ZMTP handshake): at close, with
        # no daemon there now and none ever, nothing queued can reach one, and close() need not
        # wait for it (see close()). One event per daemon (re)start: the pipe stays tiny.
        self._reached = False
        self._monitor = self._ctx.socket(zmq.PAIR)
        self._monitor.setsockopt(zmq.LINGER, 0)
        self._monitor.setsockopt(zmq.RCVHWM, 0)    # never a full pipe: libzmq's I/O thread must not wait on it
        self._sock = self._new_socket(monitor=self._monitor)
        _held_until_close[id(self._ctx)] = (self._ctx, self._sock, self._monitor)
        # Where frames go: a record ring the daemon polls, when it reads rings (no system call,
        # no thread woken: telemetry/shared/ring.py), else the socket. Only the bye takes the socket
        # then (close()). With a ring every frame is written on the spot unless the sender thread
        # has items (a ring's write costs less than handing a record to that thread).
        self._ring = self._open_ring()
        self._send = self._ring.send if self._ring is not None else self._sock.send
        self._direct_after = 0 if self._ring is not None else DIRECT_AFTER_NS
        self._sock_send = self._send
        self._last_log_ns = 0          # time_ns of the last log() on the fast path
        self._spans = SpanRecorder(self._st)
        # Every record goes out on this socket, sent by the sender thread (the caller's thread
        # only queues it; see log()): one pipe to the daemon, so the records arrive in the order
        # of the calls. The queue holds as many records as the socket's own (sndhwm).
        d = self._deferred = DeferredSender(functools.partial(self._send, flags=_NOBLOCK), self._encode_job,
                                            self._count_sent_bg, self._count_dropped_bg, max_queued=self._sndhwm,
                                            state=self._st)
        self._st.bind(self._seqs, KIND_METRICS, PROTOCOL_VERSION, self._src, self.rank, d._jobs.append, d._ring,
                      self._send, zmq.ZMQError, _NOBLOCK, MAX_FRAME_BYTES, MAX_VALUES, ROOMY_FRAME_BYTES,
                      self._direct_after, OWN_TIME_EVERY_NS, _replaced_wall_clock(), OWN_TIME_KEY)
        self._fast_log = self._st.log

    def _open_ring(self) -> Any:
        """This client's record ring's writer, when its daemon reads rings and the page could be
        made (a local daemon on ipc), unless $TELEMETRY_TRANSPORT is "zmq"; else None (the socket)."""
        self._ring_path = None
        if self._page.path is None or os.environ.get(ring.ENV_TRANSPORT) == "zmq":
            return None
        directory = self._page.path.parent
        reader = ring.reader_alive(directory)
        if not reader:
            return None
        made = ring.create(directory, self._src, ring.capacity_for(self._sndhwm))
        if made is None:
            return None
        writer = ring.writer(made[1], zmq.Again, self._sndhwm)
        if writer is None or not ring.watch_reader(writer, directory, self._ring_reader_gone, reader):
            ring._unlink(made[0])
            return None
        self._ring_path = made[0]
        return writer

    def _ring_reader_gone(self) -> None:
        """No daemon reads rings here any more (the writer looks once a second: ring.watch_reader):
        every later frame goes on the socket (the ring's writer hands it over). A daemon started
        next that reads no rings (of a version before them, or told $TELEMETRY_TRANSPORT=zmq) gets
        them, as does one that reads rings, along with what the ring still holds. What the ring
        holds unread when no daemon ever reads it again is lost as a socket's queue is with its
        daemon: counted by the daemon's accounting where a successor knows this client (its seq
        moves on past them), not by this client."""
        self._ring.redirect(self._sock.send)

    # The counters log()'s common case shares (see _open), by the names the rest of the client uses.
    _forked = property(lambda self: self._st.forked, lambda self, v: setattr(self._st, "forked", v))
    _num_sent = property(lambda self: self._st.sent, lambda self, v: setattr(self._st, "sent", v))
    _num_dropped = property(lambda self: self._st.dropped, lambda self, v: setattr(self._st, "dropped", v))
    _num_dropped_bg = property(lambda self: self._st.dropped_bg, lambda self, v: setattr(self._st, "dropped_bg", v))
    _last_log_ns = property(lambda self: self._st.last_ns, lambda self, v: setattr(self._st, "last_ns", v))
    _own_ns = property(lambda self: self._st.own_ns, lambda self, v: setattr(self._st, "own_ns", v))
    _own_sent_at = property(lambda self: self._st.own_sent_at, lambda self, v: setattr(self._st, "own_sent_at", v))

    def _new_socket(self, ctx: zmq.Context | None = None, monitor: zmq.Socket | None = None,
                    events: int = zmq.EVENT_HANDSHAKE_SUCCEEDED) -> zmq.Socket:
        """A PUSH socket to the daemon; with `monitor` (a PAIR socket of the same context), the
        socket's `events` reach it (before the connect, so none is missed)."""
        ctx = ctx or self._ctx
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, self._sndhwm)
        sock.setsockopt(zmq.LINGER, self._linger_ms)
        if monitor is not None:
            addr = f"inproc://telemetry-monitor-{id(sock)}"
            sock.monitor(addr, events)
            monitor.connect(addr)
        # CURVE keys from $TELEMETRY_CURVE_SERVER_KEY/_CLIENT_KEY, for a daemon beyond loopback.
        # Imported only when a key is set: the module (logging, dataclasses) costs start-up time
        # that a rank on ipc or loopback does not need.
        if os.environ.get("TELEMETRY_CURVE_SERVER_KEY") or os.environ.get("TELEMETRY_CURVE_CLIENT_KEY"):
            from telemetry.shared.security.curve import apply_client_curve

            apply_client_curve(sock)
        # connect, never bind: the connecting side keeps its queue across daemon restarts.
        if not self._refused:
            sock.connect(self.endpoint)
        return sock

    @property
    def _seq(self) -> int:
        """The next seq, as the page holds it (log()'s fast path uses `_seqs` itself)."""
        return self._seqs[0]

    @_seq.setter
    def _seq(self, value: int) -> None:
        self._seqs[0] = value

    # -- the hot path --------------------------------------------------------------------------
    def log(self, step: int, values: Mapping[str, Any], parts: int = 1) -> None:
        """Send metrics for `step`: floats, ints, 0-dim tensors on any device. Never blocks.

        Tensors are read on the sender thread after their device has produced them; the values
        sent are those at the time of this call, even if the tensors change afterwards. Records
        reach the daemon in the order of the calls, whatever their values (a float record
        logged while a tensor record waits for its device waits behind it).

        A value that cannot be sent (a string, a tensor that is not one number, a meta, complex
        or quantized tensor, a name that is not a str of 1..MAX_NAME_CHARS characters) is left
        out of the record, named once in a warning and counted (stats()["skipped_values"]); the
        rest is sent. A `step` that is not an int in 0..2**63-1 (a numpy integer is one; a float,
        a bool, a tensor is not: reading a tensor would wait for its device) drops the record,
        said once and counted (stats()["dropped"], and in-band to the daemon). A row of more
        than MAX_VALUES values is sent as several records of the same step, each within the
        protocol's bounds: the caller's thread encodes it once and copies it (C speed, no Python
        work per value), and the sender thread sorts, splits and encodes it (see SPLIT_VALUES).

        `parts`: how many log() calls this rank makes for `step` in all, this one included (each
        says the same number), e.g. 2 for a training step's metrics and its eval results. The
        daemon waits for every part of every rank and writes the step once, each value reduced
        across the ranks; with the default 1, a second call for a step can be written apart.
        """
        # The common case is one C call (telemetry/client/fastlog.py): a training step between two
        # calls leaves every cache cold, and each bytecode and attribute touched here costs.
        done = self._fast_log(step, values, parts)
        if done is not None:
            self._log_rest(done, step, values, parts)

    def _log_rest(self, frame: "bytes | bool", step: int, values: Mapping[str, Any], parts: int) -> None:
        """log() past its common case: `frame` is the record's frame (its seq taken) when only the
        queue was not open to it, else False (nothing taken: the whole call is the Python's)."""
        if frame.__class__ is bytes:
            if not self._deferred.submit(frame):
                self._num_dropped += 1       # queue full or closed: counted, and said in-band
            return
        t0 = _monotonic_ns()
        try:
            if t0 - self._own_sent_at >= OWN_TIME_EVERY_NS:
                self._own_sent_at = t0
                try:
                    if len(values) < MAX_VALUES:      # never the value that makes a record too wide
                        values = {**values, OWN_TIME_KEY: self._own_ns / 1e9}
                except TypeError:     # not a mapping: refused below, as before
                    pass
            self._log_general(step, values, parts)
        finally:
            self._own_ns += _monotonic_ns() - t0

    def _log_general(self, step: int, values: Mapping[str, Any], parts: int) -> None:
        """log() in Python: with `parts`, after a fork, with spans to send, when the client's own
        time is due, and whatever its common case leaves (the slow path sorts out the values)."""
        if self._forked:                 # before any seq is taken: the parent's page is not ours
            self._reopen_after_fork()
        if parts != 1 and not self._parts_ok(step, parts):
            return
        if self._spans.pending:
            cpu_spans, spans = self._spans.take()
            if cpu_spans:
                values = {**values, **cpu_spans}
            self._log_slow(step, values, spans, parts)
            return
        seq = self._seq
        frame = None if parts != 1 else self._pack_ints_map(
            KIND_METRICS, PROTOCOL_VERSION, self._src, self.rank, seq, self._num_dropped + self._num_dropped_bg,
            time.time_ns(), step, values)
        if frame is None:
            self._log_slow(step, values, None, parts)
            return
        if len(frame) > ROOMY_FRAME_BYTES and (len(frame) > MAX_FRAME_BYTES or len(values) > MAX_VALUES):
            self._log_slow(step, values, None, parts)
            return
        self._seq = seq + 1
        self._hand_over(frame)

    def _hand_over(self, frame: bytes) -> None:
        """log()'s fast path's last step, for the other paths: queue the frame, or send it here
        when the loop is slow and nothing is queued (see log())."""
        t = _time_ns()
        d = self._deferred
        if d.pending() or t - self._last_log_ns < self._direct_after:
            self._last_log_ns = t
            if not d.submit(frame):
                self._num_dropped += 1
            return
        self._last_log_ns = t
        try:
            self._sock_send(frame, _NOBLOCK)
            self._num_sent += 1
        except _ZMQError:
            self._num_dropped += 1

    def _parts_ok(self, step: int, parts: Any) -> bool:
        """A `parts` the protocol takes (an int in 1..MAX_PARTS); otherwise the record is dropped
        (counted, one warning): the daemon would refuse it."""
        if is_int(parts) and 1 <= parts <= MAX_PARTS:
            return True
        self._seq += 1
        self._num_dropped += 1
        self._warn_once("parts", f"telemetry: dropped a record of step {step}: parts={parts!r} is not an int "
                                 f"in 1..{MAX_PARTS}")
        return False

    def _log_slow(self, step: int, values: Mapping[str, Any], spans: Any, parts: int = 1) -> None:
        """A record the fast path could not send as it came: tensors to snapshot, spans to wait
        for, values that cannot be sent (each left out, see log()), or a row wider than a record.
        Sent at once when nothing waits for the sender thread, else queued for it."""
        t_ns = time.time_ns()
        if self._closed:
            self._seq += 1
            self._num_dropped += 1
            return
        if step.__class__ is not int or not 0 <= step <= MAX_STEP:
            step = self._step_int(step)
        if step is None:
            self._seq += 1
            self._num_dropped += 1
            return
        if not isinstance(values, Mapping):
            self._seq += 1
            self._num_dropped += 1
            self._warn_once("log", f"telemetry: dropped a record of step {step}: values must be a mapping, "
                                   f"not {type(values).__name__}")
            return
        if len(values) > MAX_VALUES:
            # Work beyond the bound goes to the sender thread: here, only a copy of the row (C
            # speed), as the values are now; the sender sorts, splits and encodes it.
            plain, groups, num = dict(values), [], len(values)
            unchecked = True
        else:
            unchecked = False
            plain = {}
            names: list[str] = []
            tensors: list[Any] = []
            bad: list[tuple[str, str]] = []
            for k, v in values.items():
                c = v.__class__
                if k.__class__ is not str or not 0 < len(k) <= MAX_NAME_CHARS:
                    bad.append((str(k)[:80], f"a name of {len(k) if isinstance(k, str) else type(k).__name__} "
                                             f"(metric names are 1..{MAX_NAME_CHARS} characters)"))
                elif not k.isascii() and not _has_utf8(k):
                    bad.append((k.encode("utf-8", "backslashreplace").decode()[:80],
                                "a name with no UTF-8 form (a lone surrogate)"))
                elif c is float or c is int:
                    plain[k] = v
                elif hasattr(v, "detach"):
                    names.append(k)
                    tensors.append(v)
                else:
                    num, why = wire_number(v)
                    if why:
                        bad.append((k, why))
                    else:
                        plain[k] = num
            groups = []
            if tensors:
                try:
                    groups, bad_tensors = snapshot(names, tensors, self._deferred.pool)
                except Exception as exc:  # torch failed where it should not: lose the record, not the step
                    self._seq += 1
                    self._num_dropped += 1
                    self._warn_once("snapshot", f"telemetry: dropped a record of step {step}: {exc}")
                    return
                bad += bad_tensors
            if bad:
                self._skip_values(bad)
            num = len(plain) + sum(len(g.names) for g in groups)
        if not num and spans is None:        # nothing left to send: the record is dropped
            self._seq += 1
            self._num_dropped += 1
            return
        num_seqs = self._num_records(plain, groups, num, unchecked)
        seq = self._seq
        self._seq = seq + num_seqs
        if not groups and spans is None and num_seqs == 1:
            try:
                frame = codec.encode_metrics(self._src, self.rank, seq, self._num_dropped + self._num_dropped_bg,
                                             t_ns, step, plain, self._encoder, parts)
            except (TypeError, ValueError, OverflowError) as exc:   # not expected: every value is a number
                self._num_dropped += 1
                self._warn_once("log", f"telemetry: dropped a record of step {step}: {exc}")
                return
            self._hand_over(frame)
            return
        if not self._deferred.submit(Job(seq, t_ns, step, plain, groups, spans, parts, num_seqs, unchecked)):
            self._num_dropped += num_seqs

    def _step_int(self, step: Any) -> int | None:
        """`step` as the int it stands for (a numpy integer), or None, said once (counted by
        the caller): a bool, a float, a string, a tensor (reading it would wait for its device)
        is no step."""
        if step.__class__ is not bool and not hasattr(step, "detach"):
            try:
                num = operator.index(step)
            except TypeError:
                pass
            else:
                if 0 <= num <= MAX_STEP:
                    return num
        self._warn_once("step", f"telemetry: dropped a record: its step must be an int in 0..2**63-1, not "
                                f"{type(step).__name__} {str(step)[:40]!r}"
                        + (" (int(step) reads a tensor on its device: count steps in a Python int)"
                           if hasattr(step, "detach") else "") + "; counted in stats()['dropped']")
        return None

    @staticmethod
    def _num_records(plain: dict, groups: list, num: int, unchecked: bool) -> int:
        """How many records a row of `num` values is sent as: one when it surely fits the
        protocol's bounds, else one per SPLIT_VALUES values (each surely fits)."""
        if num <= SPLIT_VALUES:
            return 1
        if not unchecked and num <= MAX_VALUES:
            names = [*plain, *(n for g in groups for n in g.names)]
            if sum(len(k.encode()) for k in names) + num * MAX_WIRE_VALUE_BYTES < MAX_FRAME_BYTES - FRAME_HEADER_BYTES:
                return 1
        return -(-num // SPLIT_VALUES)

    def _skip_values(self, bad: list[tuple[str, str]], count: Callable[[int], None] | None = None) -> None:
        """Values left out of a record: counted, and each name said once in a warning (the first
        MAX_WARNED_NAMES names; then once that there are more)."""
        if count is None:
            self._num_skipped_values += len(bad)
        else:
            count(len(bad))
        for name, why in bad:
            key = "value:" + name
            if key in self._warned:
                continue
            if len(self._warned) >= MAX_WARNED_NAMES:
                self._warn_once("values", "telemetry: more values left out of their records (not named: "
                                          "counted in stats()['skipped_values'])")
                return
            self._warn_once(key, f"telemetry: {name!r} not sent: {why} (the rest of its record is; counted in "
                                 f"stats()['skipped_values'])")

    def _send_frame(self, frame: bytes) -> None:
        """Send a ready frame (a hello, an event: rare), or queue it behind the records that wait
        for the sender thread (which touches the socket only while it has items)."""
        d = self._deferred
        if d.pending():
            if not d.submit(frame):
                self._num_dropped += 1
            return
        try:
            self._send(frame, zmq.NOBLOCK)
            self._num_sent += 1
        except zmq.ZMQError:
            self._num_dropped += 1

    def _encode_job(self, job: Job, values: dict[str, Any]) -> bytes | list[bytes]:
        # Sender thread: its own encoder (tensors are numbers by now), and the drop count as of
        # sending. A row past the bounds (job.num_seqs records) is sorted and split here.
        if job.unchecked:
            values = self._checked(values)
        if job.num_seqs == 1:
            try:
                return codec.encode_metrics(self._src, self.rank, job.seq, self._num_dropped + self._num_dropped_bg,
                                            job.t_ns, job.step, values, self._bg_encoder, job.parts)
            except (TypeError, ValueError, OverflowError):
                values = self._checked(values)
        items = list(values.items())
        chunk = -(-len(items) // job.num_seqs) if items else 1
        frames = [codec.encode_metrics(self._src, self.rank, job.seq + i, self._num_dropped + self._num_dropped_bg,
                                       job.t_ns, job.step, dict(items[i * chunk:(i + 1) * chunk]), self._bg_encoder,
                                       job.parts)
                  for i in range(job.num_seqs) if items[i * chunk:(i + 1) * chunk]]
        if len(frames) < job.num_seqs:         # fewer values were left than records reserved
            self._count_dropped_bg(job.num_seqs - len(frames))
        if len(frames) > 1:
            self._warn_once("split", f"telemetry: a row of {len(values)} values is sent as {len(frames)} records "
                                     f"of step {job.step} (a record takes at most {MAX_VALUES} values and "
                                     f"{MAX_FRAME_BYTES} bytes)")
        return frames

    def _checked(self, values: dict[str, Any]) -> dict[str, Any]:
        """Sender thread: `values` with only what can be sent; the rest left out, counted and
        named (log()). A tensor here (a row too wide to sort on the caller's thread) is read here."""
        good: dict[str, Any] = {}
        bad: list[tuple[str, str]] = []
        for k, v in values.items():
            if k.__class__ is not str or not 0 < len(k) <= MAX_NAME_CHARS:
                bad.append((str(k)[:80], f"a name of {len(k) if isinstance(k, str) else type(k).__name__} "
                                         f"(metric names are 1..{MAX_NAME_CHARS} characters)"))
                continue
            num, why = wire_number(v, read_tensors=True)
            if why:
                bad.append((k, why))
            else:
                good[k] = num
        if bad:
            self._skip_values(bad, self._count_skipped_bg)
        return good

    def _count_skipped_bg(self, n: int) -> None:
        self._num_skipped_bg += n

    def _count_sent_bg(self, n: int) -> None:
        self._num_sent_bg += n

    def _count_dropped_bg(self, n: int) -> None:
        self._num_dropped_bg += n

    def span(self, name: str, cuda: bool | None = None) -> Span:
        """Time a region: `with tm.span("forward"): ...`; sent with the next log() call.

        Reported as `perf/<name>_time` (seconds, mean per occurrence since the previous log).
        With CUDA in use (or cuda=True) it is timed by CUDA events on the current stream and
        read by the sender thread; otherwise by perf_counter. Never syncs.
        """
        if self._forked:
            self._reopen_after_fork()
        return self._spans.span(name, cuda)

    # -- everything else is rare ---------------------------------------------------------------
    def event(self, name: str, data: Mapping[str, Any] | None = None) -> None:
        """Send a discrete event (checkpoint saved, NaN seen, ...). Never blocks. Secret-looking
        entries of `data` are redacted here, as in hello(). A name that is not a str of
        1..MAX_NAME_CHARS characters, or `data` that is not a mapping, drops the event (counted in
        stats()["dropped"], said once), as the daemon would refuse it; never an exception."""
        t0 = _perf_ns()

        def encode(seq: int, dropped: int) -> bytes:
            if name.__class__ is not str or not 0 < len(name) <= MAX_NAME_CHARS:
                raise ValueError(f"its name must be a str of 1..{MAX_NAME_CHARS} characters, not "
                                 f"{type(name).__name__} {str(name)[:40]!r}")
            if data is not None and not isinstance(data, Mapping):
                raise TypeError(f"its data must be a mapping (or None), not {type(data).__name__}")
            clean = Redactor()(dict(data)) if data else data
            return codec.encode_event(self._src, self.rank, seq, dropped, time.time_ns(), name, _to_wire_map(clean))

        try:
            self._send_other("event", encode)
        finally:
            self._own_ns += _perf_ns() - t0

    def exclude(self, reason: str | None = None) -> "_Exclusion":
        """Leave a stretch of wall time out of the job's goodput: `with tm.exclude("eval"): ...`.

        For work that is planned and not the training's (an evaluation run on the side, a
        maintenance pause): the goodput ledger (telemetry/shared/goodput.py) counts the window
        as `excluded` rather than as lost time. On enter it sends the event
        `goodput/exclude_begin`, on exit `goodput/exclude_end` (data {"reason": reason} on both
        when a reason is given), through event(): in order with this client's other records,
        never blocking. A window left open (a crash inside it) runs to the end of the job.
        """
        from telemetry.shared.goodput import EXCLUDE_BEGIN, EXCLUDE_END   # rare: not at import

        data = {"reason": reason} if reason is not None else None
        return _Exclusion(lambda: self.event(EXCLUDE_BEGIN, data), lambda: self.event(EXCLUDE_END, data))

    def hello(self, info: Mapping[str, Any]) -> None:
        """Describe this rank's run (config, model shape); the daemon keeps the latest per rank.

        The identity fields (host, pid, rank, local_rank, world_size) are added; keys in
        `info` win. Non-JSON values (paths, enums, dtypes) are sent as text.
        """
        if not isinstance(info, Mapping):       # as the daemon would refuse it: said, never raised
            self._warn_once("hello", f"telemetry: hello() takes a mapping, not {type(info).__name__}: ignored")
            return
        # Secrets (a W&B key, a hub token in the config) never leave this process.
        info = dict(info)
        if len(info) + sum(len(v) for v in info.values() if isinstance(v, Mapping)) <= HELLO_INLINE_ENTRIES:
            self._hello_info = Redactor()(info)
            self._send_hello()
            return
        # The values as of this call, one level deep; the rest is the sender thread's work.
        snap = {k: dict(v) if isinstance(v, Mapping) else v for k, v in info.items()}
        if self._forked:
            self._reopen_after_fork()
        seq, t_ns, ident = self._seq, time.time_ns(), self._identity()
        self._seq = seq + 1

        def make() -> bytes:
            red = Redactor()(snap)
            self._hello_info = red        # what a later hello (after a fork) repeats
            return self._fitted_hello(lambda i: codec.encode_hello(
                self._src, self.rank, seq, self._num_dropped + self._num_dropped_bg, t_ns, {**ident, **_to_wire_map(i)}),
                red)

        if not self._deferred.submit(Later(make)):
            self._num_dropped += 1

    def _fitted_hello(self, encode: Callable[[dict], bytes], info: dict) -> bytes:
        """encode(info), its biggest maps cut (their first items kept) until it fits
        MAX_FRAME_BYTES, a "_truncated" entry saying so, and one warning (sender thread)."""
        frame = encode(info)
        size = len(frame)
        for _ in range(16):
            if len(frame) <= MAX_FRAME_BYTES:
                break
            keep = 0.9 * MAX_FRAME_BYTES / len(frame)
            info = {k: dict(list(v.items())[:int(len(v) * keep)]) if isinstance(v, dict) and len(v) > 1 else v
                    for k, v in info.items()}
            info["_truncated"] = f"hello info of {size} bytes cut to the first items of its maps to fit " \
                                 f"{MAX_FRAME_BYTES} bytes"
            frame = encode(info)
        if len(frame) > MAX_FRAME_BYTES:       # one value alone beyond it: dropped (counted by the sender)
            self._warn_once("hello:size", f"telemetry: dropped a hello record of {size} bytes (the daemon takes "
                                          f"{MAX_FRAME_BYTES} at most)")
            raise ValueError("hello too big")
        if len(frame) != size:
            self._warn_once("hello:cut", f"telemetry: a hello of {size} bytes (a config this big) was cut to "
                                         f"{len(frame)} to fit a record ({MAX_FRAME_BYTES} bytes); the daemon keeps "
                                         f"its first part")
        return frame

    def _identity(self) -> dict[str, Any]:
        ident: dict[str, Any] = {"host": self.host, "pid": os.getpid(), "rank": self.rank,
                                 "local_rank": self.local_rank, "world_size": self.world_size,
                                 "src": self._src, "python": sys.version.split()[0], **self._stacks_hello}
        if self._start_time is not None:
            ident["start_time"] = self._start_time
        if self._started_at is not None:
            ident["started_at"] = round(self._started_at, 3)
        run_name = os.environ.get(endpoints.ENV_RUN_NAME)
        if run_name:
            ident["run_name"] = run_name
        restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if restarts:
            ident["restart_count"] = restarts
        return ident

    def _send_hello(self) -> None:
        self._send_other("hello", lambda seq, dropped: codec.encode_hello(
            self._src, self.rank, seq, dropped, time.time_ns(),
            {**self._identity(), **_to_wire_map(self._hello_info)}))

    def _send_other(self, what: str, encode: Any, direct: bool = False) -> None:
        """Send a hello, event or bye (never blocks): in turn behind the records that wait for
        the sender thread, unless `direct` (the bye, on its own connection at close). A frame
        beyond MAX_FRAME_BYTES is dropped here (counted, one warning): the daemon would cut the
        connection it came on."""
        if self._forked:
            self._reopen_after_fork()
        seq = self._seq
        self._seq = seq + 1
        try:
            frame = encode(seq, self._num_dropped + self._num_dropped_bg)
        except (TypeError, ValueError, OverflowError) as exc:
            self._num_dropped += 1
            self._warn_once(what, f"telemetry: dropped {'an' if what[0] in 'aeiou' else 'a'} {what} record: {exc}")
            return
        if len(frame) > MAX_FRAME_BYTES:
            self._num_dropped += 1
            self._warn_once(what + ":size", f"telemetry: dropped a {what} record of {len(frame)} bytes (the daemon "
                                            f"takes {MAX_FRAME_BYTES} at most)")
            return
        if not direct:
            self._send_frame(frame)
            return
        try:
            self._sock.send(frame, zmq.NOBLOCK)
            self._num_sent += 1
        except zmq.ZMQError:
            self._num_dropped += 1

    def _warn_once(self, key: str, message: str) -> None:
        """A warning at the caller's line (see _warn), once per `key`: a bad value logged every
        step would flood the trainer."""
        if key not in self._warned:
            self._warned.add(key)
            _warn(message)

    # -- lifecycle -----------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Counters of this client: sent (handed to the socket), dropped (incl. refused by a full
        queue), seq (records tried), pending (waiting for the sender thread, e.g. for their
        tensors), skipped_values, src.

        Records are sent by the sender thread; stats() first waits (at most STATS_FLUSH_S) until
        it has handed over those logged before the call, so that sent + dropped adds up to the
        records tried unless some still wait for a device (pending). Not for the hot path."""
        if not self._closed and not self._forked:
            self._deferred.flush(STATS_FLUSH_S)
        return self._counts()

    def _counts(self) -> dict[str, int]:
        return {"sent": self._num_sent + self._num_sent_bg,
                "dropped": self._num_dropped + self._num_dropped_bg,
                "seq": self._seq, "pending": self._deferred.pending(),
                "skipped_values": self._num_skipped_values + self._num_skipped_bg, "src": self._src}

    def _reached_daemon(self) -> bool:
        """Whether a daemon ever completed a handshake on the records connection (sticky)."""
        if not self._reached:
            try:
                self._monitor.recv_multipart(zmq.NOBLOCK)
                self._reached = True
            except zmq.ZMQError:
                pass
        return self._reached

    @staticmethod
    def _daemon_answers(monitor: zmq.Socket, deadline: float) -> bool | None:
        """On a fresh connection watched by `monitor` (handshake and refused-connect events): True
        once a daemon completes the handshake, False when the connect is refused (nothing
        listens there), None if neither happened by `deadline` (a remote peer that does not
        answer: the caller keeps its bounded wait)."""
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not monitor.poll(left_ms):
                return None
            frames = monitor.recv_multipart()
            event = int.from_bytes(frames[0][:2], "little")
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return True
            if event == zmq.EVENT_CONNECT_RETRIED:
                return False

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Flush what can be flushed within `timeout_s` and release the sockets. Safe twice.

        Returns within about `timeout_s` whether or not a daemon is there, and at once when no
        daemon listens at the endpoint and none ever took this client's connection: then nothing
        queued could reach one, and the records handed to the socket are counted as dropped
        (stats()), not as sent.
        """
        if self._closed:
            return
        if self._forked:  # never opened in this child: nothing here is ours to close
            self._closed = True
            return
        deadline = time.monotonic() + timeout_s
        # log()'s common case lets go of the page and the socket: a log() from here on is the
        # Python path's, which drops it (counted) and never touches the page the bye makes final.
        self._st.unbind()
        # The ring takes the sender thread's last frames; from then on (the bye sent) it takes none.

        def remaining_ms() -> int:
            return int(max(0.0, deadline - time.monotonic()) * 1000)

        # The sender thread finishes its queue; half the budget, so the socket's queue and the
        # bye get the rest.
        thread_done = self._deferred.close(timeout_s=remaining_ms() / 2000)
        self._closed = True
        # The bye's connection, opened first: whether a daemon answers on it says whether the
        # linger below can achieve anything. Over ipc or to a local port a refused connect is
        # known within a millisecond; a peer that does not answer at all costs the bounded wait.
        bye_ctx = zmq.Context(io_threads=1)
        probe = bye_ctx.socket(zmq.PAIR)
        probe.setsockopt(zmq.LINGER, 0)
        probe.setsockopt(zmq.RCVHWM, 0)
        bye_sock = self._new_socket(bye_ctx, monitor=probe,
                                    events=zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECT_RETRIED)
        answers = self._daemon_answers(probe, time.monotonic() + remaining_ms() / 2000) if not self._refused \
            else False
        nobody = answers is False and not self._reached_daemon()
        # No event may find its reader gone (libzmq's I/O thread would wait on it).
        bye_sock.disable_monitor()
        probe.close()
        if thread_done:
            self._sock.disable_monitor()
            if nobody:
                # Never delivered: what the socket still holds is all this client handed it.
                lost = self._num_sent + self._num_sent_bg
                self._num_dropped += lost
                self._num_sent = self._num_sent_bg = 0
                self._sock.close(linger=0)
                if lost and os.path.dirname(self.endpoint[len("ipc://"):]) not in _warned_no_daemon:
                    # An endpoint given by the caller or $TELEMETRY_ENDPOINT is not looked at when
                    # the client starts (a daemon may come later): said here, or it would be said
                    # only by stats().
                    _warn(f"telemetry: no daemon ever took this process's connection to {self.endpoint}: "
                          f"its {lost} records were dropped (counted in stats()['dropped'])")
            else:
                # The records first: handed to the kernel (or the linger, half of what is left, spent).
                self._sock.close(linger=min(remaining_ms() // 2, self._linger_ms))
            self._monitor.close()
            self._ctx.term()
            _held_until_close.pop(id(self._ctx), None)
        else:
            # A sender thread stuck waiting on a hung GPU (or still sending a backlog that other
            # threads kept filling) may still send on the socket, and term() would wait for it
            # forever: both are left to process exit (the caller never uses that socket again; its
            # records after close are dropped and counted). Held here: the client dropped later,
            # pyzmq's Context.__del__ would term() it, and the process would hang there.
            _left_to_exit.append((self._ctx, self._sock, self._monitor, self._deferred))
        #
        # Then the bye, the final seq and drop count that the daemon's loss figure needs, on a
        # connection of its own. Over ipc, libzmq discards what a peer that hangs up still has
        # in the kernel's buffer when the daemon's queue for that connection is full (an
        # overloaded daemon): the tail of the records connection, and a bye behind it, would
        # vanish after this process handed them over, counted by no one. A fresh connection's
        # queue is empty, so the bye arrives and such a tail is counted (records_lost_in_transit);
        # sent after the records were flushed, it arrives after them unless the daemon is behind.
        # With nobody there, no bye: no one would read it.
        if thread_done and self._ring is not None:
            self._ring.release()           # what follows (a log() after close) is dropped, counted
        try:
            self._sock = bye_sock
            if not nobody:
                self._send_other("bye", lambda seq, dropped: codec.encode_bye(
                    self._src, self.rank, seq, dropped, time.time_ns(), self._counts()), direct=True)
                self._page.mark_closed()      # the bye took the last seq: the page's is final
                self._seqs = self._page.seqs      # from here, private memory
        finally:
            # Closes the bye's socket with this linger, then returns once it has gone or the
            # linger expired: bounded by the deadline.
            bye_ctx.destroy(linger=0 if nobody else min(remaining_ms(), self._linger_ms))
            if nobody:
                # No daemon ever was: none will look for it. Otherwise the page stays until a
                # daemon has the bye (it removes the page then) or, without one, accounts by it
                # for what it never got (the bye's connection made says only that a daemon's
                # I/O thread took it: a daemon killed next may never read it).
                self._page.remove()
                if self._ring_path is not None:
                    ring._unlink(self._ring_path)
        _live_clients.discard(self)

    def _reopen_after_fork(self) -> None:
        """First call in a forked child: a fresh context, socket and src; the parent's stay."""
        _abandoned_after_fork.append((self._ctx, self._sock, self._monitor, self._deferred, self._page))
        self._open()
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            # A multiprocessing child (a DataLoader worker) leaves through os._exit, skipping
            # atexit; its exit finalizers still run, and close() flushes the last records.
            mp_util.Finalize(self, self.close, kwargs={"timeout_s": ATEXIT_CLOSE_TIMEOUT_S}, exitpriority=0)
        self._send_hello()

    def _mark_forked(self) -> None:
        if not self._closed:
            self._forked = True
        else:
            # Closed, or closing on another thread of the parent (its page not marked yet): what
            # this child counts stays in its own memory, never in the parent's shared page (nor
            # through log()'s common case, which the page was bound to).
            self._st.unbind()
            self._seqs = private_seqs(self._seqs[0])

    def __enter__(self) -> "TelemetryClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _replaced_wall_clock() -> Callable[[], int] | None:
    """time.time_ns when something in this process replaced it before the client started (a
    test's shifted clock: testkit/clockshift), for log()'s common case to read the record's time
    with, as the rest of the client does; None when it is the interpreter's own (the common case
    reads CLOCK_REALTIME itself)."""
    return None if getattr(time.time_ns, "__self__", None) is time else time.time_ns


def _warn(message: str) -> None:
    """A RuntimeWarning at the line that called into telemetry: the first frame outside the
    package, whichever of the client's paths (the drop-in's `wandb.log`, atexit's close) it came
    through."""
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


def _has_utf8(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


_warned_no_daemon: set[str] = set()


def _no_silent_discard(endpoint: str) -> None:
    """The default ipc endpoint with no daemon serving its directory: start one if asked
    ($TELEMETRY_AUTOSTART=1, client/autostart.py), else say once that records are dropped. A
    flock attempt on the directory's daemon.lock: microseconds, once per client."""
    from pathlib import Path

    from telemetry.client import autostart

    directory = Path(endpoint[len("ipc://"):]).parent
    if autostart.tried() or endpoints.daemon_serves(directory):
        return
    if autostart.wanted(default=False):
        autostart.ensure_daemon("telemetry", default=False)
        return
    if os.environ.get(endpoints.ENV_INGEST) or str(directory) in _warned_no_daemon:
        return
    _warned_no_daemon.add(str(directory))
    warnings.warn(f"telemetry: no daemon serves {directory}: this process's records are dropped (and counted) "
                  f"until one starts there. Start one (`telemetry daemon`, launch/run.sh), or set "
                  f"TELEMETRY_AUTOSTART=1 to start one for this script", RuntimeWarning, stacklevel=3)


class _NullSpan:
    __slots__ = ()

    def __enter__(self) -> "_NullSpan":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


_NULL_SPAN = _NullSpan()


class _Exclusion:
    """TelemetryClient.exclude's context manager: begin() on enter, end() on exit."""
    __slots__ = ("_begin", "_end")

    def __init__(self, begin: Callable[[], None], end: Callable[[], None]) -> None:
        self._begin, self._end = begin, end

    def __enter__(self) -> "_Exclusion":
        self._begin()
        return self

    def __exit__(self, *exc: object) -> None:
        self._end()


class DisabledClient:
    """The stand-in for a disabled client: TelemetryClient's public interface, each method a no-op.

    A class of its own, not a subclass: nothing of TelemetryClient (sockets, sender thread, fork
    and exit hooks) can run on an object that never opened them. It is registered as a virtual
    TelemetryClient, so isinstance checks keep accepting it; tests/test_client.py checks that
    every public name of TelemetryClient has its twin here, with the same signature.
    """

    def __init__(self, endpoint: str | None = None, rank: int | None = None, **kwargs: Any) -> None:
        self.endpoint = ""
        self.rank = rank if rank is not None else _env_int(_RANK_ENV, 0)
        self.local_rank = _env_int(_LOCAL_RANK_ENV, 0)
        self.world_size = _env_int(_WORLD_SIZE_ENV, 1)
        self.host = os.uname().nodename

    def log(self, step: int, values: Mapping[str, Any], parts: int = 1) -> None:
        pass

    def span(self, name: str, cuda: bool | None = None) -> Any:
        return _NULL_SPAN

    def event(self, name: str, data: Mapping[str, Any] | None = None) -> None:
        pass

    def exclude(self, reason: str | None = None) -> Any:
        return _NULL_SPAN

    def hello(self, info: Mapping[str, Any]) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return {"sent": 0, "dropped": 0, "seq": 0, "pending": 0, "skipped_values": 0, "src": 0}

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        pass

    def __enter__(self) -> "DisabledClient":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


TelemetryClient.register(DisabledClient)


def _mark_all_forked() -> None:
    for client in list(_live_clients):
        client._mark_forked()


os.register_at_fork(after_in_child=_mark_all_forked)


@atexit.register
def _close_all() -> None:
    for client in list(_live_clients):
        try:
            client.close(timeout_s=ATEXIT_CLOSE_TIMEOUT_S)
        except Exception:
            pass
