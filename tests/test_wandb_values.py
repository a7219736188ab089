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


def test_a_flat_key_a_nested_one_named_first_keeps_its_rows_on_every_path(rx, monkeypatch):
    """W&B keeps a flat "a/b" and a nested a -> b as two keys: once a nested one has the record
    name "a/b", the flat key is named apart on the fast path (plain floats) and in a row too wide
    to be checked key by key, as on the general path; no row loses a value to the other key, and
    the daemon is told each name's path before the rows that use it."""
    from protocol import Event

    run, tm = _run(rx, monkeypatch)
    wide = {f"w{i}": 0.0 for i in range(20_000)}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        run.log({"a": {"b": 1.0}, "c/d": 2.0})       # nested first: it is "a/b"
        run.log({"a/b": 3.0, "c/d": 4.0})            # the fast path's row (plain floats)
        run.log({"a/b": 5.0, "c/d": 6.0})
        run.log({**wide, "a/b": 7.0})                # the wide row
        run.log({"c": {"d": 8.0}})                   # nested after the flat "c/d"
        # Read before finish: W&B's summary of a finished run reads as empty.
        assert run.summary["a"] == {"b": 1.0} and run.summary["a/b"] == 7.0 and run.summary["c"]["d"] == 8.0
        run.finish()
    tm.close(timeout_s=10.0)
    records = rx.recv_until(lambda r: isinstance(r, Bye)) + rx.drain(1000)
    paths = {}
    for r in records:
        if isinstance(r, Event) and r.name == "wandb/nested":
            paths.update(r.data["paths"])
        elif isinstance(r, Metrics):
            assert set(r.values) - {"telemetry/client_s"} <= set(paths) | {"c/d"} | set(wide), (r.values, paths)
    assert paths == {"a/b": ["a", "b"], "a/b#2": ["a/b"], "c/d#2": ["c", "d"]}
    rows = {}
    for r in records:
        if isinstance(r, Metrics):
            rows.setdefault(r.step, {}).update({k: v for k, v in r.values.items() if k != "telemetry/client_s"})
    assert rows == {0: {"a/b": 1.0, "c/d": 2.0}, 1: {"a/b#2": 3.0, "c/d": 4.0}, 2: {"a/b#2": 5.0, "c/d": 6.0},
                    3: {**wide, "a/b#2": 7.0}, 4: {"c/d#2": 8.0}}


def test_a_row_of_plain_numbers_takes_no_python_work_per_value(rx, monkeypatch):
    """The common row (str keys, float/int values, no step or commit) goes to the client without
    flatten() or refusal() per value, and keeps W&B's rules: rows mixed with a pending
    (commit=False) row, a step given, text and nested values land as the general path puts them,
    a dict reused and changed after its log is sent as it was at the call, and run.summary holds
    the last values."""
    from telemetry.integrations import wandb_run

    run, tm = _run(rx, monkeypatch)
    seen = {"flatten": 0, "refusal": 0}

    def counting(name, real):
        def f(*a, **k):
            seen[name] += 1
            return real(*a, **k)
        return f

    monkeypatch.setattr(wandb_run, "flatten", counting("flatten", wandb_run.flatten))
    monkeypatch.setattr(wandb_run, "refusal", counting("refusal", wandb_run.refusal))
    row = {f"train/m{i}": float(i) for i in range(10)}
    for _ in range(3):
        run.log(row)
        row["train/m0"] += 1.0          # a loop that reuses its dict
    assert seen == {"flatten": 0, "refusal": 0}
    run.log({"eval/acc": 0.5}, commit=False)   # pending: the next plain row joins it
    run.log({"loss": 2})
    run.log({"loss": 3}, step=7)              # a step given: W&B's rule (not committed yet)
    run.log({"loss": 4})                      # merges into step 7's row and commits it
    run.log({"loss": 5, "b": {"c": 1.0}})     # nested: the general path
    run.log({"loss": 6, "flag": True})        # a bool is no plain number here: the general path
    run.log({"loss": 7})
    assert run.step == 11
    assert run.summary["loss"] == 7 and run.summary["train/m0"] == 2.0 and run.summary["eval/acc"] == 0.5
    run.finish()
    tm.close(timeout_s=10.0)
    expected = {i: {**{f"train/m{j}": float(j) for j in range(10)}, "train/m0": float(i)} for i in range(3)}
    expected.update({3: {"eval/acc": 0.5, "loss": 2}, 7: {"loss": 4}, 8: {"loss": 5, "b/c": 1.0},
                     9: {"loss": 6, "flag": 1}, 10: {"loss": 7}})
    assert _rows(rx) == expected
