"""telemetry.wandb: one value that cannot be sent costs that value, not its row (the loss beside
it still lands), and a row of any width is logged without Python work per key on the caller's
thread. Against a bare PULL socket, as tests/test_client.py."""
from __future__ import annotations

import warnings

import pytest

from protocol import Bye, Metrics
from protocol.constants import MAX_NAME_CHARS
from test_client import Receiver


@pytest.fixture
def rx():
    r = Receiver()
    yield r
    r.close()


def _rows(rx) -> dict[int, dict]:
    rows: dict[int, dict] = {}
    for r in rx.recv_until(lambda r: isinstance(r, Bye)) + rx.drain(1000):
        if isinstance(r, Metrics):
            rows.setdefault(r.step, {}).update({k: v for k, v in r.values.items() if k != "telemetry/client_s"})
    return rows


def _run(rx, monkeypatch):
    from telemetry import TelemetryClient
    from telemetry.integrations.wandb_run import Run

    monkeypatch.setenv("WANDB_CONSOLE", "off")
    tm = TelemetryClient(rx.endpoint, rank=0)
    return Run(project="p", client=tm), tm


@pytest.mark.parametrize("bad", ["meta", "complex", "quantized", "long key"])
def test_a_bad_value_costs_that_value_not_the_loss_beside_it(rx, monkeypatch, bad):
    torch = pytest.importorskip("torch")
    run, tm = _run(rx, monkeypatch)
    key = "k" * (MAX_NAME_CHARS + 1) if bad == "long key" else "bad"
    make = {"meta": lambda: torch.tensor(1.0, device="meta"), "complex": lambda: torch.tensor(1 + 2j),
            "quantized": lambda: torch.quantize_per_tensor(torch.tensor(1.0), 0.1, 0, torch.quint8),
            "long key": lambda: 1.0}[bad]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            run.log({"loss": torch.tensor(2.0 + i), "lr": 0.1, key: make()})
        run.finish()
    assert sum("not" in str(w.message) and key[:80] in str(w.message) for w in caught) == 1, \
        [str(w.message) for w in caught]
    tm.close(timeout_s=10.0)
    assert _rows(rx) == {i: {"loss": 2.0 + i, "lr": 0.1} for i in range(3)}
    counted = tm.stats()["skipped_values"] + sum(run.num_refused.values())
    assert counted == 3 and tm.stats()["dropped"] == 0


def test_a_row_of_many_keys_lands_whole_at_its_step(rx, monkeypatch):
    run, tm = _run(rx, monkeypatch)
    row = {f"param/{i}/norm": float(i) for i in range(20_000)}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        run.log({"loss": 1.0})
        run.log(row)
        run.log({"loss": 0.5})
        run.finish()
    tm.close(timeout_s=10.0)
    assert _rows(rx) == {0: {"loss": 1.0}, 1: row, 2: {"loss": 0.5}}
    assert tm.stats()["dropped"] == 0
