"""W&B's nested keys: a value logged as {"a": {"b": v}} travels flat ("a/b") with its path kept
beside it, and is nested again where W&B's view of it is made: the drop-in's run.summary
(integrations/wandb_objects.py) and the daemon's W&B sink (daemon/sinks/wandb_sink.py)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence


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
