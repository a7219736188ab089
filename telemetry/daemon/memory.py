"""The daemon's memory budget: one number (`memory_mb`, default 256), the whole process's RSS.

The budget holds the process itself: its baseline (the interpreter, its modules, libzmq, the
threads; W&B's when it runs), measured at start (`baseline_mb`: this process's RSS after its
imports, plus what set-up and the lazily imported sinks add, measured once and named below), and
WORKING_MB for what the daemon holds while it works besides its buffers. A budget below
`smallest_mb()` cannot be kept and is refused at start (one line, exit 2, naming the smallest
that works). What is left is split across the buffers that grow with what the ranks send, each
bounded by its share in (estimated) bytes; what does not fit is shed and counted (`Shed`), with
one log line per kind the first time, never per item (a head first sets aside LINK_BYTES for
each of its node links):

    ingest         frames read ahead of processing (intake.Intake: each turn the daemon
                   reads what libzmq's queues hold, which count messages, not bytes);
                   beyond the share they are shed and counted lost
                   (records_shed_at_intake). libzmq holds what arrives in one turn
    sink queues    each sink's queue (SinkRunner max_bytes); the queues hold the same
                   records, so this is what they hold together, not each; a quarter of
                   it more for the per-rank records handed to the goodput stage alone
                   when the daemon does not write them (goodput_stage.py)
    open steps     records of steps the aggregator still waits on; beyond it the oldest
                   steps go out early, without their missing ranks (counted)
    recent         the last records for hang forensics (RecentRing)
    hellos         hello infos (each cut to HELLO_INFO_MAX_BYTES; equal parts kept once)
    names          the catalogue of distinct metric names (NameCatalogue)

Sizes are estimates from what is cheap to know on the hot path (a frame's length on the wire, a
JSON line's length) times a factor measured with tracemalloc (benchmarks/daemon_memory.py):
a decoded metrics record costs ~2x its frame with 10 values, ~4x with 4,096. Estimates miss what
is not the daemon's to count (libzmq's own queues, malloc's and pymalloc's slack, the stage
threads' arenas), so the budget is also kept by measure (`Governor`): the RSS is read a few times
a second, and above GOVERNOR_HIGH of the budget the intake sheds metrics frames (counted) and
freed memory is given back, until the RSS is below GOVERNOR_LOW again.
"""
from __future__ import annotations

import collections
import ctypes
import ctypes.util
import logging
import os
from dataclasses import dataclass, field

log = logging.getLogger("telemetry.daemon")

# A typo's terabytes are refused with the config; the least that works is measured (smallest_mb).
MAX_MEMORY_MB = 1 << 20
DEFAULT_MEMORY_MB = 256

# The buffers' shares of what the budget leaves after the baseline and WORKING_MB.
INGEST_SHARE = 0.22
SINK_QUEUES_SHARE = 0.35
OPEN_STEPS_SHARE = 0.22
RECENT_SHARE = 0.07
HELLOS_SHARE = 0.07
NAMES_SHARE = 0.07

# What the process adds to its RSS after the daemon's modules are imported (baseline_mb adds
# these to the RSS it reads then): set-up (the stages' modules, ten threads, the sockets,
# libzmq's I/O thread); W&B's module and its run (wandb.init); TensorBoard's event writer
# (tensorboard, its protobufs, numpy); each a little above what was measured. W&B also starts its
# own process (wandb-core): not in the daemon's RSS, but in a container's or cgroup's limit
# beside it. Measured with benchmarks/daemon_memory.py and /proc/self/statm (figures:
# benchmarks/RESULTS.md, Memory).
SETUP_MB = 8
WANDB_MB = 56
TENSORBOARD_MB = 24
# What the daemon holds while it works, besides its buffers: the batch in hand (INGEST_BATCH_BYTES
# of frames, decoded, and its output records and JSON lines), what one turn reads ahead
# (intake.MAX_READ_PER_TURN frames, ~4 MB of small ones), libzmq's own queues (up to
# rcvhwm_per_connection messages a connection, ~3 MB per flat-out rank), and the slack of
# malloc's arenas (the stage threads' and libzmq's) and pymalloc's after the load has moved
# through them, which trim_heap gives back only in part. Measured with 8 ranks flat out and every
# buffer at its least (benchmarks/daemon_memory.py; figures: benchmarks/RESULTS.md, Memory).
WORKING_MB = 72
# A head's node links (one a node: aggregator.world_size) each hold what an idle link costs: libzmq's
# per-connection buffers and the per-source state (a little above the ~29 KB an idle link was
# measured to add: benchmarks/RESULTS.md, Head scale). Reserved out of the budget before the
# buffers' shares; a budget they do not fit in is refused at start (smallest_mb). What a link's
# queue holds beyond it is kept by measure (Governor), not by a small per-link queue: the frames a
# head cannot process must reach it to be counted (by their headers, cheaply), or a node whose
# backlog stayed on its side when the head drained would be lost uncounted.
LINK_BYTES = 32 * 1024
# A daemon inside another process (tests) has no baseline of its own to measure: this stands in.
NOMINAL_BASELINE_MB = 40
# The least of each share, whatever the budget says: a queue must hold a few batches.
MIN_SHARE_BYTES = 1 << 20
SHARES = (INGEST_SHARE, SINK_QUEUES_SHARE, OPEN_STEPS_SHARE, RECENT_SHARE, HELLOS_SHARE, NAMES_SHARE)
# The least the buffers are given together: each share at its least.
MIN_BUFFERS_MB = len(SHARES) * MIN_SHARE_BYTES / 2**20

# A decoded metrics record against its frame on the wire (tracemalloc: the ratio grows with the
# record's width, wide dicts over-allocate): the largest seen, so estimates err high.
RECORD_BYTES_PER_FRAME_BYTE = 4
# An output record (its dict, its values, its JSON line) against its JSON line (measured with
# tracemalloc for the dict and line, with room: new floats for reduced values add more).
OUT_BYTES_PER_LINE_BYTE = 3
# A hello's info is kept up to this size (JSON); the rest is replaced by a note and counted.
HELLO_INFO_MAX_BYTES = 64 * 1024
# A decoded hello info against its JSON (nested dicts and strs).
HELLO_BYTES_PER_JSON_BYTE = 4
# What a hello keeps once the hellos' share is spent (its scalars: pid, host, world size).
HELLO_INFO_OVER_BUDGET_BYTES = 1024
# One name in the catalogue: the str (~70 B), its set entry, its slot in every cache and
# column that is keyed by name (reductions, the aggregator's columns, the key-set cache).
BYTES_PER_NAME = 256
# The largest steps x names table the aggregator builds at once (StepBatch columns: one slot per
# step per name seen in the batch): closed steps are reduced in chunks that fit (~8 B a slot).
MAX_BATCH_CELLS = 1 << 22
# The most bytes (on the wire) the daemon takes from the intake queue in one batch: with wide
# records a batch of stages.receive.INGEST_BATCH frames would decode to hundreds of MB at once (1,024 x
# 4,096 values: ~500 MB). The next batch's frame count follows the last batch's frame size. 1 MB,
# not 4: a batch of wide records takes long to process, and what arrives meanwhile
# waits in libzmq (unbounded in bytes) until the next turn reads it ahead (intake.py); small
# records are unaffected (1,024 frames of ~250 B are 0.25 MB).
INGEST_BATCH_BYTES = 1 << 20
# The budget kept by measure (Governor): the RSS is read every GOVERNOR_CHECK_S (a read of
# /proc/self/statm, cheap); above GOVERNOR_HIGH of the budget the intake is cut to
# MIN_SHARE_BYTES (metrics frames beyond it shed, counted; a rank's hello and bye still pass) and
# the heap is trimmed (at most every GOVERNOR_TRIM_S: a trim of a big heap takes milliseconds);
# below GOVERNOR_LOW the intake gets its share back. The high mark leaves what one turn can add
# (a read-ahead of 16k frames and one batch: ~10 MB) below the budget.
GOVERNOR_CHECK_S = 0.02
GOVERNOR_HIGH = 0.90
GOVERNOR_LOW = 0.80
GOVERNOR_TRIM_S = 0.5


def rss_bytes() -> int | None:
    """This process's resident memory in bytes (Linux /proc); None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def baseline_mb(wandb: bool = False, tensorboard: bool = False) -> float:
    """The process's own baseline: its RSS now (call it once the daemon's modules are imported),
    plus what set-up and the sinks it will import lazily add (SETUP_MB, WANDB_MB, TENSORBOARD_MB)."""
    rss = rss_bytes()
    now = rss / 2**20 if rss is not None else 30.0
    return now + SETUP_MB + (WANDB_MB if wandb else 0) + (TENSORBOARD_MB if tensorboard else 0)


def links_mb(links: int) -> float:
    """What a head's `links` node links hold at most (LINK_BYTES each), in MB."""
    return links * LINK_BYTES / 2**20


def smallest_mb(baseline: float, links: int = 0) -> int:
    """The smallest budget that a process of this baseline can keep: the baseline, WORKING_MB, a
    head's node links (links_mb) and each buffer at its least, rounded up to whole MB, with the
    governor's high mark under it."""
    import math

    return math.ceil((baseline + WORKING_MB + links_mb(links) + MIN_BUFFERS_MB) / GOVERNOR_HIGH)


@dataclass(frozen=True, slots=True)
class Budget:
    """The split of `memory_mb` into byte bounds (see the module docstring). `baseline_mb`: the
    process's own, measured at start (baseline_mb()); None in a daemon run inside another
    process (tests): its buffers then get their shares of the budget less a nominal baseline,
    and nothing is kept by measure (that process's RSS is not the daemon's)."""

    memory_mb: float = DEFAULT_MEMORY_MB
    baseline_mb: float | None = None
    links: int = 0               # a head's node links (its nodes), each LINK_BYTES reserved

    @property
    def buffers_mb(self) -> float:
        """What the buffers share: the budget less the baseline, WORKING_MB and the node links."""
        base = self.baseline_mb if self.baseline_mb is not None else NOMINAL_BASELINE_MB
        return max(0.0, self.memory_mb - base - WORKING_MB - links_mb(self.links))

    def _share(self, share: float) -> int:
        return max(MIN_SHARE_BYTES, int(self.buffers_mb * share * 2**20))

    @property
    def ingest_bytes(self) -> int:
        return self._share(INGEST_SHARE)

    @property
    def sink_queue_bytes(self) -> int:
        return self._share(SINK_QUEUES_SHARE)

    @property
    def open_steps_bytes(self) -> int:
        return self._share(OPEN_STEPS_SHARE)

    @property
    def recent_bytes(self) -> int:
        return self._share(RECENT_SHARE)

    @property
    def hello_bytes(self) -> int:
        return self._share(HELLOS_SHARE)

    @property
    def max_names(self) -> int:
        return self._share(NAMES_SHARE) // BYTES_PER_NAME

    def split(self) -> dict:
        """The split in MB, for `status --json`."""
        mb = lambda n: round(n / 2**20, 1)   # noqa: E731
        base = self.baseline_mb if self.baseline_mb is not None else NOMINAL_BASELINE_MB
        return {"baseline": round(base, 1), "working": WORKING_MB, "node_links": round(links_mb(self.links), 1),
                "ingest": mb(self.ingest_bytes),
                "sink_queues": mb(self.sink_queue_bytes), "open_steps": mb(self.open_steps_bytes),
                "recent": mb(self.recent_bytes), "hellos": mb(self.hello_bytes),
                "names": mb(self._share(NAMES_SHARE))}


@dataclass(slots=True)
class Shed:
    """What the budget shed, by kind; each kind logged once (never per item)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("recent_batches", "recent_records", "hellos_truncated", "metric_values", "steps_closed_early",
         "records_shed_at_intake", "hellos_cut_at_intake"), 0))
    _logged: set = field(default_factory=set)

    def add(self, kind: str, n: int, why: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("memory budget: %s (counted in status memory.shed.%s and telemetry/memory/records_shed; "
                        "logged once)", why, kind)

    def total(self) -> int:
        return sum(self.counts.values())


class Governor:
    """The budget kept by measure: the RSS read every GOVERNOR_CHECK_S (check(), from the daemon's
    loop); above GOVERNOR_HIGH of the budget the intake's share is cut to MIN_SHARE_BYTES, so
    metrics frames beyond it are shed (counted as the intake counts them, records_shed_at_intake)
    while the queues drain, and freed memory is given back (trim_heap); below GOVERNOR_LOW the
    share is restored. Each time it engages is counted (`num_engaged`), logged the first time."""

    def __init__(self, budget: Budget, intake) -> None:
        self.high_bytes = int(budget.memory_mb * GOVERNOR_HIGH * 2**20)
        self.low_bytes = int(budget.memory_mb * GOVERNOR_LOW * 2**20)
        self.intake = intake
        self.share_bytes = intake.max_bytes
        self.engaged = False
        self.num_engaged = 0
        self.num_trims = 0
        self.peak_bytes = 0
        self.next_check = 0.0          # monotonic seconds
        self._next_trim = 0.0
        self._page = os.sysconf("SC_PAGE_SIZE")
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None            # not Linux: the estimates alone bound the buffers

    def _rss(self) -> int:
        try:
            return int(os.pread(self._fd, 64, 0).split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return 0

    def check(self, now: float) -> None:
        self.next_check = now + GOVERNOR_CHECK_S
        if self._fd is None:
            return
        rss = self._rss()
        if rss > self.peak_bytes:
            self.peak_bytes = rss
        if rss > self.high_bytes:
            if not self.engaged:
                self.engaged = True
                self.num_engaged += 1
                self.intake.max_bytes = min(self.share_bytes, MIN_SHARE_BYTES)
                if self.num_engaged == 1:
                    log.warning("memory budget: the process's RSS passed %.0f %% of memory_mb: metrics frames beyond "
                                "a 1 MB intake are shed (records_shed_at_intake) until it is below %.0f %% (counted in "
                                "status memory.governor; logged once)", GOVERNOR_HIGH * 100, GOVERNOR_LOW * 100)
            if now >= self._next_trim and trim_heap():
                self._next_trim = now + GOVERNOR_TRIM_S
                self.num_trims += 1
        elif self.engaged and rss < self.low_bytes:
            self.engaged = False
            self.intake.max_bytes = self.share_bytes

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def stats(self) -> dict:
        return {"engaged": self.engaged, "times_engaged": self.num_engaged, "trims": self.num_trims,
                "peak_rss_mb": round(self.peak_bytes / 2**20, 1), "high_mb": round(self.high_bytes / 2**20, 1),
                "low_mb": round(self.low_bytes / 2**20, 1)}


class RecentRing:
    """The last batches of metrics records, for hang forensics, bounded by estimated bytes.

    Read like the deque it replaces: iterated (list(ring)) from the forensics thread, each item
    a batch (a list of records). A batch is appended with its size; the oldest batches go when
    the total passes `max_bytes` (the newest is always kept), counted in `shed`.
    """

    def __init__(self, max_bytes: int, shed: Shed | None = None) -> None:
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self.shed = shed or Shed()
        self._batches: collections.deque[list] = collections.deque()
        self._sizes: collections.deque[int] = collections.deque()

    def append(self, batch: list, num_bytes: int) -> None:
        if num_bytes > self.max_bytes and len(batch) > 1:   # one batch over the whole share: its tail
            keep = max(1, len(batch) * self.max_bytes // num_bytes)
            self.shed.add("recent_records", len(batch) - keep, "hang forensics keeps the last records that "
                          "fit its share; older ones are let go")
            num_bytes = num_bytes * keep // len(batch)
            batch = batch[-keep:]
        self._batches.append(batch)
        self._sizes.append(num_bytes)
        self.num_bytes += num_bytes
        if self.num_bytes > self.max_bytes:
            self._evict()

    def _evict(self) -> None:
        n = 0
        while self.num_bytes > self.max_bytes and len(self._batches) > 1:
            self._batches.popleft()
            self.num_bytes -= self._sizes.popleft()
            n += 1
        if n:
            self.shed.add("recent_batches", n, "hang forensics keeps the last records that fit its share; older "
                          "batches are let go")

    def __iter__(self):
        return iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)


class NameCatalogue:
    """The distinct metric names the daemon tracks, at most `max_names`. A record whose names
    are all known (or fit) passes as it is; beyond the cap its new names' values are shed (the
    record goes on without them) and counted. Consulted only for key sets seen for the first
    time (the receiver's slow path), so known names flow at full speed."""

    def __init__(self, max_names: int, shed: Shed | None = None) -> None:
        self.max_names = max_names
        self.names: set[str] = set()
        self.shed = shed or Shed()

    def __len__(self) -> int:
        return len(self.names)

    def admit(self, values: dict) -> dict | None:
        """None if every name of `values` is (now) in the catalogue; else `values` without the
        names beyond the cap."""
        names = self.names
        new = [k for k in values if k not in names]
        if not new:
            return None
        room = self.max_names - len(names)
        if len(new) <= room:
            names.update(new)
            return None
        names.update(new[:max(0, room)])
        drop = set(new[max(0, room):])
        self.shed.add("metric_values", len(drop), f"{self.max_names} distinct metric names tracked; the "
                      "values of newer names are dropped, known names still flow")
        return {k: v for k, v in values.items() if k not in drop}


class HelloInfos:
    """Hello infos as the daemon keeps and passes them on, bounded in bytes: each cut to
    HELLO_INFO_MAX_BYTES of JSON; a mapping or list equal to one kept before (the ranks of a run
    send the same config) is the same object, held once; once `max_bytes` is held, a further
    hello keeps HELLO_INFO_OVER_BUDGET_BYTES (its pid, host, world size). Cuts are counted."""

    def __init__(self, max_bytes: int, shed: Shed | None = None) -> None:
        import msgspec

        self.max_bytes = max_bytes
        self.num_bytes = 0
        self.shed = shed or Shed()
        self._parts: dict[bytes, object] = {}
        self._enc = msgspec.json.Encoder()

    def keep(self, info: dict) -> dict:
        limit = HELLO_INFO_MAX_BYTES if self.num_bytes < self.max_bytes else HELLO_INFO_OVER_BUDGET_BYTES
        info, cut = cap_hello_info(info, limit)
        if cut:
            self.shed.add("hellos_truncated", 1, f"a hello's info is kept up to {limit} bytes of JSON "
                          f"({HELLO_INFO_OVER_BUDGET_BYTES} once {self.max_bytes >> 20} MB of them are held); "
                          "the rest is replaced by a note")
        out = {}
        for k, v in info.items():
            if isinstance(v, (dict, list)):
                try:
                    key = self._enc.encode(v)
                except (TypeError, ValueError, OverflowError):
                    key = None
                if key is not None:
                    same = self._parts.get(key)
                    if same is None:
                        self.num_bytes += len(key) * (HELLO_BYTES_PER_JSON_BYTE + 1)
                        if self.num_bytes < self.max_bytes:
                            self._parts[key] = v
                    else:
                        v = same
            elif isinstance(v, str):
                self.num_bytes += len(v) * 2
            out[k] = v
        return out


def cap_hello_info(info: dict, max_bytes: int = HELLO_INFO_MAX_BYTES) -> tuple[dict, int]:
    """`info` cut to about `max_bytes` of JSON: top-level items kept in order while they fit, a
    mapping too big for what is left kept in part the same way (a model config keeps its
    scalars, loses its big tables); what went is named in a "_truncated" note. Returns the info
    and the bytes left out (0: unchanged)."""
    import msgspec

    enc = msgspec.json.Encoder()
    try:
        size = len(enc.encode(info))
    except (TypeError, ValueError, OverflowError):
        size = max_bytes + 1
    if size <= max_bytes:
        return info, 0
    kept, _ = _cap_mapping(info, max_bytes - 256, enc)
    kept["_truncated"] = (f"hello info of {size} bytes cut to {max_bytes} (the daemon's memory budget); "
                          "see the rank's own config for the rest")
    return kept, size


def _cap_mapping(d: dict, room: int, enc) -> tuple[dict, int]:
    out: dict = {}
    used = 2
    for k, v in d.items():
        try:
            n = len(enc.encode({k: v}))
        except (TypeError, ValueError, OverflowError):
            continue
        if used + n <= room:
            out[k] = v
            used += n
        elif isinstance(v, dict) and room - used > 64 + len(k):
            part, n = _cap_mapping(v, room - used - len(k) - 8, enc)
            out[k] = part
            used += n + len(k) + 8
    return out, used


_libc = None


def trim_heap() -> bool:
    """Give freed memory back to the system (glibc's malloc_trim: every arena, the sink threads'
    too). After a burst the heap keeps its high-water mark otherwise. False off glibc."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    _libc.malloc_trim(0)
    return True
