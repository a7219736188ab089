"""Export to OpenTelemetry over OTLP/HTTP: into the cluster's own collector or Prometheus.

The daemon (never a rank) hands its output records to this sink like to any other, on its own
thread. It keeps the latest value of each series and the OpenTelemetry SDK's periodic reader
exports them every `export_interval_s` with the SDK's OTLP/HTTP exporter (protobuf, cumulative
temporality):

    metrics (aggregated)   gauge <name>                      the step's value across ranks
    metrics (per rank)     gauge <name> {rank}               with the daemon's --per-rank
    gpu                    gauge <name> {host, gpu}
    system                 gauge <name> {host}
    daemon                 gauge <name>                      the daemon's own counters (telemetry/*, goodput/*)
    event                  counter telemetry.events {name, severity}   one per event (the daemon's
                           own bookkeeping events left out)

Every point also carries the resource attributes service.name (telemetry-daemon), job, run and
node (the daemon's host): several daemons of a job are told apart by their node. A name is kept
as the records have it (train/loss); a character OpenTelemetry does not take in a name becomes
"_". Units come from the metric catalogue (telemetry/shared/catalogue.py). A collector that does
not answer costs this sink's thread (the exporter's timeout), never ingest; what the SDK could not
export it logs.

Config (off by default):

    otlp:
      enabled: true
      endpoint: http://127.0.0.1:4318/v1/metrics     # a collector's OTLP/HTTP receiver
      export_interval_s: 10
      timeout_s: 10
      headers: {}                                     # e.g. an auth token for a hosted backend
      job: my-job                                     # the resource's `job` (default: the run name)
"""
from __future__ import annotations

import logging
import math
import re
import socket
import threading
from typing import Any

from telemetry.daemon.sinks.base import Out, Sink
from telemetry.shared.bookkeeping import is_bookkeeping
from telemetry.shared.numbers import is_int, is_number

log = logging.getLogger("telemetry.daemon.sinks.otlp")

# OpenTelemetry's instrument names: a letter, then letters, digits, _ . - /, 255 at most.
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.\-/]")
EVENTS_COUNTER = "telemetry.events"
# Distinct names kept (each an instrument and its latest values); beyond, values are counted, not kept.
MAX_NAMES = 20_000


def otel_name(name: str) -> str:
    """A record's metric name as an OpenTelemetry instrument name."""
    out = _NOT_IN_NAME.sub("_", name)[:255]
    return out if out[:1].isalpha() else ("m_" + out)[:255]


class OtlpSink(Sink):
    name = "otlp"

    def __init__(self, endpoint: str, run_name: str, job: str = "", export_interval_s: float = 10.0,
                 timeout_s: float = 10.0, headers: dict[str, str] | None = None, host: str = "") -> None:
        self.endpoint = endpoint
        self.run_name = run_name
        self.job = job or run_name
        self.export_interval_s = export_interval_s
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.host = host or socket.gethostname()
        self._lock = threading.Lock()               # the SDK's reader thread reads what this one writes
        self._latest: dict[str, dict[tuple, float]] = {}   # instrument name -> attributes -> latest value
        self._provider = None
        self._meter = None
        self._events = None
        self.num_points = 0
        self.num_events = 0
        self.num_names_not_kept = 0

    def start(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        resource = Resource.create({"service.name": "telemetry-daemon", "job": self.job, "run": self.run_name,
                                    "node": self.host})
        exporter = OTLPMetricExporter(endpoint=self.endpoint, headers=self.headers or None, timeout=self.timeout_s)
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=self.export_interval_s * 1000,
                                               export_timeout_millis=self.timeout_s * 1000)
        self._provider = MeterProvider(resource=resource, metric_readers=[reader])
        self._meter = self._provider.get_meter("telemetry")
        self._events = self._meter.create_counter(EVENTS_COUNTER, unit="1",
                                                  description="events the ranks and the daemon's diagnosis sent")

    def consume(self, batch: list[Out]) -> None:
        for o in batch:
            rec = o.record
            kind = o.kind
            if kind == "event":
                name = rec.get("name")
                if isinstance(name, str) and not is_bookkeeping(name):
                    data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
                    severity = data.get("severity") if isinstance(data.get("severity"), str) else "info"
                    self._events.add(1, {"name": name, "severity": severity})
                    self.num_events += 1
                continue
            if kind == "metrics":
                attrs = (("rank", rec["rank"]),) if is_int(rec.get("rank")) else ()
            elif kind == "gpu":
                attrs = (("host", str(rec.get("host", ""))), ("gpu", rec.get("gpu") if is_int(rec.get("gpu")) else 0))
            elif kind == "system":
                attrs = (("host", str(rec.get("host", ""))),)
            elif kind == "daemon":
                attrs = ()
            else:
                continue
            values = rec.get("values")
            if isinstance(values, dict):
                self._keep(values, attrs)

    def _keep(self, values: dict[str, Any], attrs: tuple) -> None:
        latest, new = self._latest, []
        with self._lock:
            for k, v in values.items():
                if not is_number(v) or not math.isfinite(v):
                    continue
                name = otel_name(k)
                series = latest.get(name)
                if series is None:
                    if len(latest) >= MAX_NAMES:
                        self.num_names_not_kept += 1
                        continue
                    series = latest[name] = {}
                    new.append((name, k))
                series[attrs] = float(v)
                self.num_points += 1
        # Outside the lock: the SDK's reader may be collecting (its lock held) and calling observe().
        for name, key in new:
            self._instrument(name, key)

    def _instrument(self, name: str, key: str) -> None:
        from opentelemetry.metrics import Observation

        from telemetry.shared import catalogue

        m = catalogue.lookup(key)

        def observe(_options, name=name):
            with self._lock:
                return [Observation(v, dict(a)) for a, v in self._latest.get(name, {}).items()]

        self._meter.create_observable_gauge(name, callbacks=[observe], unit=(m.unit if m is not None else "") or "",
                                            description=m.doc if m is not None else "")

    def close(self) -> None:
        if self._provider is not None:
            try:
                self._provider.force_flush(timeout_millis=int(self.timeout_s * 1000))
            finally:
                self._provider.shutdown()
                self._provider = None

    def stats(self) -> dict:
        return {"points": self.num_points, "events": self.num_events, "names": len(self._latest),
                "names_not_kept": self.num_names_not_kept, "endpoint": self.endpoint}
