"""Record schema and wire format shared by the telemetry client and daemon (see README.md)."""
from protocol.codec import (
    MalformedRecord,
    decode,
    encode,
    encode_bye,
    encode_event,
    encode_hello,
    encode_metrics,
)
from protocol.records import (
    KIND_BYE,
    KIND_EVENT,
    KIND_HELLO,
    KIND_METRICS,
    KIND_NAMES,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Bye,
    Event,
    Hello,
    Metrics,
    Record,
)

__all__ = [
    "Bye", "Event", "Hello", "KIND_BYE", "KIND_EVENT", "KIND_HELLO", "KIND_METRICS", "KIND_NAMES",
    "MAX_FRAME_BYTES", "MalformedRecord", "Metrics", "PROTOCOL_VERSION", "Record", "decode", "encode",
    "encode_bye", "encode_event", "encode_hello", "encode_metrics",
]
