"""OTLP end to end against a real time-series database: VictoriaMetrics (1.92 and later receive
OTLP/HTTP at /opentelemetry/v1/metrics; `launch/setup.sh --dev` installs Debian 13's build) with
-opentelemetry.usePrometheusNaming, as a cluster that queries in PromQL runs it.

A real daemon (2 ranks, --per-rank) exports to it, is drained and restarted on the same run, and
the series are read back through VictoriaMetrics' Prometheus API by the names and labels the docs
give (docs/metrics.md, "Names and units in OTLP and Prometheus"; docs/multinode.md, "OTLP"):
values exact against the daemon's metrics.jsonl (in base units), each rank's own series apart from
the aggregate's, the resource's labels, and one set of series continued across the restart.
Skips, saying why, where victoria-metrics is absent or has no OTLP receiver.
"""
from __future__ import annotations

import re
import time
from collections import defaultdict

import pytest

from daemon_util import start_daemon
from telemetry.client import TelemetryClient
from telemetry.consumers.prometheus import metric_name
from telemetry.shared import catalogue
from testkit.victoria_metrics import VictoriaMetrics, skip_reason

SKIP = skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))

RUN, JOB = "vm-run", "job-7"


@pytest.fixture
def vm(tmp_path):
    db = VictoriaMetrics(tmp_path / "vm-data")
    yield db
    db.close()


def _config(endpoint: str) -> dict:
    return {"otlp": {"enabled": True, "endpoint": endpoint, "export_interval_s": 0.3, "job": JOB},
            "daemon_record_interval_s": 0.3,
            "pollers": {"nvml_enabled": False, "host_interval_s": 0.3}}


def _log_steps(d, steps: range) -> None:
    clients = [TelemetryClient(d.ingest, rank=r) for r in (0, 1)]
    try:
        for step in steps:
            for r, c in enumerate(clients):
                c.log(step, {"train/loss": 2.0 / step + r * 0.01, "perf/step_time": 0.1 + 0.01 * r,
                             "memory/allocated_gb": 12.5 + r, "train/my_metric": 3.0 * step + r})
        for c in clients:
            c.event("checkpoint_saved", {"step": steps[-1], "duration_s": 0.5})
    finally:
        for c in clients:
            c.close()


def _run(tmp_path, vm, steps: range, log_dir=None):
    """A daemon's run of `steps` exported to `vm` until VictoriaMetrics has its last step; drained."""
    d = start_daemon(tmp_path, world_size=2, per_rank=True, run_name=RUN, config=_config(vm.otlp_endpoint),
                     log_dir=log_dir)
    try:
        _log_steps(d, steps)
        d.wait_for(lambda rs: any(r.get("step") == steps[-1] and "rank" not in r for r in rs if r["kind"] == "metrics")
                   and any(r["kind"] == "system" for r in rs) and any(r["kind"] == "daemon" for r in rs))
        deadline = time.monotonic() + 60
        while list(vm.query("training_step").values()) != [steps[-1]]:
            assert time.monotonic() < deadline, (
                f"VictoriaMetrics never had step {steps[-1]}: {vm.query('training_step')}\n"
                f"{vm.log_path.read_text()[-3000:]}")
            time.sleep(0.3)
    finally:
        d.drain()
    return d


def test_victoriametrics_gets_the_documented_names_and_labels_across_a_restart(tmp_path, vm):
    d = _run(tmp_path, vm, range(1, 11))
    recs = d.read_jsonl()
    last = [r for r in recs if r["kind"] == "metrics" and "rank" not in r][-1]
    own = {r: [x for x in recs if x["kind"] == "metrics" and x.get("rank") == r][-1]["values"] for r in (0, 1)}
    assert last["step"] == 10

    # -- names: every built-in metric the daemon wrote is there by the documented rule ---------------
    # (the exporter's name, which is Prometheus's translation of the OTLP name and unit, without the
    # exporter's telemetry_ prefix that a daemon's own telemetry/* already has).
    names = set(vm.get("/api/v1/label/__name__/values"))
    written = {k for r in recs if r["kind"] in ("metrics", "system", "daemon") for k in r.get("values", {})}
    exact = {m.name for m in catalogue.CATALOGUE if "*" not in m.name} & written
    assert {"train/loss", "memory/allocated_gb", "perf/step_time", "telemetry/records_in"} <= exact
    for n in sorted(exact):
        expected = metric_name(n)[0]
        if not n.startswith("telemetry/"):
            expected = expected.removeprefix("telemetry_")
        assert expected in names, (n, expected, sorted(names))
    assert {"train_my_metric", "rank_train_my_metric", "training_step", "training_last_progress_time_seconds",
            "telemetry_events_total", "memory_allocated_bytes", "perf_step_time_seconds"} <= names
    # No name with its unit twice (goodput_checkpoint_save_s_seconds, memory_allocated_gb_GB).
    assert not [n for n in names if re.search(r"_(s|gb|mb|mb_s|mhz|w|c)_(seconds|bytes|hertz|watts|celsius)", n)]

    # -- the resource's labels, on every series ------------------------------------------------------
    every = vm.series('{__name__=~".+"}')
    assert every
    instance_ids = {s.get("service_instance_id") for s in every}
    assert len(instance_ids) == 1 and None not in instance_ids
    for s in every:
        assert (s["service_name"], s["service_namespace"], s["llm_telemetry_run_name"]) == (
            "telemetry-daemon", JOB, RUN), s
        assert s["host_name"] and "job" not in s and "run" not in s and "instance" not in s, s

    # -- values exact, in base units; a rank's own series apart from the aggregate's ------------------
    def one(promql: str) -> float:
        got = vm.query(promql)
        assert len(got) == 1, (promql, got)
        return next(iter(got.values()))

    assert one("train_loss") == pytest.approx(last["values"]["train/loss"])
    assert one("memory_allocated_bytes") == pytest.approx(last["values"]["memory/allocated_gb"] * 1e9)
    assert one("perf_step_time_seconds") == pytest.approx(last["values"]["perf/step_time"])
    assert one("train_my_metric") == pytest.approx(last["values"]["train/my_metric"])
    assert one("training_last_progress_time_seconds") == pytest.approx(last["t"])
    per_rank = vm.query("rank_train_loss")
    assert {dict(k)["rank"]: v for k, v in per_rank.items()} == {
        str(r): pytest.approx(own[r]["train/loss"]) for r in (0, 1)}
    assert {dict(k)["rank"]: v for k, v in vm.query("rank_memory_allocated_bytes").items()} == {
        str(r): pytest.approx(own[r]["memory/allocated_gb"] * 1e9) for r in (0, 1)}
    # A sum over a metric's series is the sum of what it means: the aggregate's alone.
    assert one("sum(train_loss)") == pytest.approx(last["values"]["train/loss"])
    with_rank = defaultdict(set)
    for s in every:
        with_rank[s["__name__"]].add("rank" in s)
    assert not [n for n, kinds in with_rank.items() if len(kinds) > 1], "per-rank and aggregate series under one name"
    events = vm.query('telemetry_events_total{name="checkpoint_saved"}')
    assert [(dict(k)["severity"], v) for k, v in events.items()] == [("info", 2.0)]

    # -- a restarted daemon continues the same series -------------------------------------------------
    before = {n: {tuple(sorted(s.items())) for s in vm.series(n)}
              for n in ("training_step", "train_loss", "rank_train_loss", "memory_allocated_bytes")}
    d2 = _run(tmp_path, vm, range(11, 13), log_dir=d.log_dir)
    after = {n: {tuple(sorted(s.items())) for s in vm.series(n)} for n in before}
    assert after == before and len(before["rank_train_loss"]) == 2
    assert {s.get("service_instance_id") for s in vm.series('{__name__=~".+"}')} == instance_ids
    # One series of the step, its samples from both daemons: 10 before the restart, 12 after.
    steps = vm.samples("training_step")
    assert len(steps) == 1
    values = next(iter(steps.values()))
    assert 10 in values and values[-1] == 12 and values == sorted(values)
    last2 = [r for r in d2.read_jsonl() if r["kind"] == "metrics" and "rank" not in r][-1]
    assert last2["step"] == 12 and one("train_loss") == pytest.approx(last2["values"]["train/loss"])
