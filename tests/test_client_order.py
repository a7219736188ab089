"""A client's records reach the daemon in the order of its calls, whatever mixes them: a record
with tensor values (read on the sender thread once its device is done), a record of floats, an
event, a hello. The daemon's W&B sink takes a row whose step is below one it already took as a
step going backwards and drops it: a tensor row overtaken by the float row logged after it was
lost."""
from __future__ import annotations

import pytest

from protocol import Bye, Event, Hello, Metrics
from test_client import Receiver


@pytest.fixture
def rx():
    r = Receiver()
    yield r
    r.close()


def test_tensor_rows_float_rows_and_events_arrive_in_call_order(rx):
    torch = pytest.importorskip("torch")
    from telemetry import TelemetryClient

    tm = TelemetryClient(rx.endpoint, rank=0)
    num_steps = 200
    for i in range(num_steps):
        tm.log(2 * i, {"loss": torch.tensor(float(i))})      # the deferred path
        tm.log(2 * i + 1, {"val/loss": float(i)})             # would go out at once
        if i % 50 == 0:
            tm.event("eval_done", {"step": 2 * i + 1})
            tm.hello({"config": {"i": i}})
    tm.close(timeout_s=10.0)
    # The bye goes on a connection of its own (TelemetryClient.close): it may come first.
    records = [r for r in rx.recv_until(lambda r: isinstance(r, Bye)) + rx.drain(1000) if not isinstance(r, Bye)]
    seqs = [r.seq for r in records]
    assert seqs == sorted(seqs), "records arrived out of the order of the calls"
    metrics = [r for r in records if isinstance(r, Metrics)]
    assert [m.step for m in metrics] == list(range(2 * num_steps))
    assert all(m.values == ({"loss": float(m.step // 2)} if m.step % 2 == 0 else {"val/loss": float(m.step // 2)})
               for m in metrics)
    assert sum(isinstance(r, Event) for r in records) == 4 and sum(isinstance(r, Hello) for r in records) == 5
    assert tm.stats()["dropped"] == 0 and tm.stats()["pending"] == 0
