"""Record schema and wire format shared by the telemetry client and daemon (see README.md).

The schema classes (Hello, Metrics, Event, Bye, Record) are msgspec structs, imported on first
use: the training-side client only encodes and never pays for them.
"""
from protocol.codec import (
    MalformedRecord,
    decode,
    encode,
    encode_bye,
    encode_event,
    encode_hello,
    encode_metrics,
    new_packer,
)
from protocol.constants import (
    KIND_BYE,
    KIND_EVENT,
    KIND_HELLO,
    KIND_METRICS,
    KIND_NAMES,
    MAX_FRAME_BYTES,
    MAX_NAME_CHARS,
    MAX_RANK,
    MAX_VALUES,
    PROTOCOL_VERSION,
)

_SCHEMA = ("Bye", "Event", "Hello", "Metrics", "Record")


def __getattr__(name: str):
    if name in _SCHEMA:
        from protocol import records

        return getattr(records, name)
    raise AttributeError(f"module 'protocol' has no attribute {name!r}")


__all__ = [
    "Bye", "Event", "Hello", "KIND_BYE", "KIND_EVENT", "KIND_HELLO", "KIND_METRICS", "KIND_NAMES",
    "MAX_FRAME_BYTES", "MAX_NAME_CHARS", "MAX_RANK", "MAX_VALUES", "MalformedRecord", "PROTOCOL_VERSION", "Record",
    "decode", "encode", "encode_bye", "encode_event", "encode_hello", "encode_metrics", "new_packer",
]
