"""What counts as a number in a record, said once: JSON and msgpack give bools, which Python
counts as ints; a value that is True is a flag, never 1.

The daemon's hot loops (loops.py and its C twin) inline the same tests for speed."""
from __future__ import annotations

import math
from typing import Any

# The largest int a float holds exactly (2**53): beyond it an int is not taken as a quantity.
EXACT_INT_LIMIT = 1 << 53


def is_number(v: Any) -> bool:
    """An int or a float (NaN and infinities included), not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_int(v: Any) -> bool:
    """An int, not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def positive_finite(v: Any) -> float | None:
    """v as a float if it is a number in (0, inf) (an int up to EXACT_INT_LIMIT), else None:
    a bool, a string, NaN, zero or a negative is not one."""
    if isinstance(v, float):
        return v if 0.0 < v < math.inf else None
    if is_int(v) and 0 < v <= EXACT_INT_LIMIT:
        return float(v)
    return None


def nonfinite_as_null(obj: Any) -> Any:
    """The same structure with NaN and infinities as None (JSON has no such numbers): the
    dashboard's answers, the media keeper's tables."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: nonfinite_as_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [nonfinite_as_null(v) for v in obj]
    return obj
