"""Wire encoding of the records in `protocol.records`: one MessagePack array per ZeroMQ frame.

Encoding builds the array as a plain tuple (the client's hot path: no Struct instance per call).
Decoding goes through a typed msgspec decoder, which rejects wrong kinds, wrong versions, wrong
types, out-of-range integers, bad names and malformed bytes in C, as it parses.
Nothing here ever unpickles or evaluates anything. Every failure raises `MalformedRecord`.
"""
from __future__ import annotations


from typing import Any, Mapping

import msgspec

from protocol.records import (
    KIND_BYE,
    KIND_EVENT,
    KIND_HELLO,
    KIND_METRICS,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Bye,
    Event,
    Hello,
    Metrics,
    Record,
)


class MalformedRecord(ValueError):
    """A frame that is not a valid record of a version this code understands."""


_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder | None = None   # built on first decode: the client never decodes


def _get_decoder() -> msgspec.msgpack.Decoder:
    global _decoder
    if _decoder is None:
        _decoder = msgspec.msgpack.Decoder(Record)
    return _decoder
_I64_MAX = (1 << 63) - 1


def encode_metrics(src: int, rank: int, seq: int, dropped: int, t_ns: int, step: int,
                   values: Mapping[str, float | int], encoder: msgspec.msgpack.Encoder = _encoder) -> bytes:
    return encoder.encode((KIND_METRICS, PROTOCOL_VERSION, src, rank, seq, dropped, t_ns, step, values))


def encode_event(src: int, rank: int, seq: int, dropped: int, t_ns: int, name: str,
                 data: Mapping[str, Any]) -> bytes:
    return _encoder.encode((KIND_EVENT, PROTOCOL_VERSION, src, rank, seq, dropped, t_ns, name, data))


def encode_hello(src: int, rank: int, seq: int, dropped: int, t_ns: int, info: Mapping[str, Any]) -> bytes:
    return _encoder.encode((KIND_HELLO, PROTOCOL_VERSION, src, rank, seq, dropped, t_ns, info))


def encode_bye(src: int, rank: int, seq: int, dropped: int, t_ns: int, stats: Mapping[str, Any]) -> bytes:
    return _encoder.encode((KIND_BYE, PROTOCOL_VERSION, src, rank, seq, dropped, t_ns, stats))


def encode(record: Record) -> bytes:
    """Encode a decoded record again (tests, forwarding between daemons)."""
    return _encoder.encode(record)


def decode(frame: bytes | memoryview) -> Record:
    """Decode and validate one frame; raise MalformedRecord on anything wrong."""
    if len(frame) > MAX_FRAME_BYTES:
        raise MalformedRecord(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        record = (_decoder or _get_decoder()).decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedRecord(str(exc)) from None
    except RecursionError:  # deeply nested maps/arrays inside an event's data
        raise MalformedRecord("nesting too deep") from None
    return record


__all__ = [
    "KIND_BYE", "KIND_EVENT", "KIND_HELLO", "KIND_METRICS", "MalformedRecord", "decode", "encode",
    "encode_bye", "encode_event", "encode_hello", "encode_metrics", "Hello", "Metrics", "Event", "Bye",
]
