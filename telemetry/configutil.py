"""Typed configs from mappings (YAML): one function for every config dataclass of the project.

`from_dict(cls, data, prefix)` builds dataclass `cls` from a mapping, recursing into nested
dataclasses, coercing YAML/command-line strings to the field's type, and refusing an unknown key
or a wrong type with a ConfigError that names the key's full path (e.g. `pollers.nvml_intervl_s`).
Each dataclass's own `__post_init__` then checks its values.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any


class ConfigError(ValueError):
    pass


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return from_dict(tp, value, prefix=key + ".")
    if origin is typing.Union or str(origin) == "types.UnionType":
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            out = tp(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected {tp.__name__}, got {value!r}") from None
        if tp is int and isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return out
    if tp is str:
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__}")
        return str(value)
    return value


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown key {prefix}{unknown[0]} (known: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{prefix}{exc}" if prefix and not str(exc).startswith(prefix) else str(exc)) from None


