"""The no-head path at scale: N node daemons, each exporting OTLP/HTTP straight to the cluster's
time-series database, with no head daemon between them (docs/multinode.md, "Two paths").

Every node daemon is a real `telemetry daemon` process fed by R simulated ranks (real
TelemetryClients in --hosts processes, --values values a step, --rate steps a second) with the
OTLP sink pointed at a real VictoriaMetrics (testkit/victoria_metrics.py: the binary the dev
set-up installs, its OTLP receiver, Prometheus naming). Beside each node daemon runs its twin:
the same daemon, fed the same values by the same ranks, without the OTLP sink (--no-twins: none).
Measured from outside, over the steady window (the ranks' logging):

- per node daemon, what the OTLP sink costs: the daemon's CPU less its twin's (the whole sink:
  keeping the latest values on its thread and the SDK's periodic export), and, inside the daemon,
  the export alone: the CPU of the SDK reader's thread while it collects, encodes and posts
  (thread time, by MeasuredOtlpSink below), per export and per data point, and the bytes of
  each export's protobuf body (uncompressed, the exporter's default);
- the receiver: VictoriaMetrics' CPU (% of one core) and peak RSS, the series it holds;
- that every value arrived: each node daemon's last aggregated step (and with --per-rank each
  rank's last values) read back through VictoriaMetrics' Prometheus API by the documented names,
  exact in base units; every export the sinks made received (its request count, no request
  errors), and every data point they sent inserted.

    .venv/bin/python -m benchmarks.otlp_fleet                       # 8 nodes x 2 ranks, 60 s
    .venv/bin/python -m benchmarks.otlp_fleet --nodes 32 --rate 5 --seconds 60
    .venv/bin/python -m benchmarks.otlp_fleet --nodes 64 --no-twins --per-rank

The export interval is --export-interval (default 5 s, so that a one-minute run holds a dozen
exports; a cluster's is usually 10-60 s): an export's cost hardly depends on the interval (it
sends the latest value of each series), so the sink's CPU at another interval is its per-export
figure times the exports a second. Exit code 0 when every value arrived and every daemon is exact
(what each client sent == what its daemon took in + counted lost), else 1.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.head_scale import _cpu_s, _raise_nofile, _vm
from telemetry.daemon.sinks.otlp import OtlpSink

ROOT = Path(__file__).resolve().parent.parent
RUN, JOB = "otlp-fleet", "fleet"
# A rank's values a step, as a training loop logs them (names the catalogue knows, with their
# units and reductions, then the user's own), cut or padded to --values.
NAMED = ["train/loss", "train/lr", "train/grad_norm", "perf/step_time", "perf/tokens", "perf/forward_time",
         "perf/backward_time", "perf/optimizer_time", "perf/data_loading_time", "memory/allocated_gb",
         "memory/max_allocated_gb"]


class MeasuredOtlpSink(OtlpSink):
    """The OTLP sink, measured from inside (the benchmark's custom sink; a node daemon imports it
    from the repository root): its stats also carry the exports the SDK's periodic reader made,
    the CPU its thread spent in them (collect, encode, post; thread time, so not the wait for the
    receiver), the data points and the bytes of the protobuf bodies sent."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.num_exports = self.num_export_failures = self.num_export_points = self.num_export_bytes = 0
        self.export_cpu_s = 0.0

    def start(self) -> None:
        super().start()
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import _count_data_points
        from opentelemetry.sdk.metrics.export import MetricExportResult

        # One reader, one exporter: patched on the instances, so nothing else in the process changes.
        reader = self._provider._metric_readers[0]
        exporter = reader._exporter
        collect, export_batch = reader.collect, exporter._export_batch

        def timed_collect(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return collect(*args, **kwargs)
            finally:
                self.export_cpu_s += time.thread_time() - t0

        def counted_export(request):
            result = export_batch(request)
            self.num_exports += 1
            self.num_export_points += _count_data_points(request)
            self.num_export_bytes += request.ByteSize()
            self.num_export_failures += result != MetricExportResult.SUCCESS
            return result

        reader.collect = timed_collect
        exporter._export_batch = counted_export

    def stats(self) -> dict:
        return {**super().stats(), "exports": self.num_exports, "export_failures": self.num_export_failures,
                "export_points": self.num_export_points, "export_bytes": self.num_export_bytes,
                "export_cpu_s": round(self.export_cpu_s, 6)}


def rank_values(names: list[str], step: int, rank: int) -> dict[str, float]:
    """A rank's values at a step: each moves every step and differs by rank."""
    out = {}
    for i, name in enumerate(names):
        if name == "perf/tokens":
            out[name] = 4096
        elif name.startswith("memory/"):
            out[name] = 12.5 + rank + 0.001 * step
        else:
            out[name] = 1.0 / (step + i) + 0.01 * rank + 0.5 * i
    return out


def host_main(a: argparse.Namespace) -> int:
    """The ranks of nodes [first, first + count): R ranks a node, each a client on the node's
    daemon and one on its twin's, logging the same values to both."""
    from telemetry.client import TelemetryClient

    ingests = [e.split("|") for e in a.ingests.split(",")]
    clients = [(a.first + i, j == 1, r, TelemetryClient(ep, rank=r, linger_ms=30_000))
               for i, eps in enumerate(ingests) for j, ep in enumerate(eps) for r in range(a.ranks)]
    names = value_names(a.values)
    print("ready", flush=True)
    sys.stdin.readline()          # the parent says go once every host is ready
    steps = int(a.seconds * a.rate)
    start = time.monotonic()
    for step in range(1, steps + 1):
        delay = start + (step - 1) / a.rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for _, _, r, tm in clients:
            tm.log(step, rank_values(names, step, r))
    behind = time.monotonic() - (start + (steps - 1) / a.rate)     # after the last step was due
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda c: c[3].close(timeout_s=30), clients))
    print(json.dumps({"behind_s": behind, "stats": [[node, twin, r, tm.stats()] for node, twin, r, tm in clients]}),
          flush=True)
    return 0


def value_names(n: int) -> list[str]:
    return (NAMED + [f"model/v{i}" for i in range(max(0, n - len(NAMED)))])[:n]


def expected_series(rec: dict, per_rank: bool) -> dict[tuple[str, str | None], float]:
    """What VictoriaMetrics must hold for a metrics record: (Prometheus name, rank label) -> value,
    by the documented naming (docs/metrics.md: the exporter's name without its telemetry_
    prefix; a rank's own series under rank_<name>) in base units."""
    from telemetry.consumers.prometheus import metric_name
    from telemetry.shared import catalogue

    out = {}
    for k, v in rec["values"].items():
        name = metric_name(k)[0]
        if not k.startswith("telemetry/"):
            name = name.removeprefix("telemetry_")
        scale = catalogue.otel(k, frozenset(), per_rank=per_rank).scale
        out[("rank_" + name, str(rec["rank"])) if per_rank else (name, None)] = v * scale
    return out


def check_arrived(vm, instance_id: str, last: dict, ranks_last: list[dict]) -> tuple[int, list]:
    """(series VictoriaMetrics holds for this daemon, [what is missing or wrong])."""
    got = {}
    for labels, values in vm.export(f'{{service_instance_id="{instance_id}"}}'):
        got[(labels["__name__"], labels.get("rank"))] = values[-1]
    wrong = []
    want = expected_series(last, False)
    for rec in ranks_last:
        want.update(expected_series(rec, True))
    want[("training_step", None)] = last["step"]
    for key, v in want.items():
        g = got.get(key)
        if g is None or not math.isclose(g, v, rel_tol=1e-9, abs_tol=1e-12):
            wrong.append((key, v, g))
    return len(got), wrong


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8, help="node daemons exporting (default 8)")
    ap.add_argument("--ranks", type=int, default=2, help="simulated ranks per node (default 2)")
    ap.add_argument("--values", type=int, default=20, help="values a rank logs a step (default 20)")
    ap.add_argument("--rate", type=float, default=5.0, help="steps a second (default 5)")
    ap.add_argument("--seconds", type=float, default=60.0, help="the ranks' logging (default 60)")
    ap.add_argument("--export-interval", type=float, default=5.0, help="the sink's export_interval_s (default 5)")
    ap.add_argument("--per-rank", action="store_true", help="the daemons' --per-rank: each rank's own series too")
    ap.add_argument("--no-twins", action="store_true", help="no twin daemons without the sink (no whole-sink figure)")
    ap.add_argument("--hosts", type=int, default=4, help="processes that hold the ranks (default 4)")
    ap.add_argument("--host", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ingests", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.host:
        return host_main(a)
    for name in ("nodes", "ranks", "values", "hosts"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if a.rate <= 0 or a.seconds <= 0 or not 0 < a.export_interval < a.seconds:
        ap.error("--rate and --seconds must be > 0, --export-interval between 0 and --seconds")
    from testkit.victoria_metrics import VictoriaMetrics, skip_reason

    if (why := skip_reason()) is not None:
        print(f"otlp-fleet: {why}", file=sys.stderr)
        return 2
    _raise_nofile()
    work = Path(tempfile.mkdtemp(prefix="otlp-fleet-", dir="/tmp"))
    print(f"otlp-fleet: {a.nodes} node daemons x {a.ranks} ranks x {a.values} values, {a.rate:g} steps/s for "
          f"{a.seconds:g} s, export every {a.export_interval:g} s; work dir {work}", file=sys.stderr, flush=True)
    vm = VictoriaMetrics(work / "vm-data")
    started: dict[str, list] = {"daemons": [], "hosts": []}
    try:
        return measure(a, vm, work, started)
    finally:
        for p in started["hosts"]:
            if p.poll() is None:
                p.kill()
        for d in started["daemons"]:
            d.kill()
            d.cleanup()
        vm.close()


def measure(a: argparse.Namespace, vm, work: Path, started: dict[str, list]) -> int:
    """The run itself; what it starts goes into `started` (main stops it whatever happens)."""
    from testkit.faults import Endpoints, launch

    load_before = os.getloadavg()
    base = {"pollers": {"nvml_enabled": False}, "daemon_record_interval_s": 5}
    sink = {"class": "benchmarks.otlp_fleet:MeasuredOtlpSink",
            "options": {"endpoint": vm.otlp_endpoint, "run_name": RUN, "job": JOB,
                        "export_interval_s": a.export_interval}}
    extra = ("--run-name", RUN)
    eps = [Endpoints() for _ in range(a.nodes)]
    twin_eps = [] if a.no_twins else [Endpoints() for _ in range(a.nodes)]
    nodes = [launch(work / f"node{i}", eps[i], config={**base, "custom_sinks": [sink]}, extra=extra,
                    world_size=a.ranks, per_rank=a.per_rank, ready_timeout_s=None) for i in range(a.nodes)]
    started["daemons"] += nodes
    twins = [launch(work / f"twin{i}", twin_eps[i], config=base, extra=extra, world_size=a.ranks,
                    per_rank=a.per_rank, ready_timeout_s=None) for i in range(len(twin_eps))]
    started["daemons"] += twins
    t0 = time.monotonic()
    for d in nodes + twins:
        d.wait_ready(600)           # a hang detector: many daemons importing at once on a small box
    print(f"otlp-fleet: {len(nodes) + len(twins)} daemons ready in {time.monotonic() - t0:.0f} s",
          file=sys.stderr, flush=True)
    per = math.ceil(a.nodes / a.hosts)
    hosts = started["hosts"]
    for first in range(0, a.nodes, per):
        pairs = [eps[i].ingest + ("" if a.no_twins else "|" + twin_eps[i].ingest)
                 for i in range(first, min(first + per, a.nodes))]
        hosts.append(subprocess.Popen(
            [sys.executable, "-m", "benchmarks.otlp_fleet", "--host", "--ingests", ",".join(pairs), "--first",
             str(first), "--ranks", str(a.ranks), "--rate", str(a.rate), "--seconds", str(a.seconds), "--values",
             str(a.values)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for p in hosts:
        line = p.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"otlp-fleet: a rank host did not start ({line!r})")
    time.sleep(2.0)                 # every hello in
    pids = [vm.proc.pid] + [d.proc.pid for d in nodes + twins]
    cpu0, w0 = [_cpu_s(p) for p in pids], time.monotonic()
    for p in hosts:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [json.loads(p.stdout.readline()) for p in hosts]
    for p in hosts:
        p.wait(300)
    cpu1, w1 = [_cpu_s(p) for p in pids], time.monotonic()
    rss = [_vm(p, "VmHWM") for p in pids]
    load_during = os.getloadavg()
    span = w1 - w0
    print(f"otlp-fleet: ranks done ({span:.0f} s); draining", file=sys.stderr, flush=True)
    with ThreadPoolExecutor(8) as pool:
        finals = list(pool.map(lambda d: d.drain(timeout_s=300), nodes + twins))
    node_finals, twin_finals = finals[:a.nodes], finals[a.nodes:]

    # -- exact per daemon: what each client sent == its daemon took in + counted lost ---------------
    inexact = []
    for o in outs:
        for node, is_twin, r, s in o["stats"]:
            got = (twin_finals if is_twin else node_finals)[node]["per_rank"].get(str(r), {})
            accounted = got.get("received", 0) + got.get("refused", 0) + got.get("lost", 0) \
                - got.get("dropped_by_client", 0) + s["dropped"]
            if accounted != s["seq"]:
                inexact.append((node, "twin" if is_twin else "node", r, s["seq"], got))

    # -- every value arrived ---------------------------------------------------------------------
    n_steps = int(a.seconds * a.rate)
    series, not_arrived = [], {}
    for i, d in enumerate(nodes):
        last = d.read_jsonl("metrics", aggregated=True)[-1]
        ranks_last = []
        if a.per_rank:
            by_rank = {}
            for r in d.read_jsonl("metrics", aggregated=False):
                by_rank[r["rank"]] = r
            ranks_last = list(by_rank.values())
        # What was just ingested may take VictoriaMetrics a moment to serve even after its force_flush:
        # read again until it is all there (a generous hang detector, not a figure).
        deadline = time.monotonic() + 60
        while True:
            n, wrong = check_arrived(vm, node_finals[i]["sinks"]["otlp"]["instance_id"], last, ranks_last)
            if not wrong or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        series.append(n)
        if wrong or last["step"] != n_steps:
            not_arrived[i] = {"last_step": last["step"], "wrong": wrong[:3], "num_wrong": len(wrong)}
    own = vm.own_metrics()
    otlp_path = '{path="/opentelemetry/v1/metrics", protocol="opentelemetry"}'
    total_series = int(next(iter(vm.query('count({__name__=~".+"})').values()), 0))

    sinks = [f["sinks"]["otlp"] for f in node_finals]
    exports = sum(s["exports"] for s in sinks)
    points = sum(s["export_points"] for s in sinks)
    export_cpu = sum(s["export_cpu_s"] for s in sinks)
    node_cpu = [100 * (cpu1[1 + i] - cpu0[1 + i]) / span for i in range(a.nodes)]

    def median(xs):
        return sorted(xs)[len(xs) // 2]

    result = {
        "nodes": a.nodes, "ranks_per_node": a.ranks, "values_per_rank": a.values, "rate": a.rate,
        "seconds": a.seconds, "export_interval_s": a.export_interval, "per_rank": a.per_rank,
        "machine": f"{os.cpu_count()} CPUs", "load_average_before": [round(x, 2) for x in load_before],
        "load_average_at_end": [round(x, 2) for x in load_during],
        "window_s": round(span, 1),
        "daemons_inexact": len(inexact), "daemons_inexact_sample": inexact[:3],
        "exports": exports, "export_failures": sum(s["export_failures"] for s in sinks),
        "data_points_per_export": round(points / max(exports, 1), 1),
        "bytes_per_export": round(sum(s["export_bytes"] for s in sinks) / max(exports, 1)),
        "bytes_per_data_point": round(sum(s["export_bytes"] for s in sinks) / max(points, 1), 1),
        "export_cpu_ms_per_export": round(1000 * export_cpu / max(exports, 1), 2),
        "export_cpu_us_per_data_point": round(1e6 * export_cpu / max(points, 1), 1),
        "node_cpu_percent_of_a_core_median": round(median(node_cpu), 2),
        "node_rss_mb_peak_median": round(median(rss[1:1 + a.nodes]), 1),
        "receiver_cpu_percent_of_a_core": round(100 * (cpu1[0] - cpu0[0]) / span, 1),
        "receiver_rss_mb_peak": round(rss[0]),
        "receiver_series": total_series,
        "receiver_series_per_node_median": median(series),
        "receiver_requests": int(own.get("vm_http_requests_total" + otlp_path, -1)),
        "receiver_request_errors": int(own.get("vm_http_request_errors_total" + otlp_path, -1)),
        "receiver_rows_inserted": int(own.get('vm_rows_inserted_total{type="opentelemetry"}', -1)),
        "data_points_sent": points,
        "nodes_with_values_missing_or_wrong": len(not_arrived),
        "not_arrived_sample": dict(list(not_arrived.items())[:2]),
        "hosts_behind_s": round(max(o["behind_s"] for o in outs), 2),
    }
    if twins:
        twin_cpu = [100 * (cpu1[1 + a.nodes + i] - cpu0[1 + a.nodes + i]) / span for i in range(a.nodes)]
        diff = [n - t for n, t in zip(node_cpu, twin_cpu)]
        result |= {"twin_cpu_percent_of_a_core_median": round(median(twin_cpu), 2),
                   "sink_cpu_percent_of_a_core_mean": round(sum(diff) / len(diff), 2),
                   "sink_cpu_percent_of_a_core_median": round(median(diff), 2),
                   "sink_rss_mb_median": round(median([n - t for n, t in zip(
                       rss[1:1 + a.nodes], rss[1 + a.nodes:])]), 1)}
    # The export alone at the run's interval: its cost per export times the exports a second.
    result["export_cpu_percent_of_a_core_per_node"] = round(100 * export_cpu / max(exports, 1) / a.export_interval, 3)
    print(json.dumps(result, indent=1))
    arrived = (not not_arrived and result["receiver_requests"] == exports and result["receiver_request_errors"] == 0
               and result["receiver_rows_inserted"] == points and not result["export_failures"])
    return 0 if arrived and not inexact else 1


if __name__ == "__main__":
    raise SystemExit(main())
