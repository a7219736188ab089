"""Test helpers over the aggregator's one API (add_many, finish_batch): one record at a time and
the records of closed steps alone, as the tests want them; the daemon takes batches."""
from __future__ import annotations

from typing import NamedTuple


class Row(NamedTuple):
    rank: int
    step: int
    t_ns: int
    values: dict
    parts: int = 1


def add(agg, rank: int, step: int, t_ns: int, values: dict, parts: int = 1):
    """One rank's metrics: the steps this completes (oldest first), or None if the record is
    late (its step went out without this rank)."""
    done, late = agg.add_many([Row(rank, step, t_ns, values, parts)])
    return None if late else done


def finish_many(agg, accs, only: tuple[str, ...] | None = None) -> list[dict]:
    """The aggregated records of closed steps, in the order given, with the derived metrics the
    daemon adds (derived.py: the straggler views, throughput; no MFU without a model's hello),
    or only the derivations named in `only`."""
    from telemetry.daemon.config import MfuConfig
    from telemetry.daemon.derived import DERIVATIONS, Derived

    batch, recs = agg.finish_batch(accs)
    chosen = DERIVATIONS if only is None else tuple(d for d in DERIVATIONS if d.name in only)
    failed = Derived(MfuConfig(), chosen).apply(batch, [r["values"] for r in recs], agg.world.size())
    assert not failed, failed
    return recs


def finish(agg, acc) -> dict:
    return finish_many(agg, [acc])[0]
