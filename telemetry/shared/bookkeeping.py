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


SUMMARY_REMOVE_EVENT = "wandb/summary_remove"   # {"step": s, "paths": [[key, ...], ...]}: del run.summary[...]
MAX_SUMMARY_PATHS = 1024      # paths taken from one summary event


def summary_paths(value: object) -> list[tuple[str, ...]]:
    """The paths of a summary event's list ([[key, ...], ...]): each a non-empty list of str
    (anything else left out), at most MAX_SUMMARY_PATHS."""
    if not isinstance(value, list):
        return []
    return [tuple(p) for p in value[:MAX_SUMMARY_PATHS]
            if isinstance(p, list) and p and all(isinstance(x, str) for x in p)]


def drop_summary_paths(summary: dict, data: object) -> None:
    """A `del run.summary[...]` event (SUMMARY_REMOVE_EVENT), on a consumer's summary of flat
    keys ("a/b"): each path's key, and those under it, leave it."""
    for path in summary_paths(data.get("paths") if isinstance(data, dict) else None):
        key = "/".join(path)
        for k in [k for k in summary if k == key or k.startswith(key + "/")]:
            del summary[k]


# An event's severity as the exporters label it (OTLP's telemetry.events, Prometheus's
# telemetry_events_total): one of these; anything else an event's data says is "other", so that a
# free-text severity cannot grow a label's values without bound.
SEVERITIES = ("debug", "info", "warning", "error", "critical")


def severity(data: object) -> str:
    """The severity label of an event with this data ("info" when it says none)."""
    given = data.get("severity") if isinstance(data, dict) else None
    if given is None:
        return "info"
    given = given.lower() if isinstance(given, str) else given
    return given if given in SEVERITIES else "other"
