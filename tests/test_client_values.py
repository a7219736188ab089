"""One value that cannot be sent costs that value, not its row: it is left out, named once in a
warning and counted (stats()["skipped_values"]); a row wider than a record takes is sent as
several records of its step, each within the protocol's bounds, and what arrives decodes."""
from __future__ import annotations

import warnings

import pytest

from protocol import Bye, Hello, Metrics
from protocol.constants import MAX_FRAME_BYTES, MAX_NAME_CHARS, MAX_VALUES
from test_client import Receiver


@pytest.fixture
def rx():
    r = Receiver()
    yield r
    r.close()


def _metrics_until_bye(rx) -> list[Metrics]:
    return [r for r in rx.recv_until(lambda r: isinstance(r, Bye)) + rx.drain(1000) if isinstance(r, Metrics)]


@pytest.mark.parametrize("bad", ["meta", "complex", "quantized", "text", "long name"])
def test_a_bad_value_is_left_out_of_its_row_named_once_and_counted(rx, bad):
    torch = pytest.importorskip("torch")
    from telemetry import TelemetryClient

    key = "x" * (MAX_NAME_CHARS + 1) if bad == "long name" else "bad"
    value = {"meta": lambda: torch.tensor(1.0, device="meta"), "complex": lambda: torch.tensor(1 + 2j),
             "quantized": lambda: torch.quantize_per_tensor(torch.tensor(1.0), 0.1, 0, torch.quint8),
             "text": lambda: "warmup", "long name": lambda: 1.0}[bad]
    tm = TelemetryClient(rx.endpoint, rank=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            # A row with a tensor: a row of plain floats goes out as it is encoded, unchecked (a
            # text value or an overlong name there is refused whole by the daemon, counted as
            # malformed); telemetry.wandb checks its rows' names and keeps text apart.
            tm.log(step, {"loss": torch.tensor(2.0 + step), "lr": 0.1, key: value()})
    said = [str(w.message) for w in caught if "not sent" in str(w.message)]
    assert len(said) == 1 and key[:80] in said[0], said
    tm.close(timeout_s=10.0)
    got = _metrics_until_bye(rx)
    assert [(m.step, {k: v for k, v in m.values.items() if k != "telemetry/client_s"}) for m in got] == \
        [(s, {"loss": 2.0 + s, "lr": 0.1}) for s in range(3)]
    assert tm.stats()["skipped_values"] == 3 and tm.stats()["dropped"] == 0


@pytest.mark.parametrize("num_values, name_chars", [(MAX_VALUES + 1, 12), (3 * MAX_VALUES, 12), (4000, MAX_NAME_CHARS)])
def test_a_row_wider_than_a_record_arrives_whole_in_several_records(rx, num_values, name_chars):
    from telemetry import TelemetryClient

    # The last case: within MAX_VALUES, but its names (two UTF-8 bytes a character) make a frame
    # beyond MAX_FRAME_BYTES.
    row = {"é" * (name_chars - 6) + f"{i:06d}": float(i) for i in range(num_values)}
    tm = TelemetryClient(rx.endpoint, rank=0)
    tm.log(0, {"loss": 1.0})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tm.log(1, row)
        tm.log(2, {"loss": 0.5})
        tm.close(timeout_s=10.0)
    got = _metrics_until_bye(rx)                   # each decoded: within the protocol's bounds
    assert [m.step for m in got][0] == 0 and got[-1].step == 2 and got[-1].values == {"loss": 0.5}
    parts = [m for m in got if m.step == 1]
    assert len(parts) > 1 and all(len(m.values) <= MAX_VALUES for m in parts)
    assert {k: v for m in parts for k, v in m.values.items()} == row
    assert any("sent as" in str(w.message) for w in caught)
    assert tm.stats()["dropped"] == 0 and tm.stats()["skipped_values"] == 0


def test_a_config_beyond_the_frame_limit_is_cut_to_fit_and_said(rx, monkeypatch):
    import threading

    from telemetry import TelemetryClient
    from telemetry.shared.security.redact import Redactor

    redacted_on: list[int] = []
    original = Redactor.__call__
    monkeypatch.setattr(Redactor, "__call__", lambda self, obj: redacted_on.append(threading.get_ident()) or original(self, obj))
    tm = TelemetryClient(rx.endpoint, rank=0)
    config = {f"k{i:06d}": "v" * 64 for i in range(MAX_FRAME_BYTES // 64)}     # ~1.3 MiB of msgpack
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tm.hello({"config": config, "model": "gpt2"})        # made and cut on the sender thread
        tm.log(0, {"loss": 1.0})
        tm.close(timeout_s=10.0)
    records = [r for r in rx.recv_until(lambda r: isinstance(r, Bye)) + rx.drain(1000) if not isinstance(r, Bye)]
    assert [type(r) for r in records] == [Hello, Hello, Metrics]            # in the order of the calls
    info = records[1].info
    assert info["model"] == "gpt2" and "_truncated" in info and 0 < len(info["config"]) < len(config)
    assert all(config[k] == v for k, v in info["config"].items())
    assert any("was cut" in str(w.message) for w in caught)
    assert redacted_on and threading.get_ident() not in redacted_on     # no Python work per key here
    assert tm.stats()["dropped"] == 0


def test_an_event_beyond_the_frame_limit_is_dropped_and_said_not_sent(rx):
    from telemetry import TelemetryClient

    tm = TelemetryClient(rx.endpoint, rank=0)
    with pytest.warns(RuntimeWarning, match="event record of"):
        tm.event("log_text", {"text": "x" * MAX_FRAME_BYTES})
    tm.log(0, {"loss": 1.0})
    tm.close(timeout_s=10.0)
    records = rx.recv_until(lambda r: isinstance(r, Bye)) + rx.drain(1000)
    assert [type(r) for r in records if not isinstance(r, Bye)] == [Hello, Metrics]
    assert tm.stats()["dropped"] == 1
