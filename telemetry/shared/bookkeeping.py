"""Events that carry data between a rank and a sink, not news for a person: the W&B drop-in's
nested-key paths, summary values, media files, text values and console output (the daemon's
W&B sink consumes them; telemetry/integrations/wandb_run.py sends them), and the ranks' byes a
node daemon forwards to its head (`rank_bye`, for the head's goodput ledger) and a node's end as a
group head forwards it (`node_bye`). They stay in the JSONL
(the record of everything) but out of what people read: tail, the dashboard's and the report's
event lists, the closing summary's count, Prometheus's events_total. `wandb/refused` (a value the
drop-in could not log) is news and stays.
"""
from __future__ import annotations

BOOKKEEPING_EVENTS = frozenset({"wandb/nested", "wandb/summary", "wandb/summary_at", "wandb/summary_remove",
                                "wandb/media", "wandb/values", "wandb/console", "rank_bye", "node_bye"})


def is_bookkeeping(name: object) -> bool:
    """Whether an event of this name is bookkeeping (see the module docstring)."""
    return name in BOOKKEEPING_EVENTS


def drop_summary_paths(summary: dict, data: object) -> None:
    """A `del run.summary[...]` event ("wandb/summary_remove": {"paths": [[key, ...], ...]}), on a
    consumer's summary of flat keys ("a/b"): each path's key, and those under it, leave it."""
    paths = data.get("paths") if isinstance(data, dict) else None
    for path in paths if isinstance(paths, list) else []:
        if isinstance(path, list) and path and all(isinstance(p, str) for p in path):
            key = "/".join(path)
            for k in [k for k in summary if k == key or k.startswith(key + "/")]:
                del summary[k]
