"""OTLP export: a real daemon (2 ranks, per-rank records) exports to a receiver on loopback that
decodes each OTLP/HTTP protobuf post with the official opentelemetry-proto messages, and what
arrives is held to OpenTelemetry's conventions as a real backend needs them:

- names: dot-separated lowercase namespaces without their unit, UCUM units, values in base units
  (GB -> By), all from the metric catalogue, for the built-in metrics and a user's own;
- the resource: service.name/namespace/instance.id, our own attributes under llm_telemetry.*, no
  bare `job`; service.instance.id the same after a daemon restart;
- a rank's own series never the aggregate's minus a label (a sum over a metric means something);
- the run's step and the time of its last progress exported;
- cumulative temporality whatever OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE says;
- the sink as a custom sink (a second endpoint, no subclass);
- no `job` or `instance` from OTEL_RESOURCE_ATTRIBUTES; failed exports counted, said now and then;
- no two names one in a backend that translates them (train.loss, train_loss), and a rank's value
  under a poller's name never in the poller's series.
"""
from __future__ import annotations

import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from daemon_util import start_daemon
from telemetry.client import TelemetryClient
from telemetry.shared import catalogue

pb = pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")
from opentelemetry.proto.metrics.v1 import metrics_pb2  # noqa: E402  (after the skip)

CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
# OpenTelemetry's naming: lowercase snake_case words in dot-separated namespaces.
OTEL_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$")
# The UCUM units the catalogue exports, and the sink's own ({event}).
UCUM = {u.ucum for u in catalogue.UNITS.values()} | {"{event}"}
# A unit spelled at the end of a name (what a backend would double: goodput_checkpoint_save_s_seconds).
UNIT_TAILS = ("_gb", "_mb", "_mb_s", "_s", "_seconds", "_bytes", "_mhz", "_hz", "_w", "_c", "_percent")


class Receiver:
    """An OTLP/HTTP metrics receiver: every request's ExportMetricsServiceRequest, decoded."""

    def __init__(self) -> None:
        self.requests: list = []
        self.paths: list[str] = []
        self.content_types: set[str] = set()
        self.status = 200           # what it answers (a failing collector: 500)
        got = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):       # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = pb.ExportMetricsServiceRequest()
                req.ParseFromString(body)
                got.requests.append(req)
                got.paths.append(self.path)
                got.content_types.add(self.headers.get("Content-Type", ""))
                if got.status != 200:
                    self.send_response(got.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(pb.ExportMetricsServiceResponse().SerializeToString())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def metrics(self, since: int = 0):
        """(resource attributes, metric) of every metric of every request from the `since`-th on."""
        for req in self.requests[since:]:
            for rm in req.resource_metrics:
                resource = {a.key: _value(a.value) for a in rm.resource.attributes}
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        yield resource, m

    def latest(self, since: int = 0) -> dict[str, dict]:
        """Metric name -> its last export: {"unit", "kind", "points": {attributes: value}, "resource"}."""
        out = {}
        for resource, m in self.metrics(since):
            kind = m.WhichOneof("data")
            data = getattr(m, kind)
            points = {tuple(sorted((a.key, _value(a.value)) for a in p.attributes)):
                      (p.as_double if p.HasField("as_double") else p.as_int) for p in data.data_points}
            out[m.name] = {"unit": m.unit, "kind": kind, "points": points, "resource": resource,
                           "temporality": getattr(data, "aggregation_temporality", None),
                           "monotonic": getattr(data, "is_monotonic", None)}
        return out

    def instance_ids(self, since: int = 0) -> set[str]:
        return {r["service.instance.id"] for r, _ in self.metrics(since)}

    def close(self) -> None:
        self.server.shutdown()


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind)


def _wait(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _config(url: str, url2: str) -> dict:
    return {"otlp": {"enabled": True, "endpoint": url, "export_interval_s": 0.3, "job": "job-7"},
            # A second endpoint: the same class as a custom sink, built with the log_dir custom sinks get.
            "custom_sinks": [{"class": "telemetry.daemon.sinks.otlp:OtlpSink",
                              "options": {"endpoint": url2, "run_name": "otlp-run", "job": "job-7",
                                          "export_interval_s": 0.3}}],
            "daemon_record_interval_s": 0.3,
            "pollers": {"nvml_enabled": False, "host_interval_s": 0.3}}


def _log_steps(d, steps: range) -> None:
    clients = [TelemetryClient(d.ingest, rank=r) for r in (0, 1)]
    try:
        for step in steps:
            for r, c in enumerate(clients):
                c.log(step, {"train/loss": 2.0 / step + r * 0.01, "perf/step_time": 0.1 + 0.01 * r,
                             "memory/allocated_gb": 12.5 + r, "weird key!": 1.0 * step,
                             "Train/Loss": 7.0, "eval/copy/loss": 1.5 + r})
        for c in clients:
            c.event("checkpoint_saved", {"step": steps[-1], "duration_s": 0.5})
    finally:
        for c in clients:
            c.close()


def test_a_real_receiver_gets_otel_names_units_resource_progress_and_cumulative_sums(tmp_path):
    rx, rx2 = Receiver(), Receiver()
    # The environment asks the SDK for delta sums: the sink pins what the docs promise, cumulative.
    env = {"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta"}
    d = start_daemon(tmp_path, world_size=2, per_rank=True, run_name="otlp-run", config=_config(rx.url, rx2.url),
                     env=env)
    try:
        _log_steps(d, range(1, 21))
        d.wait_for(lambda rs: any(r.get("step") == 20 and "rank" not in r for r in rs if r["kind"] == "metrics")
                   and sum(r.get("name") == "checkpoint_saved" for r in rs if r["kind"] == "event") == 2
                   and any(r["kind"] == "system" for r in rs) and any(r["kind"] == "daemon" for r in rs))

        def arrived(r: Receiver) -> bool:
            got = r.latest()
            return (got.get("training.step", {}).get("points", {}).get(()) == 20
                    and got.get("telemetry.events", {}).get("points")
                    and "system.cpu" in got and "goodput.wall" in got and "telemetry.records_in" in got)
        _wait(lambda: arrived(rx) and arrived(rx2), "the exports of step 20")
    finally:
        d.drain()
    recs = d.read_jsonl()
    got = rx.latest()
    assert rx.paths and set(rx.paths) == {"/v1/metrics"} and rx.content_types == {"application/x-protobuf"}

    # -- names and units, for every metric that arrived ---------------------------------------------
    for name, m in got.items():
        assert OTEL_NAME.match(name), name
        assert m["unit"] in UCUM, (name, m["unit"])
        assert not name.endswith(UNIT_TAILS) or name == "perf.mfu_percent", name
    last = [r for r in recs if r["kind"] == "metrics" and "rank" not in r][-1]
    own = {r: [x for x in recs if x["kind"] == "metrics" and x.get("rank") == r][-1]["values"] for r in (0, 1)}
    mem = got["memory.allocated"]                 # memory/allocated_gb: bytes, unit By
    assert mem["unit"] == "By" and mem["points"][()] == pytest.approx(last["values"]["memory/allocated_gb"] * 1e9)
    assert got["perf.step_time"]["unit"] == "s"
    assert got["goodput.wall"]["unit"] == "s" and "goodput.wall_s" not in got
    assert got["system.memory_used"]["unit"] == "By" and got["system.cpu"]["unit"] == "%"
    assert got["train.loss"]["unit"] == ""        # a plain number: no unit (UCUM's 1 reads as a ratio)
    assert got["weird_key"]["points"][()] == pytest.approx(20.0)
    # Train/Loss is train.loss lowercased: never merged into it (the SDK takes names case-insensitively).
    renamed = [n for n in got if n.startswith("train.loss_")]
    assert len(renamed) == 1 and got[renamed[0]]["points"][()] == pytest.approx(7.0)
    # A dataset is an attribute: eval/copy/loss -> eval.loss {dataset=copy}.
    assert got["eval.loss"]["points"][(("dataset", "copy"),)] == pytest.approx(last["values"]["eval/copy/loss"])
    # The daemon's own cumulative counts are monotonic cumulative sums.
    rin = got["telemetry.records_in"]
    assert rin["kind"] == "sum" and rin["monotonic"] and rin["temporality"] == CUMULATIVE
    assert rin["unit"] == "{record}"

    # -- a rank's own series are not the aggregate's minus a label ----------------------------------
    loss = got["train.loss"]
    assert loss["points"] == {(): pytest.approx(last["values"]["train/loss"])}
    per_rank = got["rank.train.loss"]
    assert per_rank["points"] == {(("rank", r),): pytest.approx(own[r]["train/loss"]) for r in (0, 1)}
    for name, m in got.items():
        with_rank = {any(k == "rank" for k, _ in attrs) for attrs in m["points"]}
        assert len(with_rank) <= 1, f"{name}: per-rank and aggregate series under one name"

    # -- the resource --------------------------------------------------------------------------------
    resource = loss["resource"]
    assert "job" not in resource and "run" not in resource and "node" not in resource and "instance" not in resource
    assert resource["service.name"] == "telemetry-daemon" and resource["service.namespace"] == "job-7"
    assert uuid.UUID(resource["service.instance.id"]).version == 5
    assert resource["llm_telemetry.run.name"] == "otlp-run" and resource["host.name"]
    for key in resource:          # OpenTelemetry's conventions (service.*, host.*, its SDK's telemetry.sdk.*) or ours
        assert key.startswith(("service.", "host.", "telemetry.sdk.", "llm_telemetry.")), key

    # -- the run's progress ----------------------------------------------------------------------------
    assert got["training.step"]["points"][()] == 20 and got["training.step"]["unit"] == "{step}"
    progress = got["training.last_progress_time"]
    assert progress["unit"] == "s" and progress["points"][()] == pytest.approx(last["t"])

    # -- events: one cumulative monotonic sum, the environment's delta preference notwithstanding -----
    ev = got["telemetry.events"]
    assert ev["kind"] == "sum" and ev["monotonic"] is True and ev["temporality"] == CUMULATIVE
    assert ev["points"][(("name", "checkpoint_saved"), ("severity", "info"))] == 2

    # -- the custom sink: the same export at its own endpoint ------------------------------------------
    got2 = rx2.latest()
    assert got2["train.loss"]["points"][()] == pytest.approx(loss["points"][()])
    assert got2["memory.allocated"]["unit"] == "By"
    assert rx2.instance_ids() == rx.instance_ids() == {resource["service.instance.id"]}

    # -- a restarted daemon continues the same series (the same service.instance.id) -----------------
    before = len(rx.requests)
    d2 = start_daemon(tmp_path, world_size=2, per_rank=True, run_name="otlp-run", config=_config(rx.url, rx2.url),
                      env=env, log_dir=d.log_dir)
    try:
        _log_steps(d2, range(21, 23))
        _wait(lambda: rx.latest(before).get("training.step", {}).get("points", {}).get(()) == 22,
              "the restarted daemon's exports")
    finally:
        d2.drain()
    assert rx.instance_ids(before) == {resource["service.instance.id"]}


def test_every_built_in_name_maps_to_its_own_otel_name_and_unit():
    """The mapping rule (docs/metrics.md), over the whole catalogue: distinct names, no unit in a
    name, a UCUM unit, values in base units."""
    names = [m.name for m in catalogue.CATALOGUE if "*" not in m.name]
    mapped = {n: catalogue.otel(n) for n in names}
    assert len({m.name for m in mapped.values()}) == len(names)
    for n, m in mapped.items():
        assert OTEL_NAME.match(m.name), n
        assert m.unit in UCUM, (n, m.unit)
        assert not m.name.endswith(UNIT_TAILS) or n == "perf/mfu_percent", (n, m.name)
    assert {m.unit for m in catalogue.CATALOGUE} <= set(catalogue.UNITS)
    assert (mapped["memory/allocated_gb"].name, mapped["memory/allocated_gb"].unit,
            mapped["memory/allocated_gb"].scale) == ("memory.allocated", "By", 1e9)
    assert (mapped["goodput/fraction"].name, catalogue.otel("goodput/checkpoint_save_s").name,
            catalogue.otel("goodput/checkpoint_save_s").unit) == ("goodput.fraction", "goodput.checkpoint_save", "s")
    assert (mapped["gpu/sm_clock_mhz"].unit, mapped["gpu/sm_clock_mhz"].scale) == ("Hz", 1e6)
    assert mapped["gpu/temperature_c"].unit == "Cel" and mapped["system/disk_read_mb_s"].unit == "By/s"
    # A user's own: its segments, no unit; a rank's own under rank.
    assert (catalogue.otel("train/my_metric").name, catalogue.otel("train/my_metric").unit) == ("train.my_metric", "")
    assert catalogue.otel("train/loss", per_rank=True).name == "rank.train.loss"
    gpu_rank = catalogue.otel("gpu/rank3/memory_used_gb")
    assert (gpu_rank.name, gpu_rank.labels) == ("gpu.rank.memory_used", {"rank": "3"})


def test_the_sink_is_a_custom_sink_and_refuses_a_bad_endpoint_as_the_config_does(tmp_path):
    from telemetry.daemon.sinks.otlp import OtlpSink
    from telemetry.shared.config import ConfigError

    log_dir = tmp_path / "my-run" / "telemetry"
    log_dir.mkdir(parents=True)
    sink = OtlpSink(log_dir=log_dir, endpoint="http://127.0.0.1:4318/v1/metrics")
    # The daemon's own default run name: the run directory's.
    assert sink.run_name == "my-run" and sink.resource_attributes()["service.namespace"] == "my-run"
    again = OtlpSink(log_dir=log_dir, endpoint="http://127.0.0.1:9/v1/metrics", export_interval_s=5)
    assert again.instance_id == sink.instance_id          # what the daemon is, not when it started
    other = OtlpSink(log_dir=log_dir, endpoint="http://127.0.0.1:4318/v1/metrics", run_name="another")
    assert other.instance_id != sink.instance_id
    with pytest.raises(ConfigError, match="endpoint"):
        OtlpSink(log_dir=log_dir, endpoint="127.0.0.1:4318")


def test_a_users_name_never_takes_the_sinks_own_or_another_names_series(tmp_path):
    from telemetry.daemon.sinks.otlp import LAST_PROGRESS, STEP, OtlpSink

    sink = OtlpSink(log_dir=tmp_path / "r" / "telemetry", endpoint="http://127.0.0.1:4318/v1/metrics")
    none = frozenset()
    names = {"per-rank train/loss": sink._family_of("train/loss", True, frozenset({"rank"}))[0].name}
    # Each later than a name it maps onto (first come, first kept: as in Prometheus).
    names.update((k, sink._family_of(k, False, none)[0].name)
                 for k in ("training/step", "training/last_progress_time", "train/loss", "Train/Loss", "rank/train/loss"))
    assert len(set(names.values())) == len(names)
    assert STEP not in names.values() and LAST_PROGRESS not in names.values()
    assert names["train/loss"] == "train.loss" and names["per-rank train/loss"] == "rank.train.loss"
    assert names["Train/Loss"].startswith("train.loss_") and sink.num_names_renamed == 4
    # A rank<r> segment's rank is the same number a per-rank record's is.
    assert sink._family_of("gpu/rank3/memory_used_gb", False, frozenset({"host", "gpu"}))[2] == (("rank", 3),)


def _in_process_sink(tmp_path, url: str):
    from telemetry.daemon.sinks.otlp import OtlpSink

    sink = OtlpSink(log_dir=tmp_path / "r" / "telemetry", endpoint=url, export_interval_s=0.2, timeout_s=2.0)
    sink.start()
    return sink


def _out(kind: str, rec: dict):
    from telemetry.daemon.sinks.base import Out

    return Out(kind, rec, b"")


def test_the_environment_adds_resource_attributes_but_never_job_or_instance(tmp_path, monkeypatch, caplog):
    """OTEL_RESOURCE_ATTRIBUTES is the SDK's way to add attributes (deployment.environment), but a
    `job` or `instance` there reached the resource: the labels a Prometheus-compatible backend makes
    itself (an outside tester's find). Left out, said once; the rest kept."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "job=envjob,instance=envinst,deployment.environment=prod")
    rx = Receiver()
    sink = _in_process_sink(tmp_path, rx.url)
    try:
        sink.consume([_out("metrics", {"step": 1, "t": time.time(), "values": {"train/loss": 2.0}})])
        _wait(lambda: rx.requests, "an export")
    finally:
        sink.close()
        rx.close()
    (resource,) = {tuple(sorted(r.items())) for r, _ in rx.metrics()}
    resource = dict(resource)
    assert "job" not in resource and "instance" not in resource, resource
    assert resource["deployment.environment"] == "prod" and resource["service.name"] == "telemetry-daemon"
    assert sink.stats()["resource_refused"] == ["instance", "job"]
    assert [r.getMessage() for r in caplog.records if "OTEL_RESOURCE_ATTRIBUTES" in r.getMessage()], caplog.text


def test_failed_exports_are_counted_and_said_now_and_then_not_once_an_export(tmp_path, caplog):
    """A collector answering 500, then gone: every failed export counted (stats: export_failures of
    exports, the last error), said once in the daemon's log within FAILURE_LOG_INTERVAL_S; the
    SDK's own line per export (~360 an hour at the default interval) not printed. Before: nothing
    counted anywhere and a line a failure on stderr."""
    import logging

    from telemetry.daemon.sinks.otlp import SDK_EXPORTER_LOGGER

    rx = Receiver()
    rx.status = 500
    sink = _in_process_sink(tmp_path, rx.url)
    try:
        sink.consume([_out("metrics", {"step": 1, "t": time.time(), "values": {"train/loss": 2.0}})])
        _wait(lambda: sink.stats()["export_failures"] >= 3, "three failed exports")
        rx.close()                       # and then no collector at all
        n = sink.stats()["export_failures"]
        _wait(lambda: sink.stats()["export_failures"] >= n + 2, "failed exports to a closed port")
    finally:
        sink.close()
    st = sink.stats()
    assert st["exports"] >= st["export_failures"] >= 5 and st["last_export_error"], st
    said = [r for r in caplog.records if r.name == "telemetry.daemon.sinks.otlp" and "export to" in r.getMessage()]
    assert len(said) == 1 and "500" in said[0].getMessage(), [r.getMessage() for r in said]
    assert not [r for r in caplog.records if r.name == SDK_EXPORTER_LOGGER and r.levelno >= logging.WARNING]


def test_no_two_names_are_one_in_a_backend_and_a_ranks_value_never_joins_a_pollers_series(tmp_path):
    """Names a Prometheus-compatible backend would make one (train.loss and train_loss: train_loss;
    memory.allocated in By and a user's memory/allocated_bytes: memory_allocated_bytes) are two;
    a rank's value under a poller's name (system/cpu_percent) was the poller's series with other
    attributes (a sum over it mixed the two): it has a name of its own, whichever came first."""
    from telemetry.daemon.sinks.otlp import OtlpSink, backend_names

    sink = OtlpSink(log_dir=tmp_path / "r" / "telemetry", endpoint="http://127.0.0.1:4318/v1/metrics")
    none, host = frozenset(), frozenset({"host"})
    user_cpu = sink._family_of("system/cpu_percent", False, none, "rank")[0]        # before the poller's
    poller_cpu = sink._family_of("system/cpu_percent", False, host, "poller")[0]
    assert poller_cpu.name == "system.cpu" and user_cpu.name.startswith("system.cpu_") and user_cpu is not poller_cpu
    names = [sink._family_of(k, False, none, "rank")[0] for k in
             ("train/loss", "train_loss", "memory/allocated_gb", "memory/allocated_bytes", "goodput/wall_s")]
    flat = [backend_names(f.name, f.unit, f.cumulative)[1] for f in names]
    assert len(set(flat)) == len(flat), flat
    assert names[0].name == "train.loss" and names[1].name.startswith("train_loss_"), [f.name for f in names]
    assert names[2].name == "memory.allocated" and names[3].name.startswith("memory.allocated_bytes_")
    assert names[4].name != "goodput.wall"          # the daemon's own (its records) keep theirs
    assert sink._family_of("goodput/wall_s", False, none, "self")[0].name == "goodput.wall"


def test_telemetry_status_says_the_collectors_failures(tmp_path):
    """A daemon whose collector answers 500: `telemetry status` names the failed exports and why."""
    import subprocess
    import sys

    rx = Receiver()
    rx.status = 500
    d = start_daemon(tmp_path, config={"otlp": {"enabled": True, "endpoint": rx.url, "export_interval_s": 0.3},
                                       "pollers": {"nvml_enabled": False, "host_interval_s": 0.3}})
    try:
        _wait(lambda: (d.status()["sinks"]["otlp"].get("export_failures") or 0) >= 2, "two failed exports")
        out = subprocess.run([sys.executable, "-m", "telemetry", "status", "--control", d.control],
                             capture_output=True, text=True, timeout=120)
    finally:
        d.drain()
        rx.close()
    line = next(line for line in out.stdout.splitlines() if line.startswith("sink otlp"))
    assert "exports failed" in line and "500" in line, out.stdout


def test_the_sdk_turned_off_by_the_environment_is_said_not_silent(tmp_path, monkeypatch, caplog):
    """OTEL_SDK_DISABLED=true makes OpenTelemetry's SDK export nothing, and the sink said nothing
    (its points counted, no export ever tried): now said in the log and in its stats."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    rx = Receiver()
    sink = _in_process_sink(tmp_path, rx.url)
    try:
        sink.consume([_out("metrics", {"step": 1, "t": time.time(), "values": {"train/loss": 2.0}})])
        time.sleep(1.0)                 # five export intervals: none comes
    finally:
        sink.close()
        rx.close()
    assert not rx.requests and sink.stats()["disabled_by"] == "OTEL_SDK_DISABLED=true"
    assert any("OTEL_SDK_DISABLED" in r.getMessage() for r in caplog.records), caplog.text


def test_an_exporter_that_raises_is_counted_as_a_failed_export(tmp_path, monkeypatch):
    """Older OTLP exporters let a collector that is down raise out of export(): counted as a failed
    export with its reason, like one that returns FAILURE (the SDK's reader would otherwise log a
    traceback every export, uncounted: a reviewer's find)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    def raises(self, *args, **kwargs):
        raise ConnectionError("collector down")

    monkeypatch.setattr(OTLPMetricExporter, "export", raises)
    sink = _in_process_sink(tmp_path, "http://127.0.0.1:9/v1/metrics")
    try:
        sink.consume([_out("metrics", {"step": 1, "t": time.time(), "values": {"train/loss": 2.0}})])
        _wait(lambda: sink.stats()["export_failures"] >= 2, "two failed exports")
    finally:
        sink.close()
    assert "collector down" in sink.stats()["last_export_error"]
