"""Record schema, version 1. The wire encoding is in `protocol.codec`; both are written down
in protocol/README.md.

Every record is one ZeroMQ frame holding one MessagePack array. The first seven elements are
the same for every kind (the header); the rest depend on the kind:

    [kind, version, src, rank, seq, dropped, t_ns, *body]

    kind     int  1 hello, 2 metrics, 3 event, 4 bye
    version  int  PROTOCOL_VERSION (1); any other is rejected
    src      int  random 63-bit id of one client instance (one process's TelemetryClient);
                  sequence numbers are per src, so a restarted or forked rank is told apart
    rank     int  global rank (0..MAX_RANK, 2^20 - 1)
    seq      int  per-src record number, 0, 1, 2 ... counting every record the client tried
                  to send, including those it dropped; gaps seen by the daemon are losses
    dropped  int  how many records this src has dropped so far (cumulative, never decreases)
    t_ns     int  wall clock at the client, time.time_ns()

    hello    body: [info]          info: map str -> any (run_name, host, pid, local_rank,
                                   world_size, config, model, ...)
    metrics  body: [step, values, parts?]
                                   step: int >= 0; values: map str -> float|int|bool|nil;
                                   parts (optional, 1 when absent): how many metrics records
                                   this rank sends for this step in all, this one included
                                   (1..MAX_PARTS), so the daemon knows when the rank is done
                                   with the step (a training record and an eval record: 2)
    event    body: [name, data]    name: str; data: map str -> any
    bye      body: [stats]         stats: map str -> any (the client's final counters)

Decoding validates types and bounds (see `protocol.codec.decode`); trailing elements beyond a
kind's body are ignored so a later minor version may append fields.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec

from protocol.constants import (KIND_BYE, KIND_EVENT, KIND_HELLO, KIND_METRICS, MAX_NAME_CHARS, MAX_PARTS, MAX_RANK,
                                MAX_VALUES)



# The bounds are msgspec constraints, so the decoder checks them in C as it parses (a Python
# pass over every record cost more than the parse itself).
U63 = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
Rank = Annotated[int, msgspec.Meta(ge=0, le=MAX_RANK)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_CHARS)]
# bool and None (a value that could not be computed) are accepted so one odd value does not
# cost the whole record; the daemon writes them as JSON true/false/null.
# The keys are plain str here, not Name: msgspec interns unconstrained map keys (every record's
# "train/loss" is one str object, its hash computed once) but allocates a new str per key for a
# constrained one, which costs more per record in the decode and in the dict work downstream.
# `protocol.codec.decode` checks the names' lengths instead, once per distinct key set.
Values = Annotated[dict[str, Union[float, int, bool, None]], msgspec.Meta(max_length=MAX_VALUES)]


# gc=False: a decoded record holds only what msgpack decodes (no reference cycles are possible),
# so the cyclic collector need not track it; cheaper to build and to free.
class _Header(msgspec.Struct, array_like=True, tag_field="kind", frozen=True, gc=False):
    version: Literal[1]            # PROTOCOL_VERSION; a record of another version is rejected
    src: U63
    rank: Rank
    seq: U63
    dropped: U63
    t_ns: U63


class LooseHeader(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The header of a frame the full decoder refused (a negative step, a bad value): read
    without the body (trailing elements are skipped unchecked), so the receiver can still count
    the record as received from its src: refused once (malformed), not also lost (a seq gap)."""
    kind: Annotated[int, msgspec.Meta(ge=KIND_HELLO, le=KIND_BYE)]
    version: Literal[1]
    src: U63
    rank: U63
    seq: U63
    dropped: U63


class Hello(_Header, tag=KIND_HELLO, frozen=True):
    info: dict[str, Any]


class Metrics(_Header, tag=KIND_METRICS, frozen=True):
    step: U63
    values: Values
    # Appended in a minor version: a frame without it (every older client) is one record per
    # rank per step, as before; an older daemon ignores it (trailing elements are skipped).
    parts: Annotated[int, msgspec.Meta(ge=1, le=MAX_PARTS)] = 1


class Event(_Header, tag=KIND_EVENT, frozen=True):
    name: Name
    data: dict[str, Any]


class Bye(_Header, tag=KIND_BYE, frozen=True):
    stats: dict[str, Any]


Record = Union[Hello, Metrics, Event, Bye]
