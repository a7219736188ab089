"""Serve the latest values of a running job as Prometheus gauges (for Grafana).

    telemetry export-prometheus [--pub EP] [--port 9464] [--addr 127.0.0.1]

Subscribes to the daemon's PUB socket and keeps the latest value of every metric; a scrape of
http://ADDR:PORT/metrics reads them. Names are sanitised: train/loss -> telemetry_train_loss.
Where a record says where it is from, that becomes a label: GPU records carry host and gpu,
system records host; dataset/<name>/ and eval/<name>/ become a dataset label
(eval/copy/loss -> telemetry_eval_loss{dataset="copy"}); a rank is a label of its own family,
never of the total: gpu/rank3/memory_used_gb -> telemetry_gpu_rank_memory_used_gb{rank="3"}, a
per-rank metrics record's train/loss -> telemetry_rank_train_loss{rank="3"}. The daemon's own
counters drop their telemetry/ segment: telemetry/records_in -> telemetry_records_in.
Events are counted (telemetry_events_total{name=...}); telemetry_step is the last step and
telemetry_last_record_timestamp_seconds says whether the run is still talking.
"""
from __future__ import annotations

import argparse
import re
import sys
import threading
from typing import Any, Iterator

DEFAULT_PORT = 9464  # the port OpenTelemetry's Prometheus exporter uses by convention
PREFIX = "telemetry_"
_BAD = re.compile(r"[^a-zA-Z0-9_]")
_RANK_SEGMENT = re.compile(r"^rank(\d+)$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pub", metavar="EP", help="the daemon's PUB endpoint (default $TELEMETRY_PUB or ipc)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT}; 0 = any free)")
    p.add_argument("--addr", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")


def metric_name(name: str) -> tuple[str, dict[str, str]]:
    """Prometheus name and labels for a metric name of the JSONL contract.

    dataset/<d>/x and eval/<d>/x -> telemetry_dataset_x / telemetry_eval_x {dataset="<d>"};
    a path segment rank<r> -> a rank label, and "rank" stays in the name
    (gpu/rank3/memory_used_gb -> telemetry_gpu_rank_memory_used_gb{rank="3"}), so a per-rank
    family never shares its name with the total (gpu/memory_used_gb has no rank label);
    telemetry/x (the daemon's own counters) -> telemetry_x, not telemetry_telemetry_x.
    """
    parts = name.split("/")
    labels: dict[str, str] = {}
    if len(parts) >= 3 and parts[0] in ("dataset", "eval"):
        labels["dataset"] = parts[1]
        parts = [parts[0], *parts[2:]]
    if parts[0] == "telemetry" and len(parts) > 1:
        parts = parts[1:]
    kept = []
    for i, seg in enumerate(parts):
        m = _RANK_SEGMENT.match(seg)
        if m and i > 0:  # "rank3" inside a name is a label, never a metric of its own
            labels["rank"] = m.group(1)
            kept.append("rank")
        else:
            kept.append(seg)
    base = _BAD.sub("_", "_".join(kept))
    if base[:1].isdigit():
        base = "_" + base
    return PREFIX + base, labels


class LatestValues:
    """Latest value per (name, labels), fed records; read by the collector at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gauges: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        self._events: dict[str, int] = {}
        self.step: int | None = None
        self.last_record_t: float | None = None
        self.num_records = 0

    def consume(self, kind: str, rec: dict) -> None:
        base: dict[str, str] = {}
        per_rank = False
        if kind == "metrics":
            if isinstance(rec.get("rank"), int):
                base["rank"] = str(rec["rank"])
                per_rank = True
        elif kind == "gpu":
            base = {"host": str(rec.get("host", "")), "gpu": str(rec.get("gpu", ""))}
        elif kind == "system":
            base = {"host": str(rec.get("host", ""))}
        elif kind == "event":
            with self._lock:
                name = str(rec.get("name", ""))
                self._events[name] = self._events.get(name, 0) + 1
            return
        elif kind != "daemon":
            return  # hello: config, not a time series
        values = rec.get("values")
        if not isinstance(values, dict):
            return
        with self._lock:
            self.num_records += 1
            t = rec.get("t")
            if isinstance(t, (int, float)):
                self.last_record_t = float(t)
            step = rec.get("step")
            if kind == "metrics" and "rank" not in rec and isinstance(step, int):
                self.step = step if self.step is None else max(self.step, step)
            for k, v in values.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                name, labels = metric_name(k)
                if per_rank:  # one rank's own value (--per-rank): beside the aggregate, not in it
                    name = PREFIX + "rank_" + name[len(PREFIX):]
                key = tuple(sorted({**base, **labels}.items()))
                self._gauges.setdefault(name, {})[key] = float(v)

    def snapshot(self) -> tuple[dict, dict, int | None, float | None]:
        with self._lock:
            return ({n: dict(s) for n, s in self._gauges.items()}, dict(self._events), self.step, self.last_record_t)


class Collector:
    """prometheus_client custom collector: builds the families from LatestValues per scrape."""

    def __init__(self, latest: LatestValues) -> None:
        self.latest = latest

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        gauges, events, step, last_t = self.latest.snapshot()
        for name in sorted(gauges):
            series = gauges[name]
            label_names = sorted({k for key in series for k, _ in key})
            fam = GaugeMetricFamily(name, "latest value from the telemetry daemon", labels=label_names)
            for key, value in series.items():
                d = dict(key)
                fam.add_metric([d.get(n, "") for n in label_names], value)
            yield fam
        ev = CounterMetricFamily(PREFIX + "events", "events seen since the exporter attached", labels=["name"])
        for name, n in sorted(events.items()):
            ev.add_metric([name], n)
        yield ev
        if step is not None:
            yield GaugeMetricFamily(PREFIX + "step", "last aggregated training step", value=step)
        if last_t is not None:
            yield GaugeMetricFamily(PREFIX + "last_record_timestamp_seconds",
                                    "unix time of the newest record (a stalled run stops moving it)", value=last_t)


def serve(pub: str, port: int, addr: str = "127.0.0.1") -> tuple[Any, LatestValues, Any]:
    """Start the HTTP server; return (server, latest, registry). The caller feeds `latest`."""
    from prometheus_client import CollectorRegistry, start_http_server

    latest = LatestValues()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(latest))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server, latest, registry


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.subscribe import AttachError, attach

    try:
        sub = attach("telemetry export-prometheus", args.pub)
    except AttachError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        server, latest, _ = serve(sub.endpoint, args.port, args.addr)
    except OSError as exc:
        sub.close()
        print(f"telemetry export-prometheus: cannot listen on {args.addr}:{args.port}: {exc}", file=sys.stderr)
        return 1
    port = server.server_address[1]
    print(f"telemetry export-prometheus: serving http://{args.addr}:{port}/metrics from {sub.endpoint}", flush=True)
    try:
        while True:
            for kind, rec in sub.records(timeout_ms=500):
                latest.consume(kind, rec)
    except KeyboardInterrupt:
        pass
    finally:
        sub.close()
        server.shutdown()
    return 0
