"""OTLP export (issue 33 item 5): a real daemon exports to a receiver on loopback that decodes
each request with the official opentelemetry-proto messages; names, values, units and
attributes are checked against what the daemon wrote to metrics.jsonl."""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from daemon_util import start_daemon
from telemetry.client import TelemetryClient

pb = pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")


class Receiver:
    """An OTLP/HTTP metrics receiver: every request's ExportMetricsServiceRequest, decoded."""

    def __init__(self) -> None:
        self.requests: list = []
        self.paths: list[str] = []
        got = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):       # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = pb.ExportMetricsServiceRequest()
                req.ParseFromString(body)
                got.requests.append(req)
                got.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(pb.ExportMetricsServiceResponse().SerializeToString())

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def latest(self) -> dict[str, dict]:
        """Metric name -> its last export: {"unit", "kind", "points": {attributes: value}, "resource"}."""
        out = {}
        for req in self.requests:
            for rm in req.resource_metrics:
                resource = {a.key: a.value.string_value for a in rm.resource.attributes}
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        data = getattr(m, kind)
                        points = {tuple(sorted((a.key, _value(a.value)) for a in p.attributes)):
                                  (p.as_double if p.HasField("as_double") else p.as_int) for p in data.data_points}
                        out[m.name] = {"unit": m.unit, "kind": kind, "points": points, "resource": resource,
                                       "temporality": getattr(data, "aggregation_temporality", None),
                                       "monotonic": getattr(data, "is_monotonic", None)}
        return out

    def close(self) -> None:
        self.server.shutdown()


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind)


def test_the_daemon_exports_steps_per_rank_values_host_metrics_and_events_over_otlp(tmp_path):
    rx = Receiver()
    d = start_daemon(tmp_path, world_size=2, per_rank=True, run_name="otlp-run",
                     config={"otlp": {"enabled": True, "endpoint": rx.url, "export_interval_s": 0.5, "job": "job-7"},
                             "pollers": {"nvml_enabled": False, "host_interval_s": 0.5}})
    clients = [TelemetryClient(d.ingest, rank=r) for r in (0, 1)]
    try:
        for step in range(1, 21):
            for r, c in enumerate(clients):
                c.log(step, {"train/loss": 2.0 / step + r * 0.01, "perf/step_time": 0.1 + 0.01 * r,
                             "weird key!": 1.0 * step})
        for c in clients:
            c.event("checkpoint_saved", {"step": 20, "duration_s": 0.5})
        d.wait_for(lambda rs: any(r.get("step") == 20 and "rank" not in r for r in rs if r["kind"] == "metrics")
                   and sum(r.get("name") == "checkpoint_saved" for r in rs if r["kind"] == "event") == 2
                   and any(r["kind"] == "system" for r in rs))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = rx.latest()
            if (got.get("train/loss", {}).get("points", {}).get(()) == pytest.approx(2.0 / 20 + 0.005)
                    and got.get("telemetry.events") and "system/cpu_percent" in got):
                break
            time.sleep(0.3)
    finally:
        for c in clients:
            c.close()
        d.drain()
        rx.close()
    recs = d.read_jsonl()
    got = rx.latest()
    assert rx.paths and set(rx.paths) == {"/v1/metrics"}
    last = [r for r in recs if r["kind"] == "metrics" and "rank" not in r][-1]["values"]
    loss = got["train/loss"]
    assert loss["kind"] == "gauge" and loss["resource"]["run"] == "otlp-run" and loss["resource"]["job"] == "job-7"
    assert loss["resource"]["service.name"] == "telemetry-daemon" and loss["resource"]["node"]
    # The step's value across ranks, and each rank's own (the daemon's --per-rank records).
    assert loss["points"][()] == pytest.approx(last["train/loss"])
    for r in (0, 1):
        own = [x for x in recs if x["kind"] == "metrics" and x.get("rank") == r][-1]["values"]
        assert loss["points"][(("rank", r),)] == pytest.approx(own["train/loss"])
    assert got["perf/step_time"]["unit"] == "s"                       # from the metric catalogue
    assert got["weird_key_"]["points"][()] == pytest.approx(20.0)     # a name OpenTelemetry takes
    host = [r for r in recs if r["kind"] == "system"][-1]["host"]
    assert (("host", host),) in got["system/cpu_percent"]["points"]
    assert got["system/cpu_percent"]["unit"] == "%"
    # Events: one counter, cumulative and monotonic; both ranks' saves, counted once each.
    ev = got["telemetry.events"]
    assert ev["kind"] == "sum" and ev["monotonic"] is True and ev["temporality"] == 2   # CUMULATIVE
    assert ev["points"][(("name", "checkpoint_saved"), ("severity", "info"))] == 2
    # The daemon's own counters, as it wrote them last.
    daemon_last = [r for r in recs if r["kind"] == "daemon"][-1]["values"]
    assert got["telemetry/records_in"]["points"][()] <= daemon_last["telemetry/records_in"]
