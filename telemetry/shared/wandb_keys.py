"""W&B's nested keys: a value logged as {"a": {"b": v}} travels flat ("a/b") with its path kept
beside it, and is nested again where W&B's view of it is made: the drop-in's run.summary
(integrations/wandb_objects.py), the daemon's W&B sink (daemon/sinks/wandb_sink.py) and a replay
into W&B (consumers/replay.py)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

# The event a drop-in rank sends with the paths of its keys ({"paths": {record name: [part, ...]}})
# before the first value that uses them.
NESTED_EVENT = "wandb/nested"
# A W&B script's value the drop-in did not log: {"type": why, "count": how many so far}, sent at
# the first of each why and, with the total, at the run's end (the run's summary says them).
REFUSED_EVENT = "wandb/refused"
# The deepest path a flattened key is nested again to (a user's dict of dicts is a few levels):
# W&B walks a row's nested values recursively.
MAX_NESTED_DEPTH = 32


def usable_path(p: Any) -> bool:
    """A path from a nested event that may nest its key: a list of strings, not too deep."""
    return isinstance(p, list) and 0 < len(p) <= MAX_NESTED_DEPTH and all(isinstance(x, str) for x in p)


def nest(values: Mapping[str, Any], paths: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """`values` with each key that has a path in `paths` put under it ({"a/b": v} with path
    ("a", "b") -> {"a": {"b": v}}); the others as they are. A path through a key that holds a
    value replaces that value with a dict, as W&B does."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        path = paths.get(k)
        if path is None:
            out[k] = v
            continue
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child.__class__ is not dict:
                child = node[part] = {}
            node = child
        node[path[-1]] = v
    return out


def metric_name(path: Sequence[str]) -> str:
    """The name W&B's define_metric gives the key at `path`: its parts joined by ".", a "." inside
    a part escaped ("a.b" is the nested a -> b, "a\\.b" the flat key "a.b")."""
    return ".".join(p.replace(".", "\\.") for p in path)


class RecordNames:
    """The one flat name each W&B key of a run has in the records (metrics.jsonl, the daemon's
    sinks). W&B keeps a key by its path: a flat "a/b" is the path ("a/b",), a nested
    {"a": {"b": v}} the path ("a", "b"), two keys side by side. A flat key is named as it is and a
    nested path by its parts joined by "/", unless a key of another path has that name already
    (the first of the two logged keeps it): then the name gets "#2" ("#3", ...) appended, so no
    two keys W&B keeps apart share a name, and no value of a row is lost to another's.

    `paths` holds the path of every name that is not a flat key named as itself (nested ones,
    and flat ones renamed), in the order they were named: what nests them again (nest(), the
    drop-in's run.summary, the daemon's W&B sink, told by a "wandb/nested" event)."""

    def __init__(self) -> None:
        self.paths: dict[str, tuple[str, ...]] = {}
        self.flat: set[str] = set()         # flat keys named as themselves
        self._by_path: dict[tuple[str, ...], str] = {}

    def name(self, path: tuple[str, ...]) -> str:
        """The record name of the key at `path` (a tuple of one part: a flat key)."""
        if len(path) == 1 and path[0] not in self.paths:
            self.flat.add(path[0])
            return path[0]
        got = self._by_path.get(path)
        if got is not None:
            return got
        name = base = "/".join(path)
        n = 1
        while name in self.flat or name in self.paths:
            n += 1
            name = f"{base}#{n}"
        self.paths[name] = path
        self._by_path[path] = name
        return name
