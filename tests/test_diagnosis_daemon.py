"""Pollers and diagnosis inside a real daemon process: records and events reach metrics.jsonl."""
from __future__ import annotations

from telemetry import TelemetryClient


def test_daemon_polls_the_host_and_emits_diagnosis_events(make_daemon):
    d = make_daemon(world_size=1, config={
        "pollers": {"nvml_enabled": False, "host_interval_s": 0.2},
        # a threshold every machine crosses, so the host rule must fire from real psutil values
        "diagnosis": {"host_memory_percent_high": 0.01},
    })
    tm = TelemetryClient(endpoint=d.ingest, rank=0)
    try:
        tm.hello({"model": "test"})
        tm.log(1, {"train/loss": float("nan")})
        recs = d.wait_for(lambda rs: {"diagnosis/nonfinite", "diagnosis/host_memory"}
                          <= {r.get("name") for r in rs if r["kind"] == "event"}
                          and any("system/rank0/rss_gb" in r["values"] for r in rs if r["kind"] == "system"))
    finally:
        tm.close()
    system = [r for r in recs if r["kind"] == "system"]
    with_rank = [r for r in system if "system/rank0/rss_gb" in r["values"]]
    assert with_rank and with_rank[-1]["values"]["system/rank0/rss_gb"] > 0  # this test process, by pid
    assert 0 <= system[-1]["values"]["system/cpu_percent"] <= 100
    ev = {r["name"]: r for r in recs if r["kind"] == "event"}
    assert ev["diagnosis/nonfinite"]["data"]["key"] == "train/loss"
    assert ev["diagnosis/host_memory"]["data"]["memory_percent"] > 0.01
    assert not [r for r in recs if r["kind"] == "gpu"]  # NVML off by config
    d.drain()
