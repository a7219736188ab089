"""The shared daemon fixture works over ipc and over tcp with OS-picked ports."""
import pytest

from telemetry.client import TelemetryClient


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_fixture_starts_talks_and_stops(make_daemon, transport):
    d = make_daemon(transport=transport, world_size=1)
    if transport == "tcp":
        assert d.ingest.startswith("tcp://127.0.0.1:") and not d.ingest.endswith(":0")
    tm = TelemetryClient(d.ingest, rank=0)
    tm.log(3, {"train/loss": 2.5})
    tm.close()
    d.wait_for(lambda recs: 3 in {r.get("step") for r in recs})
    assert d.status()["records_in"] >= 2   # hello + metrics
    assert d.stop() == 0
    assert d.steps()[3]["values"]["train/loss"] == 2.5
