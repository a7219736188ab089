"""Serve the latest values of a running job as Prometheus gauges (for Grafana).

    telemetry export-prometheus [--pub EP] [--port 9464] [--addr 127.0.0.1] [--allow-remote]
                                [--token-file FILE | --no-token] [--memory-mb 256] [--max-series 10000]

Subscribes to the daemon's PUB socket and keeps the latest value of every metric; a scrape of
http://ADDR:PORT/metrics reads them. Names are sanitised: train/loss -> telemetry_train_loss.
Where a record says where it is from, that becomes a label: GPU records carry host and gpu,
system records host; dataset/<name>/ and eval/<name>/ become a dataset label
(eval/copy/loss -> telemetry_eval_loss{dataset="copy"}); a rank is a label of its own family,
never of the total: gpu/rank3/memory_used_gb -> telemetry_gpu_rank_memory_used_gb{rank="3"}, a
per-rank metrics record's train/loss -> telemetry_rank_train_loss{rank="3"}. The daemon's own
counters drop their telemetry/ segment: telemetry/records_in -> telemetry_records_in_total.

Types and units come from the metric catalogue (telemetry/shared/catalogue.py), following
Prometheus's conventions: a time in seconds ends in _seconds (perf/step_time ->
telemetry_perf_step_time_seconds, perf/straggler_excess_s -> telemetry_perf_straggler_excess_seconds),
GB become bytes (gpu/memory_used_gb, 12.5 -> telemetry_gpu_memory_used_bytes 1.25e10), MB/s
bytes per second, MHz hertz, W watts, °C celsius, % stays _percent (as OpenTelemetry's exporter
writes it); a cumulative count (OOMs so far, XID errors, the daemon's records_in) is a counter,
exposed as <name>_total. A name the catalogue does not know (your own) is a gauge under its own
name, unchanged.
Events are counted (telemetry_events_total{name=..., severity=...}), once per event: the same
event sent by every rank (a checkpoint saved at step 100, each rank saying so) counts once. The
run's progress, named as the OTLP sink names it (training.step, training.last_progress_time, in a
backend's Prometheus translation): telemetry_training_step is the last aggregated step and
telemetry_training_last_progress_time_seconds the unix time it came, so a stalled run shows (its
gauges keep their last values); telemetry_last_record_timestamp_seconds is the newest record of
any kind (the daemon and its pollers still talking, also through a stall).

Runs: every series carries a `run` label, the run the daemon serves: its `daemon` records name it
(`run`, its --run-name), and before the first of them a rank's hello that names one (`run_name`);
the series kept before the run was known get the label then. Two runs scraped one after the other
are two series, never one; when another run is named (a new daemon on the same endpoint), the
previous run's series are let go. A rank's own series
(per-rank records, `rank<r>` segments) are removed when that rank says bye: they would otherwise
keep its last value for good.

The exposition is always valid: a name whose Prometheus name is already another's (train/loss
and train_loss, a-b and a.b, a user metric `training/step` and the exporter's own
telemetry_training_step) keeps
it if it came first, else gets `_<8 hex digits of a hash of the name>` appended (the same name
always gets the same suffix; counted in telemetry_exporter_names_renamed_total). Names longer
than MAX_NAME_CHARS are cut and suffixed the same way. A value a rank logs under a name the
daemon's pollers or its own records have (a user's system/cpu_percent) is always suffixed so, and
one name in records of two kinds (a rank's `step`, a GPU record's) is two families: a family's
series never mix a rank's values with a poller's under other labels.

Memory: the series kept are bounded in number (--max-series, default 10,000) and in bytes,
under --memory-mb (default 256 MB for the whole process). The first series to come are kept; a
value of a new series once either is full is dropped and counted in
telemetry_exporter_values_dropped_total (and said once on stderr).

Access: 127.0.0.1 is open to every local user, so /metrics asks for `Authorization: Bearer
<token>`: the token of --token-file FILE (Prometheus: `authorization: {credentials_file: FILE}`),
else a random one per start, printed once; --no-token serves every local user. A request
whose Host is not a loopback address or `localhost` is refused (DNS rebinding). An --addr
beyond loopback needs --allow-remote.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import urlsplit

from telemetry.consumers import httpaccess
from telemetry.consumers.httpaccess import HTTP_TIMEOUT_S, BoundedConnections
from telemetry.shared import catalogue
from telemetry.shared.bookkeeping import is_bookkeeping, severity
from telemetry.shared.numbers import is_int, is_number

DEFAULT_PORT = 9464  # the port OpenTelemetry's Prometheus exporter uses by convention
PREFIX = "telemetry_"
_BAD = re.compile(r"[^a-zA-Z0-9_]")
# Prometheus sets no limit on a name's length; a longer name than this is cut and made unique.
MAX_NAME_CHARS = 200
MAX_LABEL_VALUE_CHARS = 256
_HASH_CHARS = 8

DEFAULT_MEMORY_MB = 256
# What the process holds without any series (interpreter, pyzmq, prometheus_client, the SUB
# queue's records): measured by benchmarks/consumer_memory.py (benchmarks/RESULTS.md), with room.
BASELINE_BYTES = 80 << 20
# The series' own share of the rest; the other two thirds are for a scrape, which builds a
# sample object and a text line for every series (measured: more than twice the series' own bytes).
SERIES_SHARE = 1 / 3
# What one series costs beyond its strings: its key tuple, dict entries, the float; a family
# (a name) costs FAMILY_BYTES more (both measured with tracemalloc, as is what a scrape adds per
# series while it runs: benchmarks/RESULTS.md).
SERIES_BYTES = 250
FAMILY_BYTES = 500
# Series beyond a few thousand are a user's own names, each one a Prometheus series to store;
# a scrape of 10,000 is ~2 MB of text.
DEFAULT_MAX_SERIES = 10_000
# Events of one name and step counted once (see the module docstring): the last this many kept.
MAX_EVENTS_REMEMBERED = 4096

# The exporter's own series. A user metric that maps onto one of them (or onto a counter's
# _total/_created sample) is renamed, never merged with it.
STEP = PREFIX + "training_step"
LAST_PROGRESS = PREFIX + "training_last_progress_time_seconds"
LAST_RECORD_T = PREFIX + "last_record_timestamp_seconds"
EVENTS = PREFIX + "events"
SERIES_KEPT = PREFIX + "exporter_series"
BUDGET = PREFIX + "exporter_memory_budget_bytes"
VALUES_DROPPED = PREFIX + "exporter_values_dropped"
NAMES_RENAMED = PREFIX + "exporter_names_renamed"
_OWN_GAUGES = (STEP, LAST_PROGRESS, LAST_RECORD_T, SERIES_KEPT, BUDGET)
_OWN_COUNTERS = (EVENTS, VALUES_DROPPED, NAMES_RENAMED)
RESERVED_NAMES = frozenset(_OWN_GAUGES) | frozenset(c + s for c in _OWN_COUNTERS for s in ("", "_total", "_created"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    from telemetry.shared.endpoints import endpoint_arg

    p.add_argument("--pub", type=endpoint_arg, metavar="EP",
                   help="the daemon's PUB endpoint (default $TELEMETRY_PUB or ipc)")
    httpaccess.add_port_argument(p, DEFAULT_PORT)
    p.add_argument("--addr", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; beyond loopback needs --allow-remote)")
    httpaccess.add_remote_argument(p, "reads every metric with the token (with --no-token, without)")
    httpaccess.add_token_arguments(p, "can scrape", "a random one, printed; scrapes send 'Authorization: Bearer "
                                   "TOKEN', Prometheus with authorization: {credentials_file: FILE}")
    httpaccess.add_budget_arguments(p, DEFAULT_MEMORY_MB, DEFAULT_MAX_SERIES,
                                    "the series kept are bounded in bytes under it")


def _hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]


def _label_value(v: Any) -> str:
    """A label value Prometheus takes: valid UTF-8 (no lone surrogates), at most MAX_LABEL_VALUE_CHARS."""
    s = str(v)
    if len(s) > MAX_LABEL_VALUE_CHARS:
        s = s[:MAX_LABEL_VALUE_CHARS - _HASH_CHARS - 1] + "~" + _hash(s)
    return s.encode("utf-8", "replace").decode("utf-8")


def _map(name: str, taken: frozenset[str] = frozenset()) -> tuple[str, dict[str, str], str]:
    """(Prometheus name, labels, template) of a metric name; `taken`: label names the record
    itself sets (a segment is never made a label the record already has). The segments and
    labels are the OTLP sink's (catalogue.split); the daemon's own counters drop their telemetry/
    segment here (telemetry_x, not telemetry_telemetry_x). The template is the name with its
    label segments as placeholders: two names with one template are one family."""
    kept, labels, template = catalogue.split(name, taken)
    if len(kept) > 1 and kept[0] == "telemetry":
        kept = kept[1:]
    labels = {k: _label_value(v) for k, v in labels.items()}
    prom = PREFIX + _BAD.sub("_", "_".join(kept))
    tpl = "/".join(template)
    if len(prom) > MAX_NAME_CHARS:
        prom = prom[:MAX_NAME_CHARS - _HASH_CHARS - 1] + "_" + _hash(tpl)
    return prom, labels, tpl


class Typed:
    """What the catalogue says of a family: its Prometheus name, counter or gauge, the factor its
    values are multiplied by (GB -> bytes), and the help line."""

    __slots__ = ("name", "counter", "scale", "help")

    def __init__(self, name: str, counter: bool, scale: float, help: str) -> None:
        self.name, self.counter, self.scale, self.help = name, counter, scale, help


# Before a family's template, whose values it holds where a rank's and the daemon's could share a
# name: a poller's or the daemon's own record kind, or a rank's value under one of their names.
RANKS_TAG = "a rank's "
ORIGIN_TAGS = ("gpu: ", "system: ", "daemon: ", RANKS_TAG)


def typed(prom: str, template: str) -> Typed:
    """The catalogue's type and unit applied to a family (`prom`, its name so far, `template`,
    the metric name with {dataset}/rank{rank} placeholders; "per-rank " before a rank's own)."""
    for origin in ORIGIN_TAGS:      # whose family it is, not part of the name
        template = template.removeprefix(origin)
    name = template.removeprefix("per-rank ")
    name = "/".join(seg for seg in name.split("/") if seg != "rank{rank}")
    m = catalogue.unit_entry(name)                # perf/step_time_max: the unit of perf/step_time
    what = f"{template} from the telemetry daemon"
    if m is None:
        return Typed(prom, False, 1.0, f"latest value of {what}")
    help = f"{m.doc} ({what}{', unit ' + m.unit if m.unit else ''})"
    counter = m.cumulative
    if counter:
        prom = prom.removesuffix("_total")
    unit = catalogue.UNITS.get(m.unit)
    if unit is None or not unit.prometheus:
        return Typed(prom, counter, 1.0, help)
    suffix, scale, spelled = unit.prometheus, unit.scale, unit.spelled
    if suffix == "percent" and "_percent" in prom:        # system/cpu_percent_core0: said already
        return Typed(prom, counter, scale, help)
    for tail in spelled:
        if prom.endswith(tail):
            prom = prom[:-len(tail)]
            break
    # A cumulative time: telemetry/client_s -> telemetry_client_seconds_total (the exposition adds _total).
    return Typed(f"{prom}_{suffix}", counter, scale, help)


def metric_name(name: str) -> tuple[str, dict[str, str]]:
    """Prometheus name and labels for a metric name of the JSONL contract.

    dataset/<d>/x and eval/<d>/x -> telemetry_dataset_x / telemetry_eval_x {dataset="<d>"};
    a path segment rank<r> -> a rank label, and "rank" stays in the name
    (gpu/rank3/memory_used_gb -> telemetry_gpu_rank_memory_used_gb{rank="3"}), so a per-rank
    family never shares its name with the total (gpu/memory_used_gb has no rank label);
    telemetry/x (the daemon's own counters) -> telemetry_x, not telemetry_telemetry_x; units
    and counters as the catalogue says (gpu/memory_used_gb -> telemetry_gpu_memory_used_bytes,
    telemetry/records_in -> telemetry_records_in_total). Before a collision with another name
    is resolved (LatestValues does that).
    """
    prom, labels, template = _map(name)
    t = typed(prom, template)
    return (t.name + "_total" if t.counter else t.name), labels


class _Family:
    __slots__ = ("template", "typed", "series")

    def __init__(self, template: str, typed: Typed) -> None:
        self.template = template
        self.typed = typed
        self.series: dict[tuple[tuple[str, str], ...], float] = {}


class LatestValues:
    """Latest value per (name, labels), fed records; read by the collector at scrape time.

    Holds at most `max_series` series and `max_bytes` of them (first come, kept); values of new
    series beyond are counted in num_values_dropped."""

    def __init__(self, max_series: int = DEFAULT_MAX_SERIES,
                 max_bytes: int = int(((DEFAULT_MEMORY_MB << 20) - BASELINE_BYTES) * SERIES_SHARE),
                 budget_bytes: int = DEFAULT_MEMORY_MB << 20) -> None:
        self._lock = threading.Lock()
        self.max_series = max_series
        self.max_bytes = max_bytes
        self.budget_bytes = budget_bytes
        self.num_bytes = 0
        self.num_series = 0
        self._families: dict[str, _Family] = {}
        self._family_of: dict[str, str] = {}   # template -> its Prometheus name
        self._exposed: set[str] = set()         # the names the families' samples have (a counter's _total)
        self._events: dict[tuple[str, str], int] = {}   # (name, severity) -> how many
        self._events_seen: dict[tuple, None] = {}     # (name, step) of recent events: counted once
        self.run: str | None = None
        self._run_from_daemon = False   # a daemon record named the run: hellos no longer do
        self.step: int | None = None
        self.last_progress_t: float | None = None     # the record time of the step's last advance
        self.last_record_t: float | None = None
        self.num_records = 0
        self.num_values_dropped = 0
        self.num_names_renamed = 0
        self.on_first_drop = None   # called once, the first time a value is dropped

    def _room(self, cost: int) -> bool:
        """Whether one more series of `cost` bytes fits under both bounds."""
        return self.num_series < self.max_series and self.num_bytes + cost <= self.max_bytes

    def _family(self, prom: str, template: str, own_name: bool = False) -> str | None:
        """The Prometheus name of `template`'s family, claimed if new and there is room (None if not).
        own_name: never the name itself, always one suffixed (a rank's value under a poller's name)."""
        name = self._family_of.get(template)
        if name is not None:
            return name
        t = typed(prom, template)
        prom = t.name

        def exposed(name: str) -> tuple[str, ...]:   # a counter's samples are <name>_total
            return (name, name + "_total") if t.counter else (name,)

        candidate, n = prom, 0
        while (own_name and n == 0) or any(x in RESERVED_NAMES or x in self._exposed for x in exposed(candidate)):
            # Taken by another name: a suffix from this name's own hash, so it is the same on every run.
            n += 1
            salt = template if n == 1 else f"{template}#{n}"
            candidate = prom[:MAX_NAME_CHARS - _HASH_CHARS - 1] + "_" + _hash(salt)
        cost = FAMILY_BYTES + 2 * len(template) + len(candidate) + len(t.help)
        if not self._room(cost):
            return None
        self.num_bytes += cost
        self.num_names_renamed += candidate != prom
        t.name = candidate
        self._families[candidate] = _Family(template, t)
        self._family_of[template] = candidate
        self._exposed.update(exposed(candidate))
        return candidate

    def _set(self, prom: str, template: str, labels: dict[str, str], value: float, own_name: bool = False) -> None:
        if self.run is not None and "run" not in labels:
            labels["run"] = self.run
        name = self._family(prom, template, own_name)
        key = tuple(sorted((k, v) for k, v in labels.items() if v != ""))   # "" is no label in Prometheus
        if name is not None:
            fam = self._families[name]
            value *= fam.typed.scale
            series = fam.series
            if key in series:
                series[key] = value
                return
            cost = SERIES_BYTES + sum(len(k) + len(v) for k, v in key)
            if self._room(cost):
                self.num_bytes += cost
                self.num_series += 1
                series[key] = value
                return
        self._drop()

    def _drop(self) -> None:
        self.num_values_dropped += 1
        if self.num_values_dropped == 1 and self.on_first_drop is not None:
            self.on_first_drop()

    def consume(self, kind: str, rec: dict) -> None:
        base: dict[str, str] = {}
        per_rank = False
        if kind == "metrics":
            if isinstance(rec.get("rank"), int):
                base["rank"] = _label_value(rec["rank"])
                per_rank = True
        elif kind == "gpu":
            base = {"host": _label_value(rec.get("host", "")), "gpu": _label_value(rec.get("gpu", ""))}
        elif kind == "system":
            base = {"host": _label_value(rec.get("host", ""))}
        elif kind == "event":
            if is_bookkeeping(rec.get("name")):
                return
            name = _label_value(rec.get("name", ""))
            data = rec.get("data")
            step = data.get("step") if isinstance(data, dict) else None
            key_ev = (name, severity(data))
            with self._lock:
                if is_int(step):
                    key = (name, step)
                    if key in self._events_seen:
                        return                      # another rank's word for the same event
                    self._events_seen[key] = None
                    if len(self._events_seen) > MAX_EVENTS_REMEMBERED:
                        del self._events_seen[next(iter(self._events_seen))]
                if key_ev in self._events:
                    self._events[key_ev] += 1
                elif self._room(SERIES_BYTES + len(name) + len(key_ev[1])):
                    self.num_bytes += SERIES_BYTES + len(name) + len(key_ev[1])
                    self.num_series += 1
                    self._events[key_ev] = 1
                else:
                    self._drop()
            return
        elif kind == "hello":
            info = rec.get("info")
            run = info.get("run_name") if isinstance(info, dict) else None
            if isinstance(run, str) and run:
                with self._lock:
                    if not self._run_from_daemon:       # the daemon's word, once heard, is the run's
                        self._note_run(_label_value(run))
            return      # otherwise config, not a time series
        elif kind == "bye":
            if is_int(rec.get("rank")):
                with self._lock:
                    self._forget_rank(str(rec["rank"]))
            return
        elif kind != "daemon":
            return
        else:
            run = rec.get("run")            # the run the daemon serves (its --run-name)
            if isinstance(run, str) and run:
                with self._lock:
                    self._run_from_daemon = True
                    self._note_run(_label_value(run))
        values = rec.get("values")
        if not isinstance(values, dict):
            return
        taken = frozenset(base)
        with self._lock:
            self.num_records += 1
            t = rec.get("t")
            if is_number(t):
                self.last_record_t = float(t)
            step = rec.get("step")
            if kind == "metrics" and not per_rank and is_int(step) and (self.step is None or step > self.step):
                self.step = step
                self.last_progress_t = float(t) if is_number(t) else self.last_progress_t
            for k, v in values.items():
                if not is_number(v):
                    continue
                prom, labels, template = _map(str(k), taken)
                own_name = False
                if per_rank:  # one rank's own value (--per-rank): beside the aggregate, not in it
                    prom = PREFIX + "rank_" + prom[len(PREFIX):]
                    template = "per-rank " + template
                if kind != "metrics":       # a poller's or the daemon's own: never one family with a rank's
                    template = f"{kind}: {template}"
                elif catalogue.daemons_own(str(k)):  # a rank's value under their name: a name of its own
                    template, own_name = RANKS_TAG + template, True
                self._set(prom, template, {**base, **labels}, float(v), own_name)

    def _note_run(self, run: str) -> None:
        """The run a daemon record (or, before one, a hello) names: a label of every series, those
        already kept included; another run than before starts afresh."""
        if run == self.run:
            return
        if self.run is None:
            cost = len("run") + len(run)
            for fam in self._families.values():
                series = {}
                for key, value in fam.series.items():
                    if "run" not in dict(key):
                        if self.num_bytes + cost > self.max_bytes:   # no room for the label: let it go, counted
                            self.num_series -= 1
                            self.num_bytes -= SERIES_BYTES + sum(len(k) + len(v) for k, v in key)
                            self._drop()
                            continue
                        key = tuple(sorted(key + (("run", run),)))
                        self.num_bytes += cost
                    series[key] = value
                fam.series = series
        else:
            self._families.clear()
            self._family_of.clear()
            self._exposed.clear()
            self._events.clear()
            self._events_seen.clear()
            self.num_series = 0
            self.num_bytes = 0
            self.step = None
            self.last_progress_t = None
        self.run = run

    def _forget_rank(self, rank: str) -> None:
        """Remove the series of one rank (its label rank=<r>): it said bye."""
        for fam in self._families.values():
            gone = [key for key in fam.series if ("rank", rank) in key]
            for key in gone:
                del fam.series[key]
                self.num_series -= 1
                self.num_bytes -= SERIES_BYTES + sum(len(k) + len(v) for k, v in key)

    def snapshot(self) -> tuple[dict, dict, int | None, float | None, float | None]:
        with self._lock:
            gauges = {n: (f.typed, dict(f.series)) for n, f in self._families.items() if f.series}
            return gauges, dict(self._events), self.step, self.last_progress_t, self.last_record_t

    def own_counters(self) -> dict[str, float]:
        with self._lock:
            return {SERIES_KEPT: self.num_series, BUDGET: self.budget_bytes,
                    VALUES_DROPPED: self.num_values_dropped, NAMES_RENAMED: self.num_names_renamed}


class Collector:
    """prometheus_client custom collector: builds the families from LatestValues per scrape."""

    def __init__(self, latest: LatestValues) -> None:
        self.latest = latest

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        gauges, events, step, progress_t, last_t = self.latest.snapshot()
        for name in sorted(gauges):
            t, series = gauges[name]
            label_names = sorted({k for key in series for k, _ in key})
            family = CounterMetricFamily if t.counter else GaugeMetricFamily
            fam = family(name, _label_value(t.help), labels=label_names)
            for key, value in series.items():
                d = dict(key)
                fam.add_metric([d.get(n, "") for n in label_names], value)
            yield fam
        run = self.latest.run
        ev = CounterMetricFamily(EVENTS, "events seen since the exporter attached (one per event, not per rank)",
                                 labels=["name", "severity", "run"] if run is not None else ["name", "severity"])
        for (name, sev), n in sorted(events.items()):
            ev.add_metric([name, sev, run] if run is not None else [name, sev], n)
        yield ev
        # The run's own series carry the run too; the exporter's own (below) are not the run's.
        run_labels = ["run"] if run is not None else []
        for name, help, value in ((STEP, "last aggregated training step", step),
                                  (LAST_PROGRESS, "unix time of the step's last advance (a stalled run stops "
                                                  "moving it)", progress_t),
                                  (LAST_RECORD_T, "unix time of the newest record of any kind (the daemon and its "
                                                  "pollers: it moves through a stall)", last_t)):
            if value is not None:
                fam = GaugeMetricFamily(name, help, labels=run_labels)
                fam.add_metric([run] if run is not None else [], value)
                yield fam
        own = self.latest.own_counters()
        yield GaugeMetricFamily(SERIES_KEPT, "series this exporter keeps (--max-series bounds it)",
                                value=own[SERIES_KEPT])
        yield GaugeMetricFamily(BUDGET, "the exporter's memory budget (--memory-mb)", value=own[BUDGET])
        yield CounterMetricFamily(VALUES_DROPPED, "values of new series dropped: the series budget was full",
                                  value=own[VALUES_DROPPED])
        yield CounterMetricFamily(NAMES_RENAMED, "metric names given a hash suffix: their Prometheus name was "
                                                 "another's or too long", value=own[NAMES_RENAMED])


class MetricsServer(BoundedConnections, ThreadingHTTPServer):
    """GET /metrics (and /): the exposition, text format 0.0.4. With a token, only for
    `Authorization: Bearer <token>`; on loopback, only for a loopback Host header."""

    daemon_threads = True
    allow_reuse_address = True
    error_prefix = "telemetry export-prometheus"

    def __init__(self, addr: tuple[str, int], registry: Any, token: str | None = None,
                 allow_any_host: bool = False) -> None:
        super().__init__(addr, _Handler)
        self.registry = registry
        self.token = token
        self.allow_any_host = allow_any_host
        self.scrape_lock = threading.Lock()   # one exposition in memory at a time


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    timeout = HTTP_TIMEOUT_S      # an idle or stalled connection lets go of its thread
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:   # a line per scrape is noise
        pass

    def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

        srv = self.server
        if not srv.allow_any_host and not httpaccess.host_is_loopback(self.headers.get("Host", "")):
            self._send(HTTPStatus.FORBIDDEN, b"forbidden: not a loopback Host\n")
            return
        if urlsplit(self.path).path not in ("/", "/metrics"):
            self._send(HTTPStatus.NOT_FOUND, b"not found: the metrics are at /metrics\n")
            return
        if srv.token is not None and not httpaccess.token_matches(
                httpaccess.bearer_token(self.headers.get("Authorization")), srv.token):
            self._send(HTTPStatus.UNAUTHORIZED, b"unauthorized: send Authorization: Bearer <token>\n",
                       headers={"WWW-Authenticate": 'Bearer realm="telemetry"'})
            return
        with srv.scrape_lock:
            body = generate_latest(srv.registry)
        self._send(HTTPStatus.OK, body, CONTENT_TYPE_PLAIN_0_0_4)

    do_HEAD = do_GET


def serve(pub: str, port: int, addr: str = "127.0.0.1", token: str | None = None, allow_any_host: bool = False,
          memory_mb: int = DEFAULT_MEMORY_MB, max_series: int = DEFAULT_MAX_SERIES) -> tuple[Any, LatestValues, Any]:
    """Start the HTTP server on a thread; return (server, latest, registry). The caller feeds `latest`."""
    from prometheus_client import CollectorRegistry

    budget = memory_mb << 20
    latest = LatestValues(max_series=max_series, max_bytes=int(max(0, budget - BASELINE_BYTES) * SERIES_SHARE),
                          budget_bytes=budget)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(latest))
    server = MetricsServer((addr, port), registry, token=token, allow_any_host=allow_any_host)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="prometheus-http",
                     daemon=True).start()
    return server, latest, registry


def _fail(msg: str) -> int:
    print(f"telemetry export-prometheus: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.subscribe import AttachError, attach

    port, memory_mb, max_series = args.port, args.memory_mb, args.max_series
    try:
        token = httpaccess.token_from_args(args)
    except httpaccess.FlagError as exc:
        return _fail(str(exc))
    refusal = httpaccess.refuse_remote(args.addr, port, args.allow_remote,
                                       "reads every metric" + (" with its token" if token else " (--no-token)"))
    if refusal:
        return _fail(refusal)
    try:
        sub = attach("telemetry export-prometheus", args.pub)
    except AttachError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        server, latest, _ = serve(sub.endpoint, port, args.addr, token=token, allow_any_host=args.allow_remote,
                                  memory_mb=memory_mb, max_series=max_series)
    except (OSError, OverflowError) as exc:
        sub.close()
        print(httpaccess.cannot_listen("telemetry export-prometheus", args.addr, port, exc), file=sys.stderr)
        return 2    # the --port or --addr given, as the daemon's taken endpoint is
    latest.on_first_drop = lambda: print(
        f"telemetry export-prometheus: {latest.num_series:,} series kept (--max-series {max_series}, "
        f"--memory-mb {memory_mb}): values of new series are dropped from now on and counted in "
        f"{VALUES_DROPPED}_total", file=sys.stderr, flush=True)
    bound = server.server_address[1]
    # A random token is printed, once (a scraper's config needs it); a token of the user's own is not.
    access = (f"scrapes need the bearer token from {args.token_file}" if args.token_file
              else f"scrapes need Authorization: Bearer {token}, a random token for this start (--token-file "
                   f"FILE: one of your own)" if token
              else "no token: any local user can scrape" if httpaccess.is_loopback_addr(args.addr)
              else "no token: anyone who reaches the port can scrape")
    try:        # a Ctrl-C right after the line that says it serves (a test waits for it) ends it cleanly
        print(f"telemetry export-prometheus: serving http://{args.addr}:{bound}/metrics from {sub.endpoint} "
              f"({access}; at most {max_series:,} series, memory budget {memory_mb} MB)", flush=True)
        while True:
            for kind, rec in sub.records(timeout_ms=500):
                latest.consume(kind, rec)
    except KeyboardInterrupt:
        pass
    finally:
        sub.close()
        server.shutdown()
        server.server_close()
    return 0
