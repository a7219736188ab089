"""The records the daemon writes, declared once.

Every line of `metrics.jsonl`, every PUB message and every record an in-process sink is handed is
one of the Structs below, encoded as a JSON object whose `kind` says which:

    metrics  a step: `values` reduced across the ranks that reported it (no `rank`), or one rank's
             own record (`rank`; written with `--per-rank`, or `late` when its step had already
             gone out). `missing_ranks`: known ranks the step went out without (a timeout or
             the memory budget); `window_steps`: a downsampled sink's record stands for that many
             steps (its values reduced over them; absent: one step).
    event    something that happened, at a time: a rank's own (`rank`), a daemon finding
             (`diagnosis/<rule>`, `rank` null when it names no rank), `clock_offset`,
             `link_closed`, ...
    hello    a rank's client started: its `info` (host, pid, world size, config, ...).
    bye      a rank's client closed: its final counters (`stats`).
    daemon   the daemon's own counters (`values`: the catalogue's source "self" metrics), and
             the run it serves (`run`: its run name), so a consumer attached at any time labels
             its series with the run without a rank's hello naming it.
    system   the host the daemon runs on, polled (`values`: system/...).
    gpu      one GPU (`gpu`: its NVML index) of that host, polled (`values`: gpu/...).

`t` is a unix time in seconds (the client's clock moved by its node's measured offset, or the
daemon's). A field that is not there (msgspec.UNSET) is left out of the JSON, as the
descriptions above say.

Producers (the daemon) build these and nothing else. Readers (consumers, in-process sinks) use
`decode`: a line the declaration does not describe (a newer daemon's kind or field, or a
hand-made file) comes back as a plain dict rather than being lost, and a record reads the same
either way: `rec["values"]`, `rec.get("rank")`, `"late" in rec` answer as they would on the
record's JSON object (`kind` included), and attribute access (`rec.values`) is the typed form.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Union

import msgspec
from msgspec import UNSET, UnsetType

# A reduced, polled or counted value: a number, a flag, or null (not computable this time). An
# int fits in 64 bits: a 400-digit one read back from a file would be an OverflowError in every
# reader that draws it (the line goes on to the plain-dict path, which holds it to the same).
Value = Union[float, Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)], bool, None]
# A record's time: a unix time in seconds from 1970 up to the end of year 9999 (what `time` and
# `datetime` can show). A line with a time outside it is not a record (a hand-made or damaged
# file): every reader would otherwise meet it as an OverflowError when it shows the time.
MAX_T = 253402300800.0
Time = Annotated[float, msgspec.Meta(ge=0.0, lt=MAX_T)]
# How deep a record's free-form part (an event's data, a hello's info, a bye's stats, a line
# outside the declaration) may nest. Readers walk them recursively (a config table, a page's
# JSON); a line nested deeper is not a record: skipped, never a RecursionError in a reader.
MAX_DEPTH = 64
# The ints a line may hold: what msgspec decodes into a declared int field (int64, uint64).
_MIN_INT, _MAX_INT = -(1 << 63), (1 << 64) - 1


# A record's fields in the order declared are its JSON object's keys in that order, after `kind`:
# `kind`, `t`, then the kind's own. Readers may rely on it (the dashboard's range reads find a
# metrics line's step by its first bytes: telemetry/consumers/dashboard/ranges.py).
# gc=False: a record holds numbers, strings and the plain containers decoded or built for it,
# never itself, so the cyclic collector need not track it (cheaper to build and to free).
class OutputRecord(msgspec.Struct, tag_field="kind", forbid_unknown_fields=True, gc=False):
    t: Time

    @property
    def kind(self) -> str:
        return self.__struct_config__.tag

    # -- read as the record's JSON object reads ------------------------------------------------
    # (No exception on the common paths: readers call these per record. _FIELDS is set on each
    # kind below, after its class exists.)
    _FIELDS: ClassVar[frozenset] = frozenset()

    def __getitem__(self, key: str) -> Any:
        if key in self._FIELDS:
            value = getattr(self, key)
            if value is not UNSET:
                return value
        elif key == "kind":
            return self.__struct_config__.tag
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self._FIELDS:
            value = getattr(self, key)
            return default if value is UNSET else value
        return self.__struct_config__.tag if key == "kind" else default

    def __contains__(self, key: object) -> bool:
        if key in self._FIELDS:
            return getattr(self, key) is not UNSET
        return key == "kind"

    def keys(self) -> list[str]:
        """The JSON object's keys, `kind` first (so `dict(rec)` and `set(rec)` work)."""
        return ["kind", *(k for k in self.__struct_fields__ if getattr(self, k) is not UNSET)]

    def __iter__(self):
        return iter(self.keys())

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self[k]) for k in self.keys()]

    def to_dict(self) -> dict:
        """The record's JSON object as a dict (what a reader of the file gets with json.loads)."""
        return msgspec.to_builtins(self)


class MetricsRecord(OutputRecord, tag="metrics"):
    step: int
    values: dict[str, Value]
    rank: Union[int, UnsetType] = UNSET
    late: Union[bool, UnsetType] = UNSET
    missing_ranks: Union[list[int], UnsetType] = UNSET
    window_steps: Union[int, UnsetType] = UNSET


class EventRecord(OutputRecord, tag="event"):
    rank: Union[int, None]
    name: str
    data: dict[str, Any]


class HelloRecord(OutputRecord, tag="hello"):
    rank: int
    info: dict[str, Any]


class ByeRecord(OutputRecord, tag="bye"):
    rank: int
    stats: dict[str, Any]


class DaemonRecord(OutputRecord, tag="daemon"):
    values: dict[str, Value]
    run: Union[str, UnsetType] = UNSET


class SystemRecord(OutputRecord, tag="system"):
    host: str
    values: dict[str, Value]


class GpuRecord(OutputRecord, tag="gpu"):
    host: str
    gpu: int
    values: dict[str, Value]


AnyRecord = Union[MetricsRecord, EventRecord, HelloRecord, ByeRecord, DaemonRecord, SystemRecord, GpuRecord]
for _kind in AnyRecord.__args__:
    _kind._FIELDS = frozenset(_kind.__struct_fields__)

# The kinds with a free-form field, and that field.
_FREE_FORM = {EventRecord: "data", HelloRecord: "info", ByeRecord: "stats"}

_encoder = msgspec.json.Encoder()
_typed = msgspec.json.Decoder(AnyRecord)
_plain = msgspec.json.Decoder()


def encode(rec: OutputRecord) -> bytes:
    """The record's line (without the newline)."""
    return _encoder.encode(rec)


def decode(line: bytes | str) -> OutputRecord | dict | None:
    """A line as a record: the declared Struct; a JSON object with a string `kind` the
    declaration does not describe as a plain dict; None for anything else (not JSON, not an
    object, no kind, a `t` that is not a Time, nested deeper than MAX_DEPTH, an int beyond 64
    bits). Never raises: readers count a None as a line skipped."""
    try:
        rec = _typed.decode(line)
        if rec.__class__ not in _FREE_FORM:    # metrics, system, gpu, daemon: flat by declaration
            return rec
        return None if _beyond_bounds(getattr(rec, _FREE_FORM[rec.__class__]), MAX_DEPTH - 1) else rec
    except msgspec.ValidationError:
        pass
    except (ValueError, RecursionError):   # msgspec.DecodeError, a UnicodeDecodeError; too deep
        return None
    try:
        rec = _plain.decode(line)
    except (ValueError, RecursionError):   # not JSON after all: the typed decoder stops at the
        return None                        # first wrong type, before the bytes that are not
    if not isinstance(rec, dict) or not isinstance(rec.get("kind"), str):
        return None
    t = rec.get("t", 0.0)
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0.0 <= t < MAX_T:
        return None
    return None if _beyond_bounds(rec, MAX_DEPTH) else rec


def _beyond_bounds(obj: Any, max_depth: int) -> bool:
    """Whether dicts and lists nest in `obj` more than max_depth levels, or it holds an int
    beyond 64 bits (the declared fields' bound: a 400-digit int is an OverflowError in every
    reader that draws it as a float). An explicit stack: the check itself never recurses."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            return True
        for v in (value.values() if isinstance(value, dict) else value):
            if isinstance(v, (dict, list)):
                stack.append((v, depth + 1))
            elif isinstance(v, int) and not _MIN_INT <= v <= _MAX_INT:
                return True
    return False


def with_values(rec: OutputRecord | dict, values: dict) -> OutputRecord | dict:
    """A copy of `rec` (a record or a record's dict) with other `values`."""
    if isinstance(rec, OutputRecord):
        return msgspec.structs.replace(rec, values=values)
    return {**rec, "values": values}


def check(line: bytes | str) -> OutputRecord:
    """A line as the declared Struct, or msgspec.ValidationError / DecodeError saying where it
    is not one (the tests hold every line a daemon wrote to this)."""
    return _typed.decode(line)
