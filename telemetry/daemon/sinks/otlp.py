"""Export to OpenTelemetry over OTLP/HTTP: into the cluster's own collector or time-series database.

The daemon (never a rank) hands its output records to this sink like to any other, on its own
thread. It keeps the latest value of each series and the OpenTelemetry SDK's periodic reader
exports them every `export_interval_s` with the SDK's OTLP/HTTP exporter (protobuf, cumulative
temporality, whatever OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE says):

    metrics (aggregated)   <name>                      the step's value across ranks
    metrics (per rank)     rank.<name> {rank}          with the daemon's --per-rank
    gpu                    <name> {host, gpu}
    system                 <name> {host}
    daemon                 <name>                      the daemon's own counters (telemetry.*, goodput.*)
    (the run's progress)   training.step               the last aggregated step
                           training.last_progress_time unix time (s) the step last moved: a stalled
                                                       run's stops while the gauges keep their values
    event                  telemetry.events {name, severity}   a cumulative monotonic sum, one per
                           event (the daemon's own bookkeeping events left out)

Names and units come from the metric catalogue (`catalogue.otel`, telemetry/shared/catalogue.py):
dot-separated lowercase namespaces, no unit in the name, UCUM units, values in base units
(memory/allocated_gb 12.5 -> memory.allocated 1.25e10 By); a cumulative count (OOMs so far, the
daemon's records_in) is a monotonic sum, everything else a gauge. A rank's own value is never the
aggregate's series minus a label: a sum over all of a metric's series must mean something
(Prometheus's naming rule; OpenTelemetry's for attributes), so it has its own name, rank.<name>.
Two record names that map to one OpenTelemetry name (Loss and loss: the SDK takes instrument names
case-insensitively), or to one Prometheus name once a backend translates them (train.loss and
train_loss are both train_loss there; memory.allocated in By and a user's memory.allocated_bytes
both memory_allocated_bytes), do not share it: the later one gets _<8 hex digits of a hash of its
name> (counted in stats' names_renamed). A rank's value under a name the daemon's pollers or its
own records export (a user's system/cpu_percent) is always renamed so: it never joins their
series under other attributes.

The resource says which daemon this is, by OpenTelemetry's semantic conventions: service.name
telemetry-daemon, service.namespace the job (`job`, default the run name), service.instance.id a
UUIDv5 of the host, run, node rank and log directory (the same after a restart, so a restarted
daemon continues its series), host.name, and our own under llm_telemetry.*: run.name, node.rank
(a node daemon's). No bare `job` or `instance`: a Prometheus-compatible backend makes its own
job/instance labels from service.* (and `telemetry.*` attributes are OpenTelemetry's own SDK's).
OTEL_RESOURCE_ATTRIBUTES adds its attributes (deployment.environment=prod), but never `job` or
`instance`: they are left out, said once in the daemon's log.

A collector that does not answer costs this sink's thread (the exporter's timeout), never ingest.
An export that fails is counted (stats' export_failures, beside exports, and last_export_error:
`telemetry status`) and said in the daemon's log at the first failure and then at most every
FAILURE_LOG_INTERVAL_S, with the count; the SDK's own line per failed export is not printed.
OTEL_SDK_DISABLED=true (the SDK's switch for a whole process) leaves it exporting nothing: said in
the daemon's log and in stats' disabled_by (`telemetry status`).

Config (off by default):

    otlp:
      enabled: true
      endpoint: http://127.0.0.1:4318/v1/metrics     # a collector's OTLP/HTTP receiver
      export_interval_s: 10
      timeout_s: 10
      headers: {}                                     # e.g. an auth token for a hosted backend
      job: my-job                                     # service.namespace (default: the run name)

A second endpoint is a custom sink of this class (built as OtlpSink(log_dir=..., **options)):

    custom_sinks:
      - class: telemetry.daemon.sinks.otlp:OtlpSink
        options: {endpoint: "https://otlp.example.com/v1/metrics", run_name: my-run, headers: {...}}

(`run_name` defaults to the daemon's own default, the run directory's name: give it when the
daemon has --run-name.)
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from telemetry.daemon.sinks.base import Out, Sink
from telemetry.shared import catalogue
from telemetry.shared.bookkeeping import is_bookkeeping, severity
from telemetry.shared.numbers import is_int, is_number

log = logging.getLogger("telemetry.daemon.sinks.otlp")

EVENTS_COUNTER = "telemetry.events"
STEP = "training.step"
LAST_PROGRESS = "training.last_progress_time"
SERVICE_NAME = "telemetry-daemon"
# Our own resource attributes' namespace: `telemetry.*` is OpenTelemetry's (telemetry.sdk.*, set by
# the SDK on every resource).
ATTR_PREFIX = "llm_telemetry."
# service.instance.id is a UUIDv5 in this namespace (uuid5(NAMESPACE_URL, our package's name)).
INSTANCE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "llm-telemetry-sidecar")
# Distinct names kept (each an instrument and its latest values); beyond, values are counted, not kept.
MAX_NAMES = 20_000
_HASH_CHARS = 8
# Resource attributes the environment (OTEL_RESOURCE_ATTRIBUTES) may not set: a Prometheus-compatible
# backend's own labels, which it makes from service.*.
BACKEND_LABELS = ("job", "instance")
# A failed export is said at the first failure, then at most this often (with the count).
FAILURE_LOG_INTERVAL_S = 300.0
# The logger of the SDK's OTLP/HTTP metric exporter: a line per failed export, replaced by ours.
SDK_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.metric_exporter"
# Prometheus's name suffix for a UCUM unit (what a backend translating OTLP names appends).
_PROM_SUFFIX = {u.ucum: u.prometheus for u in catalogue.UNITS.values() if u.prometheus}
# Whose values an export record's kind holds: a rank's (metrics) or the daemon's (its pollers', its own).
_ORIGIN = {"metrics": "rank", "gpu": "poller", "system": "poller", "daemon": "self"}


def instance_id(host: str, run_name: str, node_rank: int | None, log_dir: str) -> str:
    """service.instance.id: what this daemon is, the same at every start of it."""
    node = "" if node_rank is None else str(node_rank)
    return str(uuid.uuid5(INSTANCE_NAMESPACE, "\0".join((host, run_name, node, log_dir))))


def backend_names(name: str, unit: str, cumulative: bool) -> tuple[str, ...]:
    """The names `name` has in a backend: its own, and Prometheus's translation of it (dots and
    any other character but [a-zA-Z0-9_] as _, the unit's suffix, _total for a monotonic sum)."""
    flat = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)
    suffix = _PROM_SUFFIX.get(unit, "")
    if suffix and not flat.endswith("_" + suffix):
        flat += "_" + suffix
    return (name, flat + "_total") if cumulative else (name, flat)


class _SdkLines(logging.Filter):
    """Takes the SDK exporter's line about a failed export (one per export) from its log: the
    export's sink counts the failure and says it, at most every FAILURE_LOG_INTERVAL_S."""

    current = threading.local()     # the sink whose export is running on this thread

    def filter(self, record: logging.LogRecord) -> bool:
        sink = getattr(self.current, "sink", None)
        if sink is None or record.levelno < logging.WARNING:
            return True
        sink.last_export_error = record.getMessage()[:500]
        return False


_SDK_LINES = _SdkLines()


class _Family:
    """One OpenTelemetry metric: its latest value per attribute set."""

    __slots__ = ("name", "unit", "doc", "cumulative", "series")

    def __init__(self, name: str, unit: str, doc: str, cumulative: bool) -> None:
        self.name, self.unit, self.doc, self.cumulative = name, unit, doc, cumulative
        self.series: dict[tuple, float] = {}


class OtlpSink(Sink):
    name = "otlp"

    def __init__(self, log_dir: str | Path | None = None, endpoint: str = "http://127.0.0.1:4318/v1/metrics",
                 run_name: str = "", job: str = "", export_interval_s: float = 10.0, timeout_s: float = 10.0,
                 headers: dict[str, str] | None = None, host: str = "", node_rank: int | None = None) -> None:
        from telemetry.daemon.config import OtlpConfig

        # The same checks as the daemon config's otlp: section (a custom sink's options too).
        OtlpConfig(endpoint=endpoint, export_interval_s=export_interval_s, timeout_s=timeout_s,
                   headers=dict(headers or {}))
        self.log_dir = str(Path(log_dir).resolve()) if log_dir is not None else ""
        self.endpoint = endpoint
        # The daemon's own default run name (telemetry.daemon.config): its run directory's name.
        self.run_name = run_name or (Path(self.log_dir).parent.name if self.log_dir else "") or "run"
        self.job = job or self.run_name
        self.export_interval_s = export_interval_s
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.host = host or socket.gethostname()
        self.node_rank = node_rank
        self.instance_id = instance_id(self.host, self.run_name, node_rank, self.log_dir)
        self._lock = threading.Lock()               # the SDK's reader thread reads what this one writes
        self._families: dict[str, _Family] = {}     # OpenTelemetry name -> its family
        self._name_of: dict[tuple, tuple | None] = {}   # (record name, per rank, taken) -> (family, scale, labels)
        # OpenTelemetry name -> the template that has it; the sink's own names are never a metric's.
        self._claimed: dict[str, tuple] = {
            claimed: ("the sink's own",)
            for name, unit, cumulative in ((EVENTS_COUNTER, "{event}", True), (STEP, "{step}", False),
                                           (LAST_PROGRESS, "s", False))
            for claimed in backend_names(name, unit, cumulative)}
        self._progress: dict[str, float] = {}       # STEP, LAST_PROGRESS
        self._provider = None
        self._meter = None
        self._events = None
        self.num_points = 0
        self.num_events = 0
        self.num_names_not_kept = 0
        self.num_names_renamed = 0
        self.num_exports = 0
        self.num_export_failures = 0
        self.last_export_error = ""
        self._failures_said = 0                     # export failures the log has said
        self._failure_said_at = -math.inf
        self.resource_refused: list[str] = []       # the environment's attributes left out
        self.disabled_by = ""                       # the environment turned the SDK off

    def resource_attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {"service.name": SERVICE_NAME, "service.namespace": self.job,
                                 "service.instance.id": self.instance_id, "host.name": self.host,
                                 ATTR_PREFIX + "run.name": self.run_name}
        if self.node_rank is not None:
            attrs[ATTR_PREFIX + "node.rank"] = self.node_rank
        return attrs

    def start(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import (Counter, Histogram, MeterProvider, ObservableCounter,
                                               ObservableGauge, ObservableUpDownCounter, UpDownCounter)
        from opentelemetry.sdk.metrics.export import (AggregationTemporality, MetricExportResult,
                                                      PeriodicExportingMetricReader)
        from opentelemetry.sdk.resources import Resource

        # Cumulative, as the docs promise, for every instrument: the exporter would otherwise take
        # OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE from the environment (delta sums).
        cumulative = {cls: AggregationTemporality.CUMULATIVE for cls in
                      (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter, ObservableGauge)}
        sink = self

        class Counted(OTLPMetricExporter):
            def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
                _SdkLines.current.sink = sink
                try:
                    result = super().export(metrics_data, timeout_millis=timeout_millis, **kwargs)
                except Exception as exc:    # an exporter that raises (older SDKs, a collector down)
                    sink.last_export_error = repr(exc)[:500]
                    result = MetricExportResult.FAILURE
                finally:
                    _SdkLines.current.sink = None
                sink._exported(result is MetricExportResult.SUCCESS)
                return result

        logging.getLogger(SDK_EXPORTER_LOGGER).addFilter(_SDK_LINES)
        if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            # The SDK's switch for the whole process: it then exports nothing, without a word.
            self.disabled_by = "OTEL_SDK_DISABLED=true"
            log.warning("otlp: OTEL_SDK_DISABLED=true in the daemon's environment: OpenTelemetry's SDK is off, "
                        "nothing is exported to %s", self.endpoint)
        exporter = Counted(endpoint=self.endpoint, headers=self.headers or None, timeout=self.timeout_s,
                           preferred_temporality=cumulative)
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=self.export_interval_s * 1000,
                                               export_timeout_millis=self.timeout_s * 1000)
        made = Resource.create(self.resource_attributes())    # with OTEL_RESOURCE_ATTRIBUTES'
        self.resource_refused = sorted(k for k in made.attributes if k in BACKEND_LABELS)
        if self.resource_refused:
            log.warning("otlp: resource attribute(s) %s from the environment (OTEL_RESOURCE_ATTRIBUTES) left "
                        "out: a backend makes its own job/instance labels from service.*",
                        ", ".join(self.resource_refused))
        resource = Resource({k: v for k, v in made.attributes.items() if k not in BACKEND_LABELS}, made.schema_url)
        self._provider = MeterProvider(resource=resource, metric_readers=[reader])
        self._meter = self._provider.get_meter("telemetry")
        self._events = self._meter.create_counter(EVENTS_COUNTER, unit="{event}",
                                                  description="events the ranks and the daemon's diagnosis sent")

        def progress(key: str):
            def observe(_options):
                with self._lock:
                    return [Observation(self._progress[key])] if key in self._progress else []
            return observe

        self._meter.create_observable_gauge(STEP, callbacks=[progress(STEP)], unit="{step}",
                                            description="the run's last aggregated step")
        self._meter.create_observable_gauge(LAST_PROGRESS, callbacks=[progress(LAST_PROGRESS)], unit="s",
                                            description="unix time of the step's last advance (a stalled run's "
                                                        "stops moving)")

    def _exported(self, ok: bool) -> None:
        """One export's result (the SDK reader's thread): failures counted, said now and then."""
        with self._lock:
            self.num_exports += 1
            if ok:
                return
            self.num_export_failures += 1
            now = time.monotonic()
            if now - self._failure_said_at < FAILURE_LOG_INTERVAL_S:
                return
            self._failure_said_at = now
            n, self._failures_said = self.num_export_failures - self._failures_said, self.num_export_failures
        log.warning("otlp: export to %s failed (%d failed of %d exports; %d since this was last said): %s; the "
                    "next export carries the latest values", self.endpoint, self.num_export_failures,
                    self.num_exports, n, self.last_export_error or "no reason given")

    def consume(self, batch: list[Out]) -> None:
        for o in batch:
            rec = o.record
            kind = o.kind
            if kind == "event":
                name = rec.get("name")
                if isinstance(name, str) and not is_bookkeeping(name):
                    self._events.add(1, {"name": name, "severity": severity(rec.get("data"))})
                    self.num_events += 1
                continue
            per_rank = False
            if kind == "metrics":
                per_rank = is_int(rec.get("rank"))
                attrs = (("rank", rec["rank"]),) if per_rank else ()
                if not per_rank:
                    self._note_step(rec)
            elif kind == "gpu":
                attrs = (("gpu", rec.get("gpu") if is_int(rec.get("gpu")) else 0), ("host", str(rec.get("host", ""))))
            elif kind == "system":
                attrs = (("host", str(rec.get("host", ""))),)
            elif kind == "daemon":
                attrs = ()
            else:
                continue
            values = rec.get("values")
            if isinstance(values, dict):
                self._keep(values, attrs, per_rank, _ORIGIN[kind])

    def _note_step(self, rec) -> None:
        step, t = rec.get("step"), rec.get("t")
        if not is_int(step) or not is_number(t):
            return
        with self._lock:
            if step > self._progress.get(STEP, -math.inf):
                self._progress[STEP] = step
                self._progress[LAST_PROGRESS] = float(t)

    def _family_of(self, key: str, per_rank: bool, taken: frozenset, origin: str = "rank") -> tuple | None:
        """(family, scale, labels) of a record's metric name; None once MAX_NAMES are kept. Called
        under the lock; a new family's instrument is made by the caller, outside it."""
        cache_key = (key, per_rank, taken, origin)
        hit = self._name_of.get(cache_key, False)
        if hit is not False:
            return hit
        m = catalogue.otel(key, taken, per_rank=per_rank)
        _, _, template = catalogue.split(key, taken)
        template = (origin, per_rank, tuple(template))
        name = m.name
        # A rank's value under a name the pollers' or the daemon's own records export: never theirs.
        owner = ("the daemon's",) if origin == "rank" and catalogue.daemons_own(key) else \
            self._owner(name, m.unit, m.cumulative, template)
        n = 0
        while owner is not None and owner != template:
            # Another record name has it: a suffix from this name's own hash, the same on every run.
            n += 1
            salt = key if n == 1 else f"{key}#{n}"
            name = m.name[:catalogue.MAX_OTEL_NAME - _HASH_CHARS - 1] + "_" + hashlib.sha1(
                salt.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
            owner = self._owner(name, m.unit, m.cumulative, template)
        fam = self._families.get(name)
        if fam is None:
            if len(self._families) >= MAX_NAMES:
                if len(self._name_of) < 4 * MAX_NAMES:
                    self._name_of[cache_key] = None
                return None
            fam = self._families[name] = _Family(name, m.unit, m.doc, m.cumulative)
            for claimed in backend_names(name, m.unit, m.cumulative):
                self._claimed.setdefault(claimed, template)
            self.num_names_renamed += name != m.name
        # A rank<r> segment's rank is the number a per-rank record's `rank` attribute is.
        out = (fam, m.scale, tuple((k, int(v) if k == "rank" else v) for k, v in m.labels.items()))
        if len(self._name_of) < 4 * MAX_NAMES:
            self._name_of[cache_key] = out
        return out

    def _owner(self, name: str, unit: str, cumulative: bool, template: tuple) -> tuple | None:
        """Who has `name` or a name a backend would make of it the same (None: no one; `template`
        itself: this name's own)."""
        owners = {self._claimed.get(n) for n in backend_names(name, unit, cumulative)} - {None}
        return template if owners == {template} else next((o for o in owners if o != template), None)

    def _keep(self, values: dict[str, Any], attrs: tuple, per_rank: bool, origin: str = "rank") -> None:
        new = []
        taken = frozenset(k for k, _ in attrs)
        with self._lock:
            for k, v in values.items():
                if not is_number(v) or not math.isfinite(v):
                    continue
                had = len(self._families)
                got = self._family_of(k, per_rank, taken, origin)
                if got is None:
                    self.num_names_not_kept += 1
                    continue
                fam, scale, labels = got
                if len(self._families) > had:
                    new.append(fam)
                fam.series[tuple(sorted(attrs + labels))] = float(v) * scale
                self.num_points += 1
        # Outside the lock: the SDK's reader may be collecting (its lock held) and calling observe().
        for fam in new:
            self._instrument(fam)

    def _instrument(self, fam: _Family) -> None:
        from opentelemetry.metrics import Observation

        def observe(_options, fam=fam):
            with self._lock:
                return [Observation(v, dict(a)) for a, v in fam.series.items()]

        make = self._meter.create_observable_counter if fam.cumulative else self._meter.create_observable_gauge
        make(fam.name, callbacks=[observe], unit=fam.unit, description=fam.doc)

    def close(self) -> None:
        if self._provider is not None:
            try:
                self._provider.force_flush(timeout_millis=int(self.timeout_s * 1000))
            finally:
                self._provider.shutdown()
                self._provider = None

    def stats(self) -> dict:
        return {"points": self.num_points, "events": self.num_events, "names": len(self._families),
                "names_not_kept": self.num_names_not_kept, "names_renamed": self.num_names_renamed,
                "exports": self.num_exports, "export_failures": self.num_export_failures,
                **({"last_export_error": self.last_export_error} if self.last_export_error else {}),
                **({"resource_refused": self.resource_refused} if self.resource_refused else {}),
                **({"disabled_by": self.disabled_by} if self.disabled_by else {}),
                "endpoint": self.endpoint, "instance_id": self.instance_id}
