"""The drop-in's bookkeeping events (wandb/console, wandb/values, ...) stay in the JSONL but out of
what people read: tail, the dashboard's and the report's event lists, the closing summary's
count, Prometheus's events_total. Before, a script that printed once a second filled them with
`wandb/console`."""
from __future__ import annotations

import json

from telemetry.shared.bookkeeping import BOOKKEEPING_EVENTS

NEWS = {"kind": "event", "t": 2.0, "rank": 0, "name": "checkpoint_saved", "data": {"step": 5, "path": "/x"}}


def _records() -> list[dict]:
    book = [{"kind": "event", "t": 1.0 + i / 10, "rank": 0, "name": n, "data": {"step": 1, "text": "x\n"}}
            for i, n in enumerate(sorted(BOOKKEEPING_EVENTS))]
    refused = {"kind": "event", "t": 3.0, "rank": 0, "name": "wandb/refused", "data": {"type": "list", "key": "k"}}
    return [{"kind": "metrics", "t": 0.5, "step": 1, "values": {"loss": 1.0}}, *book, NEWS, refused]


def test_bookkeeping_events_stay_out_of_every_event_list(tmp_path):
    from telemetry.consumers.dashboard.store import RunStore
    from telemetry.consumers.prometheus import LatestValues
    from telemetry.consumers.report import collect
    from telemetry.consumers.summary import summarize
    from telemetry.consumers.tail import TailState

    recs = _records()
    names = {"checkpoint_saved", "wandb/refused"}           # news, including a value the drop-in refused

    state = TailState()
    for r in recs:
        state.consume(r["kind"], r)
    assert state.num_events == 2

    assert {e["name"] for e in collect(iter(recs)).events} == names

    store = RunStore("r", "r", None)
    shown = [e for r in recs for e in store.consume(r)[1]]
    assert len(shown) == 2, shown

    latest = LatestValues()
    for r in recs:
        latest.consume(r["kind"], r)
    assert {name for name, _ in latest.snapshot()[1]} == names

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert summarize(tmp_path)["num_events"] == 2
