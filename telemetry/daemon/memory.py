"""The daemon's memory budget: one number (`memory_mb`, default 256), split across its buffers.

Every buffer that grows with what the ranks send is bounded by its share of the budget, in
(estimated) bytes; what does not fit is shed and counted (`Shed`), with one log line per kind
the first time, never per item. The split, of memory_mb:

    runtime        30 %  the interpreter, modules, threads, sockets, libzmq and malloc's slack:
                         not a buffer; measured idle at ~35 MB (~60 MB with W&B imported)
    ingest         15 %  frames read ahead of processing (intake.Intake: each turn the daemon
                         reads what libzmq's queues hold, which count messages, not bytes);
                         beyond the share they are shed and counted lost
                         (records_shed_at_intake). libzmq holds what arrives in one turn
    sink queues    25 %  each sink's queue (SinkRunner max_bytes); the queues hold the same
                         records, so this is what they hold together, not each; a quarter of
                         it more for the per-rank records handed to the goodput stage alone
                         when the daemon does not write them (goodput_stage.py)
    open steps     15 %  records of steps the aggregator still waits on; beyond it the oldest
                         steps go out early, without their missing ranks (counted)
    recent         5 %   the last records for hang forensics (RecentRing)
    hellos         5 %   hello infos (each cut to HELLO_INFO_MAX_BYTES; equal parts kept once)
    names          5 %   the catalogue of distinct metric names (NameCatalogue)

Sizes are estimates from what is cheap to know on the hot path (a frame's length on the wire, a
JSON line's length) times a factor measured with tracemalloc (benchmarks/daemon_memory.py):
a decoded metrics record costs ~2x its frame with 10 values, ~4x with 4,096.
"""
from __future__ import annotations

import collections
import ctypes
import ctypes.util
import logging
from dataclasses import dataclass, field

log = logging.getLogger("telemetry.daemon")

# Sane bounds for the `memory_mb` key: below the runtime's own needs, or a typo's terabytes.
MIN_MEMORY_MB = 64
MAX_MEMORY_MB = 1 << 20
DEFAULT_MEMORY_MB = 256

RUNTIME_SHARE = 0.30
INGEST_SHARE = 0.15
SINK_QUEUES_SHARE = 0.25
OPEN_STEPS_SHARE = 0.15
RECENT_SHARE = 0.05
HELLOS_SHARE = 0.05
NAMES_SHARE = 0.05

# A decoded metrics record against its frame on the wire (tracemalloc: 2.0x at 10 values,
# 2.3x at 100, 3.9x at 4,096: wide dicts over-allocate): the larger, so estimates err high.
RECORD_BYTES_PER_FRAME_BYTE = 4
# An output record (its dict, its values, its JSON line) against its JSON line (1.3-1.6x
# measured for the dict and line; new floats for reduced values add more).
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
# records a batch of core.INGEST_BATCH frames would decode to hundreds of MB at once (1,024 x
# 4,096 values: ~500 MB). The next batch's frame count follows the last batch's frame size. 1 MB,
# not 4: a batch of wide records takes ~10 ms a record to process, and what arrives meanwhile
# waits in libzmq (unbounded in bytes) until the next turn reads it ahead (intake.py); small
# records are unaffected (1,024 frames of ~250 B are 0.25 MB).
INGEST_BATCH_BYTES = 1 << 20
# The least of each share, whatever the budget says: a queue must hold a few batches.
MIN_SHARE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Budget:
    """The split of `memory_mb` into byte bounds (see the module docstring)."""

    memory_mb: float = DEFAULT_MEMORY_MB

    def _share(self, share: float) -> int:
        return max(MIN_SHARE_BYTES, int(self.memory_mb * share * 2**20))

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
        return {"runtime": round(self.memory_mb * RUNTIME_SHARE, 1), "ingest": mb(self.ingest_bytes),
                "sink_queues": mb(self.sink_queue_bytes), "open_steps": mb(self.open_steps_bytes),
                "recent": mb(self.recent_bytes), "hellos": mb(self.hello_bytes),
                "names": mb(self._share(NAMES_SHARE))}


@dataclass(slots=True)
class Shed:
    """What the budget shed, by kind; each kind logged once (never per item)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("recent_batches", "recent_records", "hellos_truncated", "metric_values", "steps_closed_early",
         "ingest_frames", "hellos_cut_at_intake"), 0))
    _logged: set = field(default_factory=set)

    def add(self, kind: str, n: int, why: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("memory budget: %s (counted in status memory.shed.%s and telemetry/memory_shed; "
                        "logged once)", why, kind)

    def total(self) -> int:
        return sum(self.counts.values())


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
