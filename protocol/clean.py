"""Free-form maps (a hello's info, an event's data, a bye's stats) made writable by every sink.

The decoder (protocol.codec) already refuses what no sink could write anywhere in a frame:
invalid UTF-8 and msgpack ext types. What it accepts in a free-form map but JSON cannot hold is
a map key that is not a string (msgpack allows nil, numbers, booleans and arrays as keys; a
user's `tm.event("x", {1: ...})` sends an int): such keys are turned into their JSON text
("null", "1", "[0, 1]") so the record is kept. Metrics records need none of this: their values
are typed (float, int, bool, nil) and their names are strings, checked in C as they parse.

Runs on the rare kinds only (hellos, events, byes), never on metrics: a walk of the map that
returns the very same object when nothing needed changing. A map nested deeper than every reader
of the daemon's lines takes (protocol.output.MAX_DEPTH, the record's own object the first level)
is refused here, at ingest, rather than written and then skipped by each reader.
"""
from __future__ import annotations

from typing import Any

import msgspec

from protocol.output import MAX_DEPTH

_json = msgspec.json.Encoder()
# A free-form map is the record's second level.
MAX_FREE_FORM_DEPTH = MAX_DEPTH - 1


def key_text(key: Any) -> str:
    """A map key as text: a str as it is; anything else as its JSON ("null", "1", "[0,1]")."""
    if isinstance(key, str):
        return key
    try:
        return _json.encode(key).decode()
    except (TypeError, ValueError, OverflowError):
        return repr(key)


def clean(obj: Any, max_depth: int = MAX_FREE_FORM_DEPTH) -> Any:
    """`obj` with every map key a str (see the module docstring); `obj` itself if it has none
    other. Raises RecursionError on maps and lists nested more than max_depth levels (`obj` the
    first; the caller counts the record as malformed)."""
    if max_depth < 1 and isinstance(obj, (dict, list)):
        raise RecursionError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(obj, dict):
        out = None
        for key, value in obj.items():
            new_value = clean(value, max_depth - 1) if isinstance(value, (dict, list)) else value
            if out is None and (new_value is not value or type(key) is not str):
                out = {}
                for k, v in obj.items():       # copy what came before, unchanged
                    if k is key:
                        break
                    out[k] = v
            if out is not None:
                out[key if type(key) is str else key_text(key)] = new_value
        return obj if out is None else out
    if isinstance(obj, list):
        out = None
        for i, value in enumerate(obj):
            new_value = clean(value, max_depth - 1) if isinstance(value, (dict, list)) else value
            if out is None and new_value is not value:
                out = list(obj[:i])
            if out is not None:
                out.append(new_value)
        return obj if out is None else out
    return obj
