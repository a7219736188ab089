"""As many real node daemons as this box holds (issue 33 item 2): N node daemons, each the
`telemetry daemon --forward` of a job's node, fed by its own R simulated ranks (real
TelemetryClients, M values a step, --rate steps a second) and forwarding to one head daemon over
TCP on loopback with CURVE (each node its own key pair, the head allowing each, as a job sets it
up: docs/multinode.md). Measured from outside:

- exact at every level: per rank, what the client tried == its node took in + counted lost
  (+ what the client itself dropped); per node, what its forwarder tried == the head took in +
  counted lost + what the forwarder counted (dropped; unsent on a link that never completed its
  handshake), or within its "not confirmed" bound when its close ran out of linger; every step
  written once by every node and by the head, none without a node;
- the cost per node daemon (CPU, % of one core over the steady window; RSS peak), the head's,
  and the latency from a step's records leaving the ranks to its aggregate on the head's PUB;
- with --kill-node, a node daemon SIGKILLed at a step (issue 33 item 3): when the head names the
  node stopped, and which of the head's steps lack it (the others' exactness is kept as above);
- with --stop-node, a node daemon SIGSTOPped at a step for --stop-s and continued (issue 33 item
  3): when the head names it (its link closed by the head's heartbeats), that it links again, and
  that what it forwarded is still accounted exactly;
- with --slow-ranks, attribution end to end (issue 33 item 4): every rank reports the same phase
  timings except those ranks, whose forward is longer by --slow-by of a step from step --slow-from on; each
  straggler finding (diagnosis/straggler) of every node daemon and of the head, with its step.

    .venv/bin/python -m benchmarks.node_fleet --nodes 128 --ranks 8 --rate 1 --seconds 60
    .venv/bin/python -m benchmarks.node_fleet --nodes 128 --rate 2 --seconds 110 --slow-ranks 517 --slow-from 201
    .venv/bin/python -m benchmarks.node_fleet --nodes 128 --rate 1 --seconds 60 --kill-node 77 --kill-at-step 20
    .venv/bin/python -m benchmarks.node_fleet --nodes 128 --rate 1 --seconds 90 --stop-node 40 --stop-at-step 20 --stop-s 30

The ranks run in --hosts processes (each holds the clients of nodes/hosts nodes); their CPU is
theirs, not the daemons'. The node daemons start together, then the ranks; at the end the nodes
drain (their forwarders flush to the head), then the head.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.head_scale import StepArrivals, _cpu_s, _raise_nofile, _vm

ROOT = Path(__file__).resolve().parent.parent
# What every rank reports as its phases, as fractions of its step (1 / --rate s); a --slow-ranks
# rank's forward is --slow-by of a step longer (the diagnosis looks at an excess of at least 15 %
# of the step: straggler_view.CAUSE_MIN_FRACTION).
PHASES = {"perf/data_loading_time": 0.04, "perf/forward_time": 0.3, "perf/backward_time": 0.6,
          "perf/optimizer_time": 0.06}


def host_main(a: argparse.Namespace) -> int:
    """The ranks of nodes [first, first + count): R clients each, on that node's ingest."""
    from telemetry.client import TelemetryClient

    ingests = a.ingests.split(",")
    clients = [TelemetryClient(ingests[i], rank=(a.first + i) * a.ranks + r, linger_ms=30_000)
               for i in range(a.count) for r in range(a.ranks)]
    names = [f"m/v{i}" for i in range(a.metrics - len(PHASES) - 2)]
    slow = {int(r) for r in a.slow_ranks.split(",") if r}
    print("ready", flush=True)
    sys.stdin.readline()          # the parent says go once every host is ready
    steps = int(a.seconds * a.rate)
    start = time.monotonic()
    for step in range(1, steps + 1):
        delay = start + (step - 1) / a.rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for tm in clients:
            values = {name: step * 0.001 + i for i, name in enumerate(names)}
            values.update({k: f / a.rate for k, f in PHASES.items()})
            if tm.rank in slow and step >= a.slow_from:
                values["perf/forward_time"] += a.slow_by / a.rate
            values["perf/step_time"] = 1.0 / a.rate
            values["perf/tokens"] = 4096
            tm.log(step, values)
    behind = time.monotonic() - (start + (steps - 1) / a.rate)     # after the last step was due
    with ThreadPoolExecutor(len(clients)) as pool:     # at once: a killed node's ranks wait out their linger
        list(pool.map(lambda tm: tm.close(timeout_s=30), clients))
    print(json.dumps({"behind_s": behind, "stats": {str(tm.rank): tm.stats() for tm in clients}}), flush=True)
    return 0


def _gone_nan(fn, *args) -> float:
    try:
        return fn(*args)
    except OSError:                 # a killed daemon, reaped
        return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--ranks", type=int, default=8, help="simulated ranks per node")
    ap.add_argument("--rate", type=float, default=1.0, help="steps a second")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--metrics", type=int, default=50, help="values a rank logs a step")
    ap.add_argument("--hosts", type=int, default=8, help="processes that hold the ranks")
    ap.add_argument("--slow-ranks", default="", help="global ranks whose forward is slower, e.g. 517 or 8,9,10")
    ap.add_argument("--slow-from", type=int, default=1, help="the first slow step")
    ap.add_argument("--slow-by", type=float, default=0.3, help="more forward, as a fraction of the step")
    ap.add_argument("--kill-node", type=int, default=-1, help="SIGKILL this node's daemon at --kill-at-step")
    ap.add_argument("--kill-at-step", type=int, default=10)
    ap.add_argument("--stop-node", type=int, default=-1, help="SIGSTOP this node's daemon at --stop-at-step")
    ap.add_argument("--stop-at-step", type=int, default=10)
    ap.add_argument("--stop-s", type=float, default=30.0, help="then SIGCONT it this much later")
    ap.add_argument("--step-timeout", type=float, default=10.0,
                    help="every daemon's aggregator.step_timeout_s (the default: 10 s)")
    ap.add_argument("--host", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ingests", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.host:
        return host_main(a)
    for name in ("nodes", "ranks", "hosts", "metrics"):
        if getattr(a, name) < (len(PHASES) + 3 if name == "metrics" else 1):
            ap.error(f"--{name} {getattr(a, name)} is too small")
    if a.rate <= 0 or a.seconds <= 0:
        ap.error("--rate and --seconds must be > 0")
    if a.kill_node >= a.nodes or not 1 <= a.kill_at_step <= a.seconds * a.rate:
        ap.error("--kill-node must be one of the nodes and --kill-at-step one of the steps")
    if a.stop_node >= a.nodes or a.stop_node >= 0 and (a.stop_node == a.kill_node or a.stop_s <= 0 or
                                                       not 1 <= a.stop_at_step <= a.seconds * a.rate):
        ap.error("--stop-node must be another node than --kill-node, --stop-at-step one of the steps, --stop-s > 0")
    _raise_nofile()
    from testkit.faults import Endpoints, free_port, launch, node_keys, wait_forwarded

    work = Path(tempfile.mkdtemp(prefix="node-fleet-", dir="/tmp"))
    print(f"node-fleet: {a.nodes} node daemons x {a.ranks} ranks, {a.rate:g} steps/s for {a.seconds:g} s; "
          f"work dir {work}", file=sys.stderr, flush=True)
    keys, allowed = node_keys(work, a.nodes)
    port = free_port()
    remote = f"tcp://127.0.0.1:{port}"
    base = {"pollers": {"nvml_enabled": False}, "daemon_record_interval_s": 5,
            "aggregator": {"step_timeout_s": a.step_timeout}}
    head_eps = Endpoints()
    # Every daemon started at once, then waited for (128 one after the other: minutes).
    head = launch(work / "head", head_eps, config={**base, "security": {
        "server_secret_key": str(keys / "head.key_secret"), "allowed_clients_dir": str(allowed),
        "curve_loopback": True}}, extra=("--remote-ingest", remote), world_size=a.nodes, ready_timeout_s=None)
    node_eps = [Endpoints() for _ in range(a.nodes)]
    nodes = [launch(work / f"node{i}", node_eps[i], config={**base, "forward": {
        "endpoint": remote, "node_rank": i, "num_nodes": a.nodes, "server_public_key": str(keys / "head.key"),
        "client_secret_key": str(keys / f"node{i}.key_secret")}}, world_size=a.ranks, ready_timeout_s=None)
        for i in range(a.nodes)]
    t_start = time.monotonic()
    for d in [head, *nodes]:
        d.wait_ready(600)           # a hang detector: N daemons importing at once on a small box
    print(f"node-fleet: {a.nodes + 1} daemons ready in {time.monotonic() - t_start:.0f} s", file=sys.stderr, flush=True)
    arrivals = StepArrivals(head.pub)
    per = math.ceil(a.nodes / a.hosts)
    hosts = []
    for first in range(0, a.nodes, per):
        count = min(per, a.nodes - first)
        ingests = ",".join(e.ingest for e in node_eps[first:first + count])
        hosts.append(subprocess.Popen(
            [sys.executable, "-m", "benchmarks.node_fleet", "--host", "--ingests", ingests, "--first", str(first),
             "--count", str(count), "--ranks", str(a.ranks), "--rate", str(a.rate), "--seconds", str(a.seconds),
             "--metrics", str(a.metrics), "--slow-ranks", a.slow_ranks, "--slow-from", str(a.slow_from),
             "--slow-by", str(a.slow_by)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "WORLD_SIZE": str(a.nodes * a.ranks)}))
    for p in hosts:
        line = p.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"node-fleet: a rank host did not start ({line!r})")
    time.sleep(2.0)                 # every hello in
    pids = [head.proc.pid] + [d.proc.pid for d in nodes]
    cpu0, w0 = [_cpu_s(p) for p in pids], time.monotonic()
    for p in hosts:
        p.stdin.write("go\n")
        p.stdin.flush()
    killed_at = stopped_at = None
    # (at, what) in time order: the kill, the stop and its continue.
    plan = []
    if a.kill_node >= 0:
        plan.append(((a.kill_at_step - 1) / a.rate, "kill"))
    if a.stop_node >= 0:
        plan += [((a.stop_at_step - 1) / a.rate, "stop"), ((a.stop_at_step - 1) / a.rate + a.stop_s, "cont")]
    for at, what in sorted(plan):
        time.sleep(max(0.0, w0 + at - time.monotonic()))
        if what == "kill":
            nodes[a.kill_node].proc.kill()
            killed_at = time.time()
            print(f"node-fleet: node {a.kill_node}'s daemon SIGKILLed at step ~{a.kill_at_step}", file=sys.stderr,
                  flush=True)
        elif what == "stop":
            os.kill(nodes[a.stop_node].proc.pid, signal.SIGSTOP)
            stopped_at = time.time()
            print(f"node-fleet: node {a.stop_node}'s daemon SIGSTOPped at step ~{a.stop_at_step}", file=sys.stderr,
                  flush=True)
        else:
            os.kill(nodes[a.stop_node].proc.pid, signal.SIGCONT)
            print(f"node-fleet: node {a.stop_node}'s daemon continued after {a.stop_s:g} s", file=sys.stderr,
                  flush=True)
    outs = [json.loads(p.stdout.readline()) for p in hosts]
    for p in hosts:
        p.wait(300)
    live = [i for i in range(a.nodes) if i != a.kill_node]
    # (with --kill-node the window holds the killed node's ranks' 30 s linger at their close)
    cpu1, w1 = [_gone_nan(_cpu_s, p) for p in pids], time.monotonic()
    rss_peak = [_gone_nan(_vm, p, "VmHWM") for p in pids]
    print(f"node-fleet: ranks done ({w1 - w0:.0f} s); draining the nodes", file=sys.stderr, flush=True)
    with ThreadPoolExecutor(16) as pool:
        node_finals = dict(zip(live, pool.map(lambda i: nodes[i].drain(timeout_s=300), live)))
    wait_forwarded(head, node_finals, "the head has every live node's records")
    final = head.drain(timeout_s=300)
    arrivals.close()
    for d in [head, *nodes]:
        d.stop()
        d.cleanup()

    n_steps = int(a.seconds * a.rate)
    stats = {int(r): s for o in outs for r, s in o["stats"].items()}

    def accounted(got: dict, dropped: int) -> int:
        # `lost` holds what the sender said it dropped (dropped_by_client): counted once, here.
        return got.get("received", 0) + got.get("refused", 0) + got.get("lost", 0) - got.get("dropped_by_client", 0) \
            + dropped

    # Rank -> node: what each client tried, its node took in, counted lost, or the client dropped.
    ranks_inexact = {}
    for r, s in stats.items():
        if r // a.ranks not in node_finals:
            continue                # its node's daemon was killed: what it took in died with it
        got = node_finals[r // a.ranks]["per_rank"].get(str(r), {})
        if accounted(got, s["dropped"]) != s["seq"]:
            ranks_inexact[r] = (s, got)
    # Node -> head: what each forwarder tried, the head took in or counted lost, or it dropped or
    # counted unsent (a link that never completed its handshake); or, for a forwarder whose close
    # ran out of linger, within its not-confirmed bound.
    nodes_inexact, nodes_not_confirmed = {}, {}
    for i, f in node_finals.items():
        got, fwd = final.get("per_rank", {}).get(str(i), {}), f["sinks"]["forward"]
        n = accounted(got, fwd["refused_by_send_queue"] + fwd.get("unsent_no_handshake", 0))
        if n != fwd["seq"]:
            if n < fwd["seq"] <= n + fwd.get("unconfirmed_at_close", 0):
                nodes_not_confirmed[i] = fwd["seq"] - n
            else:
                nodes_inexact[i] = (fwd, got)
    node_steps = [nodes[i].read_jsonl("metrics", aggregated=True) for i in live]
    head_steps = head.read_jsonl("metrics", aggregated=True)
    head_nums = [r["step"] for r in head_steps]
    span = w1 - w0
    node_cpu = [100 * (cpu1[1 + i] - cpu0[1 + i]) / span for i in live]
    node_rss = [rss_peak[1 + i] for i in live]
    # Steps the head wrote without a node: after a kill, those without that node alone are expected
    # (from the step the node had not forwarded yet when it died, a step or two before the kill's).
    lacking = [(r["step"], r["missing_ranks"]) for r in head_steps if r.get("missing_ranks")]
    expected_lack = [st for st, m in lacking if m == [a.kill_node]]
    # ... and those without the stopped node (with or without the killed one), while it was stopped.
    stop_lack = [st for st, m in lacking if a.stop_node in m and set(m) <= {a.stop_node, a.kill_node}]
    result = {
        "nodes": a.nodes, "ranks_per_node": a.ranks, "rate": a.rate, "seconds": a.seconds, "metrics": a.metrics,
        "curve": True, "records_from_ranks": sum(s["seq"] for s in stats.values()),
        "ranks_inexact": len(ranks_inexact), "ranks_inexact_sample": dict(list(ranks_inexact.items())[:2]),
        "rank_records_dropped_by_clients": sum(s["dropped"] for s in stats.values()),
        "node_records_lost": sum(f.get("records_lost", 0) for f in node_finals.values()),
        "node_steps_expected": n_steps,
        "nodes_with_wrong_steps": sum(sorted(r["step"] for r in st) != list(range(1, n_steps + 1))
                                      for st in node_steps),
        "node_steps_incomplete": sum(1 for st in node_steps for r in st if r.get("missing_ranks")),
        "nodes_inexact": len(nodes_inexact), "nodes_inexact_sample": dict(list(nodes_inexact.items())[:2]),
        "nodes_within_not_confirmed_bound": len(nodes_not_confirmed),
        "node_records_lost_at_close": sum(nodes_not_confirmed.values()),
        "node_records_unsent_no_handshake": sum(f["sinks"]["forward"].get("unsent_no_handshake", 0)
                                                for f in node_finals.values()),
        "forwarded_dropped": sum(f["sinks"]["forward"]["refused_by_send_queue"] for f in node_finals.values()),
        "head_records_lost": final.get("records_lost"),
        "head_steps_written": len(head_nums), "head_steps_written_twice": len(head_nums) - len(set(head_nums)),
        "head_steps_incomplete": len(lacking) - len(expected_lack) - len([st for st in stop_lack if st not in
                                                                           expected_lack]),
        "head_cpu_percent_of_a_core": round(100 * (cpu1[0] - cpu0[0]) / span, 1),
        "head_rss_mb_peak": round(rss_peak[0]),
        "node_cpu_percent_of_a_core_median": round(sorted(node_cpu)[len(node_cpu) // 2], 2),
        "node_cpu_percent_of_a_core_max": round(max(node_cpu), 2),
        "node_cpu_percent_of_a_core_sum": round(sum(node_cpu), 1),
        "node_rss_mb_peak_median": round(sorted(node_rss)[len(node_rss) // 2], 1),
        "node_rss_mb_peak_max": round(max(node_rss), 1),
        "node_rss_mb_peak_sum": round(sum(node_rss)),
        **arrivals.latency_ms(head_steps),
        "hosts_behind_s": round(max(o["behind_s"] for o in outs), 2),
    }
    if killed_at is not None:
        named = [e for e in head.read_jsonl("event")
                 if e["name"] == "diagnosis/rank_stopped" and e.get("rank") == a.kill_node]
        result["killed"] = {
            "node": a.kill_node, "at_step": a.kill_at_step, "head_steps_without_it": len(expected_lack),
            "first_step_without_it": min(expected_lack, default=None),
            "named_after_s": round(named[0]["t"] - killed_at, 1) if named else None,
            "finding": named[0]["data"].get("message") if named else None,
            "other_nodes_named_stopped": sorted({e.get("rank") for e in head.read_jsonl("event")
                                                 if e["name"] == "diagnosis/rank_stopped"} - {a.kill_node})}
    if stopped_at is not None:
        named = [e for e in head.read_jsonl("event")
                 if e["name"] == "diagnosis/rank_stopped" and e.get("rank") == a.stop_node]
        fwd = node_finals[a.stop_node]["sinks"]["forward"]
        result["stopped"] = {
            "node": a.stop_node, "at_step": a.stop_at_step, "for_s": a.stop_s,
            "named_after_s": round(named[0]["t"] - stopped_at, 1) if named else None,
            "findings": [e["data"].get("message") for e in named],
            "head_steps_without_it": len(stop_lack),
            "its_late_records_at_the_head": sum(1 for r in head.read_jsonl("metrics", aggregated=False)
                                                if r.get("rank") == a.stop_node and r.get("late")),
            "forwarder": {k: fwd.get(k) for k in ("seq", "sent", "refused_by_send_queue", "dropped", "connects", "disconnects",
                                                  "unsent_no_handshake", "unconfirmed_at_close")},
            "at_the_head": {k: final.get("per_rank", {}).get(str(a.stop_node), {}).get(k)
                            for k in ("received", "refused", "lost")},
            "exact": a.stop_node not in nodes_inexact}
    if a.slow_ranks:
        def findings(d) -> list[dict]:
            return [{k: e["data"].get(k) for k in ("step", "slowest_rank", "phase", "part", "node_rank", "unit",
                                                    "message")} | {"rank": e.get("rank")}
                    for e in d.read_jsonl("event") if e["name"] == "diagnosis/straggler"]
        result["slow"] = {"ranks": a.slow_ranks, "from_step": a.slow_from, "by_s": a.slow_by / a.rate,
                          "node_findings": {i: f for i in live if (f := findings(nodes[i]))},
                          "head_findings": findings(head)}
    print(json.dumps(result, indent=1))
    exact = not (ranks_inexact or nodes_inexact or result["nodes_with_wrong_steps"] or result["node_steps_incomplete"]
                 or result["head_steps_incomplete"] or result["head_steps_written_twice"]
                 or result["head_steps_written"] != n_steps)
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
