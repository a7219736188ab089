"""What W&B makes of a logged dict's non-text keys and of the values its JSON encoder turns into
JSON (sets, bytes), applied by the drop-in as it flattens a row (wandb_run.flatten), so the
daemon's W&B run is given what W&B itself would have logged.

W&B (0.31) serializes a row with pydantic-core, falling back to its own JSON encoder for the
types pydantic-core does not know, and its core then flattens nested objects into nested keys:
- a top-level key must be text (wandb.log raises TypeError before anything is logged);
- a nested key that is not text is named by pydantic-core's rules for a JSON object's key:
  an int by its digits, a float by Python's repr ("0.5", "1e+16", "nan", "-inf"), a bool
  "true"/"false", None "None", a tuple its items' names joined by ",", an Enum by its value's
  name, a date or time its ISO text, a Decimal or UUID its text, a complex number without its
  parentheses, bytes as UTF-8 text; a numpy scalar as its Python number (W&B's fallback); any
  other key (an object, a frozenset, bytes that are not UTF-8) raises TypeError, as W&B's does;
- a set or frozenset is a list of its items (in iteration order); bytes and a bytearray are
  their UTF-8 text; bytes that are not UTF-8 raise UnicodeDecodeError (W&B's encoder decodes
  them strictly and the log call raises; a bytearray of them: W&B's TypeError).
"""
from __future__ import annotations

import datetime
import decimal
import enum
import uuid
from typing import Any


def nested_key_text(key: Any) -> str:
    """The name W&B gives a nested dict's key that is not text (see the module docstring)."""
    if isinstance(key, str):
        return str.__str__(key)
    if key is None:
        return "None"
    if isinstance(key, enum.Enum):
        return nested_key_text(key.value)
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        return float.__repr__(key)
    if type(key).__module__ == "numpy" and hasattr(key, "item") and getattr(key, "shape", None) == ():
        item = key.item()          # a numpy scalar: its Python number, as W&B's fallback converts it
        if type(item).__module__ != "numpy":
            return nested_key_text(item)
    if isinstance(key, tuple):
        return ",".join(nested_key_text(k) for k in key)
    if isinstance(key, (datetime.date, datetime.time)):
        return key.isoformat()
    if isinstance(key, (decimal.Decimal, uuid.UUID)):
        return str(key)
    if isinstance(key, complex):
        return str(key).strip("()")
    if isinstance(key, bytes):
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            pass
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def summary_key_text(key: Any) -> str:
    """A nested key of a dict set on `run.summary`: text only, as W&B's summary takes (it
    builds each key's dotted path by adding text, and raises this TypeError otherwise)."""
    if isinstance(key, str):
        return key
    raise TypeError(f'can only concatenate str (not "{type(key).__name__}") to str')


def json_value(value: Any) -> Any:
    """A set as the list W&B logs, bytes as their text; any other value as it is. Bytes that
    are not UTF-8 raise as W&B raises (see the module docstring)."""
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, bytearray):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise TypeError("Object of type bytearray is not JSON serializable") from None
    return value
