"""Wire encoding of the records in `protocol.records`: one MessagePack array per ZeroMQ frame.

Encoding packs a plain tuple with msgpack (the client's hot path: no Struct instance per call;
msgpack imports several times faster than msgspec, which the client's start-up budget needs
(benchmarks/RESULTS.md, "Client cost"); the bytes are the same). Decoding goes through a typed
msgspec decoder, which rejects wrong kinds, wrong versions, wrong types, out-of-range integers,
bad names and malformed bytes in C, as it parses.
Nothing here ever unpickles or evaluates anything. Every failure raises `MalformedRecord`.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import msgpack

from protocol.constants import (
    KIND_BYE,
    KIND_EVENT,
    KIND_HELLO,
    KIND_METRICS,
    MAX_FRAME_BYTES,
    MAX_NAME_CHARS,
    MAX_STEP,
    PROTOCOL_VERSION,
)


class MalformedRecord(ValueError):
    """A frame that is not a valid record of a version this code understands."""


def _native_pack_ints_map() -> Callable[..., bytes | None] | None:
    """The C encoder of a metrics frame (_pack.c), or None: not built (no C compiler at install)
    or TELEMETRY_PURE_PYTHON set (the same switch as the daemon's C loops)."""
    if os.environ.get("TELEMETRY_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from protocol._pack import pack_ints_map
    except ImportError:
        return None
    return pack_ints_map


# pack_ints_map(*ints, values): msgpack's bytes of the tuple (*ints, values) when `values` is a
# dict of plain numbers under str keys, else None (then pack the tuple with a Packer: it also
# takes every other value, calls its `default` hook, and raises msgpack's errors). In C, without
# msgpack's general walk, which on cold caches after a training step is most of the client's
# log() (benchmarks/RESULTS.md, Client cost). None when not built.
pack_ints_map: Callable[..., bytes | None] | None = _native_pack_ints_map()


def checked_pack(packer: msgpack.Packer) -> Callable[..., bytes | None]:
    """pack_ints_map's contract in Python, where the C part is not built: the frame's bytes when
    every header int is in 0..MAX_STEP and `values` a dict of plain numbers (float, int in 64
    bits, bool, None) under names of 1..MAX_NAME_CHARS characters; else None (the caller's slow
    path sorts the record out). Dearer than C by a Python look at each value."""
    pack = packer.pack

    def pack_ints_map_py(*frame: Any) -> bytes | None:
        values = frame[-1]
        if values.__class__ is not dict:
            return None
        for x in frame[:-1]:
            if x.__class__ is not int or not 0 <= x <= MAX_STEP:
                return None
        for k, v in values.items():
            if k.__class__ is not str or not 0 < len(k) <= MAX_NAME_CHARS:
                return None
            c = v.__class__
            if c is int:
                if not -(1 << 63) <= v < (1 << 64):
                    return None
            elif c is not float and c is not bool and v is not None:
                return None
        try:
            return pack(frame)
        except ValueError:      # a name with no UTF-8 form (a lone surrogate): as the C encode, not here
            return None

    return pack_ints_map_py


def new_packer(default: Any = None) -> msgpack.Packer:
    """An encoder for one thread (a Packer keeps a buffer: never share one across threads).

    `default` is called for a value msgpack does not encode natively (a tensor, a numpy scalar);
    what it raises aborts the encode and leaves the packer ready for the next one.
    """
    return msgpack.Packer(default=default, use_bin_type=True)


def encode_metrics(src: int, rank: int, seq: int, dropped: int, t_ns: int, step: int,
                   values: Mapping[str, Any], packer: msgpack.Packer | None = None, parts: int = 1) -> bytes:
    """The hot path: one pack of a prebuilt tuple (the client passes its own packer). `parts`:
    how many metrics records this rank sends for `step` in all; 1 is not written (the frame of
    a client that predates the field)."""
    if parts == 1:
        frame = (KIND_METRICS, PROTOCOL_VERSION, src, rank, seq, dropped, t_ns, step, values)
    else:
        frame = (KIND_METRICS, PROTOCOL_VERSION, src, rank, seq, dropped, t_ns, step, values, parts)
    if pack_ints_map is not None and parts == 1:
        out = pack_ints_map(*frame)
        if out is not None:
            return out
    return packer.pack(frame) if packer is not None else msgpack.packb(frame, use_bin_type=True)


def encode_event(src: int, rank: int, seq: int, dropped: int, t_ns: int, name: str,
                 data: Mapping[str, Any]) -> bytes:
    return msgpack.packb((KIND_EVENT, PROTOCOL_VERSION, src, rank, seq, dropped, t_ns, name, data),
                         use_bin_type=True)


def encode_hello(src: int, rank: int, seq: int, dropped: int, t_ns: int, info: Mapping[str, Any]) -> bytes:
    return msgpack.packb((KIND_HELLO, PROTOCOL_VERSION, src, rank, seq, dropped, t_ns, info), use_bin_type=True)


def encode_bye(src: int, rank: int, seq: int, dropped: int, t_ns: int, stats: Mapping[str, Any]) -> bytes:
    return msgpack.packb((KIND_BYE, PROTOCOL_VERSION, src, rank, seq, dropped, t_ns, stats), use_bin_type=True)


# The daemon's side: a typed msgspec decoder, built on first use, so that importing this module
# (the client does) costs neither msgspec nor the schema classes.
_decoder: Any = None
_DecodeErrors: tuple = ()
_Metrics: Any = None
# Key sets (in order) whose names were checked, each mapped to itself: one canonical tuple per
# distinct key set, which the daemon compares by identity. Bounded: a run logs a handful of sets.
_good_names: dict[tuple, tuple] = {}
GOOD_NAMES_KEPT = 4096


def _get_decoder() -> Any:
    global _decoder, _DecodeErrors
    if _decoder is None:
        import msgspec

        from protocol.records import Metrics, Record

        global _Metrics
        _Metrics = Metrics
        # UnicodeDecodeError: invalid UTF-8 in any string of the frame (msgspec raises it as it
        # parses); MalformedRecord: an ext type (_refuse_ext). No sink could write either.
        _DecodeErrors = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, MalformedRecord)
        _decoder = msgspec.msgpack.Decoder(Record, ext_hook=_refuse_ext)
    return _decoder


def _refuse_ext(code: int, data: memoryview) -> Any:
    """The protocol has no msgpack ext types (a timestamp, a tool's own types): no sink can
    write one, so a frame holding one anywhere is malformed."""
    raise MalformedRecord(f"msgpack ext type {code} is not part of the protocol")


def check_names(keys: tuple) -> tuple:
    """Metric names are 1..MAX_NAME_CHARS characters. Checked in Python, but once per distinct
    key set: the tuple of a record's keys (interned strs, see records.Values) is the cache key.
    Returns the canonical tuple for this key set (equal key sets get the same object)."""
    canonical = _good_names.get(keys)
    if canonical is not None:
        return canonical
    for name in keys:
        if not 0 < len(name) <= MAX_NAME_CHARS:
            raise MalformedRecord(f"metric name of {len(name)} characters (1..{MAX_NAME_CHARS})")
    if len(_good_names) >= GOOD_NAMES_KEPT:
        _good_names.clear()
    _good_names[keys] = keys
    return keys


def encode(record: Any) -> bytes:
    """Encode a decoded record again (tests, forwarding between daemons): the bytes its client
    sent (a metrics record's `parts` of 1 is left out, as the client leaves it out)."""
    import msgspec

    from protocol.records import Metrics

    if type(record) is Metrics:
        r = record
        return encode_metrics(r.src, r.rank, r.seq, r.dropped, r.t_ns, r.step, r.values, parts=r.parts)
    return msgspec.msgpack.encode(record)


def decode(frame: bytes | memoryview) -> Any:
    """Decode and validate one frame; raise MalformedRecord on anything wrong."""
    if len(frame) > MAX_FRAME_BYTES:
        raise MalformedRecord(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        record = (_decoder or _get_decoder()).decode(frame)
    except _DecodeErrors as exc:
        raise MalformedRecord(str(exc) or type(exc).__name__) from None
    except RecursionError:  # deeply nested maps/arrays inside an event's data
        raise MalformedRecord("nesting too deep") from None
    if type(record) is _Metrics:
        check_names(tuple(record.values))
    return record


_header_decoder: Any = None


def decode_header(frame: bytes | memoryview) -> tuple[int, int, int, int] | None:
    """(src, rank, seq, dropped) of a frame whose header is well formed, whatever its body; None
    for a frame that has none (see records.LooseHeader)."""
    global _header_decoder
    if _header_decoder is None:
        import msgspec

        from protocol.records import LooseHeader

        _header_decoder = msgspec.msgpack.Decoder(LooseHeader)
    try:
        h = _header_decoder.decode(frame)
    except Exception:       # anything at all: this frame is counted as malformed either way
        return None
    return h.src, h.rank, h.seq, h.dropped


_peek_decoder = None
_UINT_WIDTHS = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}
_U63 = 1 << 63


# Up to this size a frame's header is read by msgspec (LooseHeader, the whole frame parsed: the
# cheapest for a small frame); above it by hand from the first bytes, at a cost that does not grow
# with the frame, where msgspec's grows with every byte it parses.
PEEK_PARSE_MAX_BYTES = 4096


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int, int, int] | None:
    """(kind, src, rank, seq, dropped) of a frame, or None when it has no header (see
    records.LooseHeader for the fields and their bounds), at a cost that does not grow with the
    frame: the daemon accounts a frame it sheds unread. A frame above PEEK_PARSE_MAX_BYTES is
    read from its first bytes only, so a header followed by garbage still reads."""
    if len(frame) <= PEEK_PARSE_MAX_BYTES:
        try:
            h = (_peek_decoder or _get_peek_decoder()).decode(frame)
        except Exception:
            return None
        return h.kind, h.src, h.rank, h.seq, h.dropped
    head = bytes(frame[:64])
    try:
        t = head[0]
        if 0x90 <= t <= 0x9f:
            n, i = t & 0x0F, 1
        elif t == 0xDC:
            n, i = int.from_bytes(head[1:3], "big"), 3
        elif t == 0xDD:
            n, i = int.from_bytes(head[1:5], "big"), 5
        else:
            return None
        if n < 6:                 # kind, version, src, rank, seq, dropped (LooseHeader's fields)
            return None
        vals = []
        for _ in range(6):
            t = head[i]
            if t < 0x80:
                vals.append(t)
                i += 1
            else:
                width = _UINT_WIDTHS.get(t)
                if width is None or i + 1 + width > len(head):
                    return None
                vals.append(int.from_bytes(head[i + 1:i + 1 + width], "big"))
                i += 1 + width
    except IndexError:
        return None
    kind, version, src, rank, seq, dropped = vals
    if not KIND_HELLO <= kind <= KIND_BYE or version != PROTOCOL_VERSION or max(src, rank, seq, dropped) >= _U63:
        return None
    return kind, src, rank, seq, dropped


def _get_peek_decoder():
    global _peek_decoder
    if _peek_decoder is None:
        import msgspec

        from protocol.records import LooseHeader

        _peek_decoder = msgspec.msgpack.Decoder(LooseHeader)
    return _peek_decoder


def peek_headers(frames: list) -> list:
    """peek_header of each frame, in order: in one pass of the header decoder when every frame
    is small and has a header (a drain counting a backlog), without a Python call per frame;
    else frame by frame."""
    if frames and max(map(len, frames)) <= PEEK_PARSE_MAX_BYTES:
        try:
            return [(h.kind, h.src, h.rank, h.seq, h.dropped)
                    for h in map((_peek_decoder or _get_peek_decoder()).decode, frames)]
        except Exception:          # a frame without a header: peek_header says None for it
            pass
    return [peek_header(f) for f in frames]


def decoder_parts() -> tuple[Any, tuple, dict]:
    """For a caller that decodes in a loop of its own (the daemon's receiver), what `decode` is
    made of: the msgspec decoder's decode method, the exceptions it raises for bad input, and
    the key tuples already known good, each mapped to its canonical tuple (a Metrics record
    whose tuple(values) is not there must go through `check_names`). Frames must already be
    bounded by MAX_FRAME_BYTES (the daemon's socket has ZMQ_MAXMSGSIZE)."""
    decoder = _decoder or _get_decoder()
    return decoder.decode, (*_DecodeErrors, RecursionError), _good_names


__all__ = [
    "KIND_BYE", "KIND_EVENT", "KIND_HELLO", "KIND_METRICS", "MalformedRecord", "decode", "encode",
    "encode_bye", "encode_event", "encode_hello", "encode_metrics", "new_packer",
]
