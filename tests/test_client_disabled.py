"""DisabledClient is TelemetryClient's public interface with nothing behind it.

The public names are read off TelemetryClient, so a method added there without a no-op twin in
DisabledClient fails here; none of TelemetryClient's code may run on a client it never opened.
"""
from __future__ import annotations

import inspect

import pytest

from telemetry import DisabledClient, TelemetryClient

# Arguments for the public methods' required parameters, by name. A new method with a parameter
# not listed here fails the test below: add a sample value (and the method's no-op twin).
SAMPLE_ARGS = {"step": 1, "values": {"train/loss": 1.0}, "name": "forward", "info": {"config": {}},
               "data": {"path": "x"}}


def _public_methods(cls: type) -> list[str]:
    names = [n for n, v in inspect.getmembers(cls, callable) if not n.startswith("_")]
    return sorted(names) + ["__enter__", "__exit__"]


def _call(obj, name: str):
    fn = getattr(obj, name)
    if name == "__exit__":
        return fn(None, None, None)
    params = inspect.signature(fn).parameters.values()
    kwargs = {p.name: SAMPLE_ARGS[p.name] for p in params
              if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return fn(**kwargs)


@pytest.fixture
def disabled(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    return TelemetryClient("", rank=None)


def test_it_is_a_class_of_its_own_with_every_public_method_as_a_twin(disabled):
    assert type(disabled) is DisabledClient
    assert TelemetryClient not in DisabledClient.__mro__          # inherits nothing that could run
    assert isinstance(disabled, TelemetryClient)                  # still accepted where one is expected
    for name in _public_methods(TelemetryClient):
        assert name in vars(DisabledClient), f"DisabledClient has no no-op twin of TelemetryClient.{name}"
        ours, theirs = inspect.signature(getattr(DisabledClient, name)), inspect.signature(getattr(TelemetryClient, name))
        assert list(ours.parameters) == list(theirs.parameters), name


def test_every_public_method_runs_and_does_nothing(disabled):
    for name in _public_methods(TelemetryClient):
        _call(disabled, name)
    with disabled.span("forward"):
        pass
    with disabled as tm:
        tm.log(2, {"train/loss": 2.0})
    assert disabled.stats() == {"sent": 0, "dropped": 0, "seq": 0, "pending": 0, "skipped_values": 0, "src": 0}
    assert set(disabled.stats()) >= {"sent", "dropped"}
    disabled.close()
    disabled.close()


def test_its_public_attributes_are_a_real_clients(disabled):
    real = TelemetryClient("tcp://127.0.0.1:1", rank=3, send_hello=False)   # nothing listens: never blocks
    try:
        public = {n for n in vars(real) if not n.startswith("_")}
    finally:
        real.close(timeout_s=0)
    assert public <= set(vars(disabled)), public - set(vars(disabled))
    assert disabled.rank == 3 and disabled.endpoint == ""


@pytest.mark.parametrize("value, off", [("1", True), ("yes", True), ("true", True), ("", False), ("0", False),
                                        ("false", False), ("FALSE", False), ("no", False), ("off", False),
                                        (" false ", False)])
def test_telemetry_disabled_is_read_one_way_by_the_client_and_by_autostart(monkeypatch, value, off):
    """With TELEMETRY_DISABLED=false the client was on while autostart read it as off: every
    record went to a daemon never started, and the warning told the user to set
    TELEMETRY_AUTOSTART=1, which was set (an outside tester's find)."""
    from telemetry.client import autostart

    monkeypatch.delenv("TELEMETRY_ENDPOINT", raising=False)
    monkeypatch.setenv("TELEMETRY_DISABLED", value)
    monkeypatch.setenv("TELEMETRY_AUTOSTART", "1")
    tm = TelemetryClient("ipc:///nonexistent-dir/ingest.sock", send_hello=False)
    try:
        assert isinstance(tm, DisabledClient) is off
    finally:
        tm.close(timeout_s=0)
    assert autostart.wanted(True) is not off
