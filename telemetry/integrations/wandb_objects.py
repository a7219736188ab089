"""The W&B-shaped objects of `telemetry.wandb` that hold no logging logic: `run.config`,
`run.summary`, their stand-ins before `wandb.init()`, and the stand-in for the parts of W&B this
drop-in does not offer. The run that uses them: telemetry/integrations/wandb_run.py.
"""
from __future__ import annotations

import dataclasses
import datetime
import enum
import os
import sys
import types
from collections.abc import MutableMapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, Callable, Iterator, Mapping

from telemetry.shared.wandb_keys import metric_name, nest


class Error(RuntimeError):
    """A misuse of the W&B API (W&B raises wandb.Error for the same)."""


class UsageError(Error):
    """An argument W&B refuses (W&B raises its UsageError, a wandb.Error: a run id it cannot take)."""


class CommError(Error):
    """W&B's error for a failed exchange with its server (not raised here: named so that a
    script's `except wandb.errors.CommError:` works)."""


class AuthenticationError(CommError):
    """W&B's error for a refused API key (named, as CommError)."""


class UnsupportedError(UsageError):
    """W&B's error for a feature it does not support in a mode (not raised here: named)."""


class ServerResponseError(Exception):
    """W&B's refusal of a run its service cannot open (a wandb.init of a run id already open in
    the process); as W&B's, not a wandb.Error."""


class ConfigError(Error):
    """A config key changed without allow_val_change (W&B raises its ConfigError, a wandb.Error;
    under `telemetry run --as-wandb` this is `wandb.sdk.lib.config_util.ConfigError`, so that a
    script's `except ConfigError:` catches it)."""


class Unsupported:
    """What stands for a part of W&B this drop-in does not offer: using it (calling it, or any
    attribute of it) raises, naming it. A stand-in rather than an AttributeError, so that
    `hasattr(wandb, "Artifact")` in a script stays harmless, as with the real wandb."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _refuse(self) -> NotImplementedError:
        return NotImplementedError(f"telemetry.wandb does not support {self._name}: the daemon owns the W&B run; "
                                   f"use the real wandb for it")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Unsupported(f"{self._name}.{name}")

    def __repr__(self) -> str:
        return f"<{self._name}: not supported by telemetry.wandb>"


class Metric:
    """What `define_metric` returns (W&B's wandb_metric.Metric): the definition, read back."""

    def __init__(self, name: str, step_metric: str | None = None, step_sync: bool | None = None,
                 hidden: bool | None = None, summary: str | None = None, goal: str | None = None,
                 overwrite: bool | None = None) -> None:
        self.name, self.step_metric, self.step_sync, self.hidden = name, step_metric, step_sync, hidden
        self.summary = tuple(p.strip() for p in summary.split(",")) if summary else None
        self.goal, self.overwrite = goal, overwrite

    def __repr__(self) -> str:
        return f"Metric(name={self.name!r}, step_metric={self.step_metric!r}, summary={self.summary!r})"


class PreInit:
    """`wandb.config` and `wandb.summary` before `wandb.init()`: any use raises, as in W&B."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _refuse(self, what: str) -> Error:
        return Error(f"You must call wandb.init() before wandb.{self._name}{what}")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._refuse("." + name)

    def __getitem__(self, key: str) -> Any:
        raise self._refuse(f"[{key!r}]")

    def __setitem__(self, key: str, value: Any) -> None:
        raise self._refuse(f"[{key!r}]")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_name":
            object.__setattr__(self, name, value)
        else:
            raise self._refuse("." + name)


class _Items:
    """The read side of run.config and run.summary: a mapping over `_items`."""

    _items: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str, default: Any = None) -> Any:
        return self._items.get(key, default)

    def keys(self):
        return self._items.keys()

    def items(self):
        return self._items.items()

    def values(self):
        return self._items.values()

    def as_dict(self) -> dict[str, Any]:
        return dict(self._items)


class Config(_Items):
    """`run.config`: a dict with attribute access; every change goes to the daemon's W&B run."""

    def __init__(self, on_change: Callable[[], None], guard: Callable[[], None] = lambda: None) -> None:
        """on_change: called after each change; guard: before it, raises when the run can take
        no change (finished: W&B's UsageError)."""
        object.__setattr__(self, "_items", {})
        object.__setattr__(self, "_on_change", on_change)
        object.__setattr__(self, "_guard", guard)

    def update(self, d: Any = None, allow_val_change: bool = False, **kwargs: Any) -> None:
        self._guard()
        items = self._items
        for k, v in {**config_dict(d), **kwargs}.items():
            v = plain_config_value(v)
            if k in items and items[k] != v and not allow_val_change:
                raise ConfigError(f"config key {k!r} is already {items[k]!r}; pass allow_val_change=True to change it "
                            f"to {v!r}")
            items[k] = v
        self._on_change()

    def setdefaults(self, d: Any) -> None:
        self.update({k: v for k, v in config_dict(d).items() if k not in self._items})

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __setattr__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __getattr__(self, key: str) -> Any:
        try:
            return self._items[key]
        except KeyError:
            raise AttributeError(f"run.config has no key {key!r}") from None

    def __repr__(self) -> str:
        return f"Config({self._items!r})"


class SummaryKeyError(KeyError, AttributeError):
    """A key not in `run.summary`, asked as an attribute (`run.summary.best`): W&B's summary
    raises KeyError there, so a script's `except KeyError` is caught as in W&B; an
    AttributeError too, so that hasattr() and getattr(..., default) stay harmless."""


class _AttributeKeys:
    """W&B's summary reads, sets and deletes its keys as attributes too (`run.summary.acc`,
    `run.summary.best = 0.9`, `run.summary.eval.loss`, `del run.summary.acc`), nested as well.
    Names starting with "_", and those in `_own_attrs`, are the object's own (its state), never
    keys."""

    _own_attrs: frozenset[str] = frozenset()

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self[key]
        except KeyError:
            raise SummaryKeyError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        if key.startswith("_") or key in self._own_attrs:
            object.__setattr__(self, key, value)
        else:
            self[key] = value

    def __delattr__(self, key: str) -> None:
        if key.startswith("_"):
            object.__delattr__(self, key)
        else:
            del self[key]


class Summary(_AttributeKeys, _Items):
    """`run.summary`: values set here go to the W&B run's summary (W&B also keeps the last
    logged value of each key there by itself; the daemon's run does the same). Read here, it is
    what W&B's would be: each key's last logged or set value, whichever came later (the run
    updates `_items` with each committed row: a dict update, no value read then); a one-element
    tensor is read (`.item()`) when its key is read, as W&B reads it at log. A value logged or set
    inside a nested dict is read back nested, as W&B's summary holds it (`summary["m"]` is
    `{"a": 1}` after `log({"m": {"a": 1}})`, and there is no `summary["m/a"]`): `_paths` holds
    the path of each record name that is not a flat key named as itself (a nested key, or a flat
    one named apart from a nested one: telemetry/shared/wandb_keys.py, RecordNames), filled by
    the run as it flattens."""

    def _view(self) -> dict[str, Any]:
        """The summary as W&B's reads: flat keys as they are, nested ones under their path; a
        logged key whose define_metric has a summary reads as W&B's ({"max": ...}, see note).
        Once the run is finished, nothing, with W&B's warning: W&B's summary is read from its
        service, which a finished run no longer has."""
        if self._finished():
            if os.environ.get("WANDB_SILENT", "").lower() not in ("1", "true", "yes"):
                print("wandb: WARNING Summary data not available in finished run", file=sys.stderr, flush=True)
            return {}
        paths, items = self._paths, self._items
        if self._ops:
            items = self._summarized(items)
        return nest(items, paths) if paths else items

    def __getitem__(self, key: str) -> Any:
        v = self._view()[key]
        # A nested value is a view of it, as W&B's SummarySubDict: an edit through it
        # (`summary["m"]["a"] = 2`) is an edit of the summary, never of a copy.
        return SummarySubDict(self, (key,)) if v.__class__ is dict else _scalar(v)

    def __contains__(self, key: object) -> bool:
        return key in self._view()

    def __delitem__(self, key: str) -> None:
        """As W&B's: the key goes from the summary (a key not there is no error); a later log
        of it puts it back."""
        self._remove((key,))

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._view()))

    def __len__(self) -> int:
        return len(self._view())

    def get(self, key: str, default: Any = None) -> Any:
        view = self._view()
        return _read(view[key]) if key in view else default

    def keys(self):
        return list(self._view())

    def items(self):
        return [(k, _read(v)) for k, v in self._view().items()]

    def values(self):
        return [_read(v) for v in self._view().values()]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.items())

    def __init__(self, on_set: Callable[[dict[str, Any], list[list[str]]], None],
                 flatten_with_paths: Callable[[Mapping[str, Any]], dict[str, Any]],
                 on_remove: Callable[[list[tuple[str, ...]]], None] = lambda paths: None,
                 guard: Callable[[], None] = lambda: None, finished: Callable[[], bool] = lambda: False) -> None:
        """guard: called before each change, raises when the run can take none (finished: W&B's
        UsageError); finished: whether the run is, for reads (see _view)."""
        self._guard = guard
        self._finished = finished
        self._items: dict[str, Any] = {}
        self._paths: dict[str, tuple[str, ...]] = {}
        self._named: dict[tuple[str, ...], str] = {}        # _paths the other way
        self._under: dict[tuple[str, ...], list[str]] = {}  # the names of _paths under each path
        self._on_set = on_set
        self._on_remove = on_remove
        self._flatten = flatten_with_paths
        self._ops: list[tuple[str, frozenset[str]]] = []    # (name or glob, ops) of define_metric(summary=)
        self._key_ops: dict[str, frozenset[str]] = {}       # each key's ops, once looked up
        self._agg: dict[str, _Aggregate] = {}
        self._set: set[str] = set()                         # keys set here: W&B reads them as set

    def define(self, name: str, summary: str) -> None:
        """define_metric(name, summary="min,last"): how W&B's summary reads the key(s) `name`
        (a glob with "*") names, from now on."""
        self._ops.append((name, frozenset(p.strip().lower() for p in summary.split(",") if p.strip())))
        self._key_ops.clear()

    def _ops_of(self, key: str) -> frozenset[str]:
        """The define_metric summary of the key with record name `key`, matched as W&B matches
        it: by the key's metric name ("m.x" for the nested m -> x, "m/x" for the flat "m/x")."""
        ops = self._key_ops.get(key)
        if ops is None:
            name = metric_name(self._paths.get(key, (key,)))
            exact = [o for n, o in self._ops if n == name]
            ops = exact[-1] if exact else next((o for n, o in self._ops if "*" in n and fnmatchcase(name, n)),
                                               frozenset())
            self._key_ops[key] = ops
        return ops

    def note(self, values: Mapping[str, Any]) -> None:
        """A committed row's values (the run calls this while a define_metric has a summary):
        folded into the aggregates of the keys whose summary asks for one. A tensor is kept, and
        read when the summary is (never on the training thread at log), at most
        MAX_HELD_TENSORS per key; past that, its value is left out of min/max/mean and counted
        in `num_not_aggregated`, with one warning."""
        for k, v in values.items():
            if not (self._ops_of(k) & _AGG_OPS):
                continue
            agg = self._agg.get(k)
            if agg is None:
                agg = self._agg[k] = _Aggregate()
            agg.add(k, v, self)

    num_not_aggregated = 0
    _own_attrs = frozenset({"num_not_aggregated"})

    def _summarized(self, items: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items.items():
            ops = self._ops_of(k) if k not in self._set else frozenset()
            if not ops or ops == {"copy"}:
                out[k] = v
            elif "none" in ops:
                continue
            else:
                agg = self._agg.get(k)
                if agg is None and "last" not in ops:
                    # Nothing logged since its define_metric: the value as it is (W&B's reads
                    # its aggregate over the earlier rows too, which are not kept here).
                    out[k] = v
                    continue
                got = agg.read(ops) if agg is not None else {}
                if "last" in ops:
                    got["last"] = _scalar(v)
                if got:
                    out[k] = got
        return out

    def take(self, values: Mapping[str, Any]) -> None:
        """A committed row's values (record names), as W&B's summary takes them: each replaces
        what was at its path, the keys under it and a value above it (`{"a": 1}` then
        `{"a": {"b": 2}}` reads {"b": 2}, and back); a None removes its key, as W&B's summary
        holds no null (the W&B run's summary takes it as W&B's does). The summary holds no key
        above or under another, so only a key new to it needs looking for those."""
        items = self._items
        new = values.keys() - items.keys()
        if new and items:
            self._clear_for(new)
        items.update(values)
        for k in [k for k, v in values.items() if v is None]:
            self._discard(k)

    def _clear_for(self, names: set[str]) -> None:
        """Remove the keys whose path is above or under the path of one of `names`, found by
        their paths (_named, _under), so a key new at every step costs the keys at its path."""
        paths, items, named = self._paths, self._items, self._named
        for name in names:
            p = paths.get(name, (name,))
            for i in range(1, len(p)):                  # above: a value where a dict now goes
                above = p[:i]
                k = named.get(above, above[0] if i == 1 else None)
                if k is not None and k in items and paths.get(k, (k,)) == above:
                    self._discard(k)
            for k in self._under.get(p, ()):           # under: what the value replaces
                if k in items:
                    self._discard(k)

    def add_paths(self, new: Mapping[str, tuple[str, ...]]) -> None:
        """The paths of record names the run made (RecordNames.paths): nested keys, and flat
        ones named apart (a flat key named as itself has none: its path is (name,))."""
        self._paths.update(new)
        for k, p in new.items():
            self._named[p] = k
            for i in range(1, len(p)):
                self._under.setdefault(p[:i], []).append(k)

    def _discard(self, k: str) -> None:
        del self._items[k]
        self._set.discard(k)
        self._agg.pop(k, None)

    def update(self, d: Mapping[str, Any]) -> None:
        """As W&B's: each key given is set whole (a dict replaces what was under that key); one
        dict, as W&B's takes (keywords raise TypeError there too)."""
        self._put(dict(d.items()), whole=True)

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def _set_path(self, path: tuple[str, ...], value: Any) -> None:
        """summary[path[0]][path[1]]... = value, through a SummarySubDict: the value replaces
        what was at `path`; the rest under path[0] stays."""
        for part in reversed(path[1:]):
            value = {part: value}
        self._put({path[0]: value}, whole=False, at=path)

    def _put(self, data: dict[str, Any], whole: bool, at: tuple[str, ...] = ()) -> None:
        """Set `data`: with `whole`, each of its keys replaces what was under it; else what was
        at the path `at` is replaced (an edit through a nested value)."""
        self._guard()
        replaced = [(k,) for k in data] if whole else [at]
        for path in replaced:
            self._drop_under(path)
        values = self._flatten(data)
        self._items.update(values)
        self._set.update(values)
        for k in [k for k in data if data[k] is None and k in values]:
            # As W&B's summary reads: a key set to None is no key (its run's summary: null); a
            # None inside a dict set is kept, as W&B keeps the dict.
            self._discard(k)
        self._on_set(values, [list(p) for p in replaced])

    def _drop_under(self, path: tuple[str, ...]) -> None:
        n = len(path)
        for k in [k for k in self._items if self._paths.get(k, (k,))[:n] == path]:
            self._discard(k)

    def _remove(self, path: tuple[str, ...]) -> None:
        """The value at `path` (a key, or a key inside nested ones) and all under it go, here
        and from the daemon's run."""
        self._guard()
        self._drop_under(path)
        self._on_remove([path])

    def __repr__(self) -> str:
        return f"Summary({self._view()!r})"


class SummarySubDict(_AttributeKeys, MutableMapping):
    """A nested value of `run.summary` (W&B's SummarySubDict): read, it is the summary's value
    at its path as it is now; set or deleted, the summary is."""

    def __init__(self, summary: Summary, path: tuple[str, ...]) -> None:
        self._summary, self._path = summary, path

    def _node(self) -> dict[str, Any]:
        node: Any = self._summary._view()
        for part in self._path:
            node = node[part]
        if node.__class__ is not dict:
            raise KeyError(self._path[-1])
        return node

    def __getitem__(self, key: str) -> Any:
        v = self._node()[key]
        return SummarySubDict(self._summary, (*self._path, key)) if v.__class__ is dict else _scalar(v)

    def __setitem__(self, key: str, value: Any) -> None:
        self._summary._set_path((*self._path, key), value)

    def __delitem__(self, key: str) -> None:
        self._summary._remove((*self._path, key))

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._node()))

    def __len__(self) -> int:
        return len(self._node())

    def __repr__(self) -> str:
        return repr(_read(self._node()))


# The define_metric summaries that need every logged value, not only the last.
_AGG_OPS = frozenset({"min", "max", "mean", "first"})
# Tensors of one key held for its summary until it is read (0-dim: a few hundred bytes each).
MAX_HELD_TENSORS = 10_000


class _Aggregate:
    """min, max, mean and first of one key's logged numbers (tensors held until read)."""

    __slots__ = ("n", "total", "lo", "hi", "first", "held")

    def __init__(self) -> None:
        self.n, self.total, self.lo, self.hi, self.first = 0, 0.0, None, None, None
        self.held: list = []

    def add(self, key: str, v: Any, summary: "Summary") -> None:
        c = v.__class__
        if c is float or c is int:
            self._fold(v)
        elif hasattr(v, "detach"):
            if len(self.held) < MAX_HELD_TENSORS:
                self.held.append(v)
            else:
                summary.num_not_aggregated += 1
                if summary.num_not_aggregated == 1:
                    import warnings

                    warnings.warn(f"telemetry.wandb: run.summary[{key!r}] (define_metric summary) holds at most "
                                  f"{MAX_HELD_TENSORS} tensors until it is read; later ones are left out of it "
                                  f"(counted in run.summary.num_not_aggregated; the W&B run's summary has them)",
                                  RuntimeWarning, stacklevel=5)
        elif c is not bool and c is not str:
            try:
                self._fold(float(v))
            except (TypeError, ValueError):
                pass

    def _fold(self, x: float) -> None:
        if self.n == 0:
            self.first = self.lo = self.hi = x
        elif x != x:
            # NaN: W&B's min and max are NaN from then on (min() here would pass it over; once
            # lo and hi are NaN, min() and max() keep them so).
            self.lo = self.hi = x
        else:
            self.lo, self.hi = min(self.lo, x), max(self.hi, x)
        self.n += 1
        self.total += x

    def read(self, ops: frozenset[str]) -> dict[str, Any]:
        held, self.held = self.held, []
        for t in held:
            x = _scalar(t)
            if x.__class__ is float or x.__class__ is int:
                self._fold(x)
        if self.n == 0:
            return {}
        got = {"min": self.lo, "max": self.hi, "mean": self.total / self.n, "first": self.first}
        return {op: got[op] for op in ops if op in got}


def _read(v: Any) -> Any:
    """A summary value as read: a nested dict's values each as _scalar gives them."""
    if v.__class__ is dict:
        return {k: _read(x) for k, x in v.items()}
    return _scalar(v)


# W&B reads its summary back as its service writes it in JSON (Go's shortest "%g"): a float of
# a whole value below this in magnitude has no exponent and no fraction there, and reads back as
# an int (6.0 as 6, 999999.0 as 999999); from it on it is written with an exponent (1e+06) and
# stays a float.
WHOLE_FLOAT_READS_AS_INT_BELOW = 1e6


def _scalar(v: Any) -> Any:
    """A summary value as W&B's reads back: a one-element tensor or a numpy scalar as its
    Python number; a list or tuple as a list of such values; an array or a tensor of more
    elements as a list (read here, when the summary is, never at log); a float of a whole value
    below WHOLE_FLOAT_READS_AS_INT_BELOW as that int, as W&B's; others as they are."""
    c = v.__class__
    if c is int or c is str or c is bool:
        return v
    if c is float:
        return int(v) if v.is_integer() and -WHOLE_FLOAT_READS_AS_INT_BELOW < v < WHOLE_FLOAT_READS_AS_INT_BELOW else v
    if c is list or c is tuple:
        return [_scalar(x) for x in v]
    try:
        if hasattr(v, "detach"):
            return _scalar(v.item() if v.numel() == 1 else v.detach().cpu().tolist())
        if hasattr(v, "dtype") and hasattr(v, "tolist") and type(v).__module__.partition(".")[0] == "numpy":
            return _scalar(v.tolist())   # a numpy scalar as its number, an array as a list
    except Exception:
        pass
    return v


# The ints the wire (msgpack) carries; W&B's config reads one beyond them back as a float.
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1


def plain_config_value(v: Any) -> Any:
    """A config value as W&B's config keeps it (and the script reads it back), by W&B's rules
    for a config value: a tensor or a numpy value as its number or (up to 32 elements) its list,
    bytes decoded, a date as its ISO text, an Enum by its name, a set, tuple or other sequence as
    a list, a dataclass as its dict, a slice as W&B's dict of it, a function by its qualified
    name, NaN as None, an int beyond 64 bits as a float, inside dicts and lists too; any other
    object as its str. A value left as it was made the run's hello unsendable (an int beyond 64
    bits, bytes, an Enum): the run then lost its config, name and project."""
    c = v.__class__
    if v is None or c is str or c is bool:
        return v
    if c is int:
        return v if _INT_MIN <= v <= _INT_MAX else float(v)
    if c is float:
        return None if v != v else v
    if isinstance(v, dict):
        return {k: plain_config_value(x) for k, x in v.items()}
    if c is slice:
        return {"slice_start": v.start, "slice_step": v.step, "slice_stop": v.stop}
    top = type(v).__module__.partition(".")[0]
    if top == "torch" and hasattr(v, "detach"):
        v = v.detach().cpu()             # at config time, never on a training step
        if v.dim() == 0:
            return plain_config_value(v.item())
        v = v.numpy()
        top = "numpy"
    if top == "numpy" and hasattr(v, "tolist"):
        size = getattr(v, "size", 1)
        if getattr(v, "shape", ()) == ():
            x = v.item()
            if type(x).__module__.partition(".")[0] == "numpy":   # a long double: item() keeps it
                import numpy as np

                return str(x) if np.iscomplexobj(x) else plain_config_value(float(x))
            return plain_config_value(x)
        if size == 1:
            return str(v.reshape(-1)[0])     # W&B's: the element, kept as its text
        return plain_config_value(v.tolist()) if size <= 32 else str(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    if isinstance(v, enum.Enum):
        return v.name
    if callable(v):
        mod, name = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
        return f"{mod}.{name}" if mod is not None and name is not None else str(v)
    if isinstance(v, (set, frozenset, Sequence)) and not isinstance(v, str):
        return [plain_config_value(x) for x in v]
    if dataclasses.is_dataclass(v):
        return plain_config_value(dataclasses.asdict(v))
    if isinstance(v, float):             # a float subclass
        return plain_config_value(float(v))
    if isinstance(v, int):               # an int subclass (not an Enum: above)
        return plain_config_value(int(v))
    return str(v)                        # a str subclass as its text; any other object too


CONFIG_DEFAULTS_FILE = "config-defaults.yaml"


def config_from_file(path: str, must_exist: bool = False) -> dict[str, Any]:
    """The config a W&B config file holds, as W&B's init reads it (its `config-defaults.yaml` in
    the working directory, the files of `config_paths`): each top-level key's "value", beside
    "wandb_version: 1"; {} for a missing file (unless must_exist) or an empty one (said, as W&B
    says it). A file W&B refuses raises what W&B raises (ConfigError, or the KeyError or TypeError
    of a key without a "value")."""
    if not os.path.exists(path):
        if must_exist:
            raise ConfigError(f"config file {path} doesn't exist")
        return {}
    import yaml                          # W&B's own dependency; imported only when a file is there

    try:
        with open(path) as f:
            loaded = yaml.safe_load(f)
    except OSError:
        raise ConfigError(f"Couldn't read config file: {path}") from None
    except yaml.YAMLError:
        raise ConfigError("Invalid YAML in config yaml") from None
    if loaded is None:
        if os.environ.get("WANDB_SILENT", "").lower() not in ("1", "true", "yes"):
            print(f"wandb: WARNING Found an empty default config file ({CONFIG_DEFAULTS_FILE}). Proceeding with no "
                  f"defaults.", file=sys.stderr, flush=True)
        return {}
    version = loaded.pop("wandb_version", None)
    if version is not None and version != 1:
        raise ConfigError("Unknown config version")
    return {k: v["value"] for k, v in loaded.items()}


# Modules W&B's config takes as their flags (wandb_helper._to_dict): their FLAGS.
_FLAGS_MODULES = ("absl.flags", "tensorflow.python.platform.flags")


def config_dict(d: Any) -> dict[str, Any]:
    """A config as W&B takes it (None, a mapping, a Config, an argparse.Namespace, absl's
    `flags.FLAGS` or the `flags` module, or a str: the path of a YAML config file in W&B's format,
    which must exist) as a dict."""
    if d is None:
        return {}
    if isinstance(d, str):
        return config_from_file(d, must_exist=True)
    if isinstance(d, Mapping):
        return dict(d)
    if isinstance(d, Config):
        return d.as_dict()
    if isinstance(d, types.ModuleType) and d.__name__ in _FLAGS_MODULES:
        d = d.FLAGS
    if type(d).__module__ == "absl.flags._flagvalues":
        # absl's FlagValues keeps its flags out of __dict__: each flag's value, as W&B reads them.
        return {name: d[name].value for name in dir(d)}
    if hasattr(d, "__dict__"):   # argparse.Namespace and the like, as W&B takes them
        return {k: v for k, v in vars(d).items() if not k.startswith("_")}
    raise TypeError(f"config must be a dict or an argparse.Namespace, got {type(d).__name__}")
