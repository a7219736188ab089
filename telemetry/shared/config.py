"""One config machinery for the whole repository: typed dataclass sections from YAML plus overrides.

    cfg = load(DaemonConfig, "daemon.yaml", {"wandb.mode": "offline", "log_dir": None})   # flags
    cfg = load(TrainConfig, "tiny.yaml", ["steps=20", "optim.lr=1e-4"])                    # a command line
    sec = build(PollersConfig, {"nvml_interval_s": 2}, "pollers")                          # one section

A config is a tree of `@dataclass(kw_only=True, slots=True)` sections. Each section checks its own
values in `__post_init__` (a ValueError); this module does the rest, once for every section:
it builds the tree from a mapping, recursing into nested sections (also `list[Section]` and
`Section | None`), checks every value against its field's annotation (`int`, `float`, `bool`,
`str`, `X | None`, `list[X]`, `tuple[X, ...]`, `dict[K, V]`, `Any`), and refuses unknown keys.
Numbers are checked here once for every key: a float must be finite (YAML's .nan and .inf are
refused: `step_timeout_s: .nan` would never expire a step), a `*_s` key is at most a year of
seconds and an int must fit in 64 bits; each
section's __post_init__ then checks its own ranges. Command-line flags use the same predicate
through `number_arg` (an argparse `type=`).
Every error is a ConfigError that names the dotted key: `unknown config key 'pollers.nvml_intervl_s'`,
`config key 'data.datasets[1].weight' must be float, got str 'x'`.

YAML keys are the field names; a field whose key is a Python keyword names it in its metadata:
`cls: str = field(default="", metadata={"key": "class"})`.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import stat
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from telemetry.shared.numbers import is_int, is_number

T = TypeVar("T")

# The largest int a config key may hold: every count or size ends up in a C long (libzmq,
# numpy, the OS); beyond it a value is an OverflowError deep in set-up, not a config error.
MAX_INT = 2**63 - 1
# The longest duration a `*_s` key may hold (a year): beyond it a typo, and a wait that long
# overflows the clocks it is handed to (threading's timeouts, libzmq's int milliseconds).
MAX_SECONDS = 365 * 86_400.0
# A config file is a few kB; more is not a config (and `--config /dev/zero` must not hang).
MAX_CONFIG_BYTES = 4 << 20
# What one YAML (or JSON) config may stand for once parsed: nodes with every alias expanded (a
# config is hundreds; a kB of nested aliases is billions) and levels of nesting (a config is a
# handful; parsing and every reader of the result recurse once per level).
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64


class ConfigError(ValueError):
    """A config that cannot be used; the message names the dotted key. Programs exit with 2."""


class ConfigFileError(ConfigError):
    """A config file that cannot be read at all (missing, a directory, a FIFO, too big, not
    UTF-8); `why` is the reason alone, for a command that names the file its own way."""

    def __init__(self, path: str | os.PathLike, why: str) -> None:
        super().__init__(f"config file {path}: {why}")
        self.why = why


# -- building sections -----------------------------------------------------------------------------
def build(cls: type[T], data: Any, key: str = "") -> T:
    """Build section `cls` from a mapping; `key` is its dotted name in the whole config ("" = top)."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"config key {key!r} must be a mapping, got {_describe(data)}" if key
                          else f"the config must be a mapping, got {_describe(data)}")
    fields = _fields(cls)   # YAML key -> (field name, type, required)
    kwargs: dict[str, Any] = {}
    for yaml_key, value in data.items():
        dotted = _join(key, yaml_key)
        if yaml_key not in fields:
            raise ConfigError(f"unknown config key {dotted!r}; known keys here: {', '.join(sorted(fields))}")
        name, hint, _ = fields[yaml_key]
        kwargs[name] = _coerce(value, hint, dotted)
    missing = [k for k, (name, _, required) in fields.items() if required and name not in kwargs]
    if missing:
        raise ConfigError(f"config key {_join(key, missing[0])!r} is required")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:   # the section's own checks in __post_init__
        msg = str(exc)
        raise ConfigError(msg if not key or msg.startswith(key) else f"{key}: {msg}") from None


@functools.cache
def _fields(cls: type) -> dict[str, tuple[str, Any, bool]]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out[f.metadata.get("key", f.name)] = (f.name, hints[f.name], required)
    return out


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """`value` as the annotated type (ints for floats, lists for tuples), or a ConfigError naming `key`."""
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        return build(hint, value, key)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if value == {} and type(None) in args:
            # An optional section left empty that cannot be built empty (`forward: {}`: no
            # endpoint) is one not given, as it meant before sections were typed.
            try:
                return _coerce(value, next(a for a in args if a is not type(None)), key)
            except ConfigError:
                return None
        options = [a for a in args if a is not type(None)]
        for option in options[:-1]:
            try:
                return _coerce(value, option, key)
            except ConfigError:
                pass
        return _coerce(value, options[-1], key)
    if hint is float:
        if isinstance(value, str) and "e" in value.lower():
            try:   # YAML 1.1 reads 1e-4 (an exponent without a dot) as a string: take it as meant
                value = float(value)
            except ValueError:
                pass
        if is_number(value):
            try:
                value = float(value)
            except OverflowError:   # an int beyond any float
                raise ConfigError(f"config key {key!r} must be a finite number, got {_describe(value)}") from None
            if not math.isfinite(value):
                raise ConfigError(f"config key {key!r} must be a finite number, got {value!r}")
            if key.endswith("_s") and abs(value) > MAX_SECONDS:   # names carry their unit
                raise ConfigError(f"config key {key!r} is seconds: at most {MAX_SECONDS:g} (a year), got {value!r}")
            return value
        raise _wrong(key, "float", value)
    if hint is int:
        if is_int(value):
            if not -MAX_INT - 1 <= value <= MAX_INT:
                raise ConfigError(f"config key {key!r} is out of range (a 64-bit integer), got {_describe(value)}")
            return value
        raise _wrong(key, "int", value)
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _wrong(key, "a list", value)
        if not args:
            return list(value) if (origin or hint) is list else tuple(value)
        item = args[0]
        items = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise _wrong(key, "a mapping", value)
        if not args:
            return dict(value)
        k_type, v_type = args
        return {_coerce(k, k_type, f"{key} (a key)"): _coerce(v, v_type, _join(key, k)) for k, v in value.items()}
    if isinstance(hint, type):
        if isinstance(value, hint):
            return value
        raise _wrong(key, hint.__name__, value)
    return value


def _wrong(key: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"config key {key!r} must be {expected}, got {_describe(value)}")


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


# -- reading files and overrides --------------------------------------------------------------------
def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in a YAML file; every way a file can be unusable is a ConfigError naming it."""
    data = parse_yaml(read_text(path), f"config file {path}")
    if data is None:   # an empty file: every default
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping, got {_describe(data)}")
    return data


def parse_yaml(text: str, source: str) -> Any:
    """YAML text as Python data, within the bounds (MAX_YAML_NODES once aliases are expanded,
    MAX_YAML_DEPTH), checked on yaml's node graph before any object is built: a few hundred
    bytes of nested aliases ("billion laughs") or `[[[[...` are a ConfigError naming `source`
    ("config file x.yaml", "override 'a=b'"), never gigabytes or a RecursionError. Every place
    that reads YAML reads it here."""
    import yaml

    try:
        loader = _bounded_loader()(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except _YamlBound as exc:
        raise ConfigError(f"{source}: {exc}; not a config") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {_yaml_said(exc)}") from None
    except ValueError as exc:   # a scalar yaml resolves but cannot build: 5,000 digits, a 13th month
        raise ConfigError(f"{source}: not usable YAML: {str(exc).split(';')[0]}") from None


def _yaml_said(exc: Exception) -> str:
    """A YAML error in one line: what was wrong and where (line, column of the file), rather
    than PyYAML's several lines, whose last is only a caret under the spot."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if problem is None:
        return " ".join(str(exc).split())
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context = getattr(exc, "context", None)
    return f"{problem}{where}" + (f" ({context})" if context else "")


def parse_json(text: str, source: str) -> Any:
    """JSON text (a model's config.json) as Python data, nested at most MAX_YAML_DEPTH deep
    (JSON has no aliases): a ConfigError naming `source` otherwise, never a RecursionError."""
    import json

    try:
        data = json.loads(text)
    except RecursionError:
        raise ConfigError(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels; not a config") from None
    except ValueError as exc:    # json.JSONDecodeError, an int of too many digits
        raise ConfigError(f"{source}: not valid JSON: {exc}") from None
    stack = [(data, 1)]
    while stack:                 # an explicit stack: the check itself never recurses
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels; not a config")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return data


class _YamlBound(Exception):
    """A YAML document beyond MAX_YAML_NODES or MAX_YAML_DEPTH (the message says which)."""


@functools.cache
def _bounded_loader() -> type:
    """yaml's SafeLoader, counting while it composes the node graph: for each node, the nodes
    it stands for with every alias in it expanded and the depth it reaches (aliases shared,
    so each is counted once per node: linear in the file). Objects are built only from a
    graph within the bounds."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._depth = 0
            self._sizes: dict[int, tuple[int, int]] = {}   # id(node) -> (expanded nodes, depth)

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self._depth >= MAX_YAML_DEPTH:
                raise _YamlBound(f"nested deeper than {MAX_YAML_DEPTH} levels")
            alias = self.check_event(yaml.AliasEvent)
            self._depth += 1
            try:
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            sizes = self._sizes
            if alias:
                if id(node) not in sizes:   # a node that holds its own alias: endless once expanded
                    raise _YamlBound("an alias refers to a node that contains it")
                return node
            if isinstance(node, yaml.ScalarNode):
                sizes[id(node)] = (1, 1)
                return node
            if isinstance(node, yaml.MappingNode):
                # A key given twice: yaml keeps the last one, silently; a config's author meant one.
                seen = set()
                for key, _ in node.value:
                    if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                        if key.value in seen:
                            raise _YamlBound(f"the key {key.value[:80]!r} is given twice in one mapping "
                                             f"(line {key.start_mark.line + 1})")
                        seen.add(key.value)
            children = node.value if isinstance(node, yaml.SequenceNode) else \
                [n for pair in node.value for n in pair]
            num, depth = 1, 1
            for child in children:
                child_num, child_depth = sizes[id(child)]
                num += child_num
                depth = max(depth, child_depth + 1)
            if num > MAX_YAML_NODES:
                raise _YamlBound(f"more than {MAX_YAML_NODES:,} YAML nodes once its aliases are expanded")
            if depth > MAX_YAML_DEPTH:
                raise _YamlBound(f"nested deeper than {MAX_YAML_DEPTH} levels once its aliases are expanded")
            sizes[id(node)] = (num, depth)
            return node

    return BoundedLoader


def read_text(path: str | os.PathLike, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """A config file's text (YAML, a JSON model config): a regular file of at most max_bytes,
    UTF-8; anything else (missing, a directory, a FIFO, /dev/zero, too big) is a ConfigError."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; only a regular file is read,
        # and only so much of it (/dev/zero is endless).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ConfigFileError(path, "not found") from None
    except OSError as exc:
        raise ConfigFileError(path, f"cannot read it ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise ConfigFileError(path, "is a directory, not a file" if stat.S_ISDIR(mode) else "not a regular file")
        with os.fdopen(fd, "rb") as f:
            raw = f.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise ConfigFileError(path, f"larger than {max_bytes:,} bytes; not a config")
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigFileError(path, "not YAML (not UTF-8 text)") from None
    except OSError as exc:
        raise ConfigFileError(path, f"cannot read it ({exc.strerror or exc})") from None


def number_arg(kind: type = float, *, lo: float | None = None, hi: float | None = None,
               lo_open: bool = False) -> Any:
    """An argparse `type=` for a numeric flag, with the config keys' rules: finite, in
    [lo, hi] (lo excluded with lo_open). `--timeout nan` is then argparse's one-line error and
    exit 2, before anything is set up.

        p.add_argument("--timeout", type=number_arg(lo=0, lo_open=True, hi=86400.0), default=3.0)
    """
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{'an integer' if kind is int else 'a number'} expected, "
                                             f"got {text[:40]!r}") from None
        if not math.isfinite(v) or (kind is int and not -MAX_INT - 1 <= v <= MAX_INT):
            raise argparse.ArgumentTypeError(f"a finite number expected, got {text[:40]!r}")
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise argparse.ArgumentTypeError(f"must be {'>' if lo_open else '>='} {lo:g}, got {text[:40]!r}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi:g}, got {text[:40]!r}")
        return v
    parse.__name__ = kind.__name__   # argparse names the type in its messages
    return parse


def writable_dir_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be an output directory, or None. Makes it (and its parents) when
    missing and writes a probe file in it: the only test that holds for root, for whom access()
    says yes to /proc."""
    import tempfile

    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{path}: cannot create or write it ({exc.strerror or exc})"
    return None


# What W&B refuses in a project or entity name, and in a run id (wandb_settings' validators), and
# the longest each may be here (a run id names W&B's run directory: a file name).
WANDB_PROJECT_FORBIDDEN, WANDB_RUN_ID_FORBIDDEN = "/\\#?%:", ":;,#?/'\\ "


def wandb_name_problem(text: str, what: str, forbidden: str, max_chars: int = 128) -> str | None:
    """Why `text` cannot be a W&B project, entity, run id or name, or None: empty, too long, a
    character W&B refuses (it would raise after set-up, in the sink's thread or with a
    traceback) or a control character."""
    if not text.strip():
        return f"a {what} is needed, got an empty string"
    if len(text) > max_chars:
        return f"a {what} is at most {max_chars} characters, got {len(text)}"
    bad = sorted({c for c in text if c in forbidden or not c.isprintable()})
    if bad:
        return f"a {what} cannot contain {' '.join(repr(c) for c in bad)}"
    return None


def nonempty_arg(text: str) -> str:
    """An argparse `type=` for a name or path flag: an empty value is an error, not the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a value is needed, got an empty string")
    return text


# What an output path of "-" means on every command line: stdout (goodput --json -).
STDOUT_PATH = "-"


def out_dir_arg(text: str) -> str:
    """An argparse `type=` for a directory a command writes into: not empty, and not "-", which
    names stdout on our command lines (an output FILE of "-" is stdout) and cannot hold a
    directory's files; a directory of that name is ./-."""
    text = nonempty_arg(text)
    if text == STDOUT_PATH:
        raise argparse.ArgumentTypeError("- is stdout, which cannot hold a directory of files "
                                         "(a directory named -: write ./-)")
    return text


def parse_override(item: str) -> tuple[str, Any]:
    """`dotted.key=value` from a command line; the value is read as YAML (`lr=1e-4`, `ids=[0, 1]`)."""
    key, eq, text = item.partition("=")
    if not eq:
        raise ConfigError(f"override {item!r} is not key=value")
    if not key or "" in key.split("."):
        raise ConfigError(f"override {item!r} has an empty key")
    if text == "":
        return key, ""
    return key, parse_yaml(text, f"override {item[:60]!r}")


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """data["a"]["b"] = value for "a.b", making missing (or empty: `a:` in YAML) sections."""
    node = data
    parts = dotted.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"config key {'.'.join(parts[:i + 1])!r} must be a mapping (to set {dotted!r}), "
                              f"got {_describe(child)}")
        node = child
    node[parts[-1]] = value


def load(cls: type[T], path: str | os.PathLike | None = None,
         overrides: Mapping[str, Any] | Iterable[str] = ()) -> T:
    """Build `cls` from a YAML file (None: every default) with overrides applied on top.

    overrides: `key.sub=value` strings (a command line), or a mapping of dotted keys to values
    (argparse flags; a None value is a flag not given and leaves the file's value).
    """
    data = read_yaml(path) if path is not None else {}
    if isinstance(overrides, Mapping):
        items = [(k, v) for k, v in overrides.items() if v is not None]
    else:
        items = [parse_override(item) for item in overrides]
    for dotted, value in items:
        set_dotted(data, dotted, value)
    return build(cls, data)
