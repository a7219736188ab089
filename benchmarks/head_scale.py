"""A head daemon against simulated nodes (issue 33 item 1): N nodes, each sending what a node
daemon's forward sink sends (a hello naming the job's node count, then one aggregated metrics
record a step with --metrics values, as rank = its node), at --rate steps a second, over TCP on
loopback; each node its own PUSH connection and `src`, so the head accounts each as it would a
real node. What the head does with them, measured from outside:

- exact: per node, records the head took in + counted lost == records the node sent; every step
  written once, with no node missing (a step written without one is counted);
- the head's CPU (% of one core over the steady window), RSS (peak), and latency: from a step's
  send (its records' t) to its aggregated record reaching a PUB subscriber (p50, p95, max).

    .venv/bin/python -m benchmarks.head_scale --nodes 2048 --rate 10 --seconds 30 [--senders 2]
    .venv/bin/python -m benchmarks.head_scale --nodes 8192 --rate 1 --groups 8
    .venv/bin/python -m benchmarks.head_scale --nodes 256 --rate 10 --seconds 40 --kill-head-at 15 --head-down-s 10
    .venv/bin/python -m benchmarks.head_scale --nodes 2048 --rate 0.001 --seconds 40   # idle links: a hello, a bye

With --kill-head-at S the head is SIGKILLed S seconds into the run and started again on its log
directory and endpoints --head-down-s later (issue 33 item 3); the nodes' sockets hold what they
send meanwhile and reconnect by themselves. Exact is then: per node, the records of it that the
head's metrics.jsonl holds (in the aggregated steps it is not missing from, its own lines, its
hello and bye) + what the head counts lost (lost, and refused: shed at its intake or unread at
its drain) == what the node sent; and the final `run` totals
(across the two heads) are reported.

With --groups K the tree has one level more (node -> group head -> job head): K group heads, each
the head of nodes/K of the nodes and forwarding to the job's head as its group. Exact is then
checked at both levels (per node at its group head, per group at the job head), and every
daemon's CPU and RSS is reported (the job head's, and the sum and the largest of the groups').

With --head-cpu-share F the head (and the group heads) get F of one core (a cgroup CFS quota: a
head on a node whose training job and other daemons leave it that much); each node's queue may take
--linger-s at its end to reach the head (the forwarder's close_linger_s), and libzmq discards what is
left then. Each node counts, as its forwarder does, what it could not hand to the head: every record
on a link that never completed its handshake (exact: the head's count + the node's == sent), and, for
a node whose linger ran out with records queued, an upper bound of what was discarded ("not
confirmed": the node is reported within that bound, and the records it lost so are counted from the
head's side). A node neither exact nor within its bound is inexact.

The senders are --senders processes (a node's socket and its descriptor are in one of them;
their CPU is theirs, not the head's). Everything is on loopback, no CURVE (a loopback head
needs none; CURVE's cost is per byte, the same per node-record at any node count).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SENDER_HWM = 100_000                     # a node's send queue (records)
_ZMQ_OUT_BATCH_FRAMES = 8192 // 3 + 1    # libzmq's engine batch (8 KiB) of the smallest frames, an upper bound


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def sender_main(a: argparse.Namespace) -> int:
    """Nodes [first, first + count): hello, then a metrics record per node per tick, then bye."""
    import zmq

    from protocol import encode_bye, encode_hello, encode_metrics

    _raise_nofile()
    ctx = zmq.Context(2)
    ctx.set(zmq.MAX_SOCKETS, 65536)     # (a context option: the default is 1,023 sockets)
    nodes = list(range(a.first, a.first + a.count))
    socks = {}
    endpoints = a.endpoint.split(",")     # with group heads: node n's is its group's, n // per_group
    per_group = -(-a.nodes // len(endpoints))
    mons = {}
    for n in nodes:
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, SENDER_HWM)
        s.setsockopt(zmq.LINGER, int(a.linger_s * 1000))
        if a.node_heartbeat_s > 0:       # as a node's forwarder pings its head (forward.heartbeat_ivl_s)
            ivl = int(a.node_heartbeat_s * 1000)
            s.setsockopt(zmq.HEARTBEAT_IVL, ivl)
            s.setsockopt(zmq.HEARTBEAT_TIMEOUT, ivl)
            s.setsockopt(zmq.HEARTBEAT_TTL, 2 * ivl)
        # As a node's forwarder watches its link: did it ever complete its handshake, and when did
        # the socket go at the close (after its linger: drained, or cut with records queued).
        mons[n] = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_MONITOR_STOPPED)
        s.connect(endpoints[n // per_group])
        socks[n] = s
    src = {n: (os.getpid() << 20) + n for n in nodes}
    seq = dict.fromkeys(nodes, 0)
    sent = dict.fromkeys(nodes, 0)
    names = [f"node/m{i}" for i in range(a.metrics)]
    t0 = time.time_ns()
    for n in nodes:
        info = {"world_size": a.nodes, "node_rank": n, "num_nodes": a.nodes, "forwarded_by": "node daemon",
                "run_name": "head-scale", "started_at": t0 / 1e9}
        socks[n].send(encode_hello(src[n], n, seq[n], 0, time.time_ns(), info))
        seq[n] += 1
        sent[n] += 1
    print("ready", flush=True)
    # Start together: the parent writes a line when every sender is connected.
    sys.stdin.readline()
    steps = int(a.seconds * a.rate)
    start = time.monotonic()
    for step in range(1, steps + 1):
        due = start + (step - 1) / a.rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for n in nodes:
            now = time.time_ns()
            values = {name: (step * 0.001 + i) for i, name in enumerate(names)}
            values["perf/step_time"] = 1.0 / a.rate
            values["perf/tokens"] = 4096
            socks[n].send(encode_metrics(src[n], n, seq[n], 0, now, step, values))
            seq[n] += 1
            sent[n] += 1
    byes = {}
    for n in nodes:
        byes[n] = encode_bye(src[n], n, seq[n], 0, time.time_ns(), {})
        seq[n] += 1
        sent[n] += 1
    behind = time.monotonic() - (start + steps / a.rate)
    # The run lasts --seconds also with no step to send (--rate below 1/--seconds: idle links).
    time.sleep(max(0.0, start + a.seconds - time.monotonic()))
    unsent, unconfirmed = _close_counting(ctx, socks, mons, sent, a.linger_s, byes,
                                          lambda n: endpoints[n // per_group])
    ctx.term()
    print(json.dumps({"sent": {str(n): sent[n] for n in nodes}, "src": {str(n): src[n] for n in nodes},
                      "unsent_no_handshake": {str(n): v for n, v in unsent.items()},
                      "unconfirmed_at_close": {str(n): v for n, v in unconfirmed.items()},
                      "behind_s": behind}), flush=True)
    return 0


def _close_counting(ctx, socks: dict, mons: dict, sent: dict, linger_s: float, byes: dict,
                    endpoint_of) -> tuple[dict, dict]:
    """Close every node's socket as the forwarder does (telemetry/daemon/sinks/forward.py) and
    count what a node could not hand to its head: a link that completed its handshake gets its
    node's bye on a link of its own, then lingers; a link that never completed its handshake
    within the linger has every record it was handed (its bye too) counted (exact); a socket
    still lingering just before its linger runs out, an upper bound of what libzmq discarded
    (records queued, at most its send queue plus one engine batch: "not confirmed"); a bye whose
    own link never completed its handshake, counted unsent. A socket's monitor stops as soon as it
    is gone: at once when its queue is empty, at the end of its linger when not. Returns ({node:
    unsent}, {node: unconfirmed}), each holding only the nodes with something to count."""
    import zmq
    from zmq.utils.monitor import parse_monitor_message

    shook, stopped = set(), {}          # stopped: node -> when its monitor's stop was seen
    bye_socks, bye_mons, bye_shook, bye_stopped = {}, {}, set(), set()

    def events(m) -> list[int]:
        out = []
        while True:
            try:
                out.append(parse_monitor_message(m.recv_multipart(zmq.NOBLOCK))["event"])
            except zmq.Again:
                return out

    def read_all() -> None:        # one pass over every monitor, nothing waited for (thousands of them)
        for n, m in mons.items():
            for ev in events(m):
                if ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    shook.add(n)
                elif ev == zmq.EVENT_MONITOR_STOPPED:
                    stopped[n] = time.monotonic()
        for n, m in bye_mons.items():
            for ev in events(m) if n not in bye_stopped else ():
                if ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    bye_shook.add(n)
                elif ev == zmq.EVENT_MONITOR_STOPPED:
                    bye_stopped.add(n)

    # Each link gets the whole linger, as each node's forwarder does: the handshaken ones are
    # closed with it at once, the others get it to complete their handshake (then what is left of it).
    deadline = time.monotonic() + linger_s
    read_all()
    closed_with_linger = set()
    while True:
        for n in shook - closed_with_linger:
            b = ctx.socket(zmq.PUSH)
            b.setsockopt(zmq.SNDHWM, 1)
            b.setsockopt(zmq.LINGER, 0)
            b.monitor(f"inproc://head-scale-bye-{n}",                 # (a closed socket's fd, reused, would clash
                      zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_MONITOR_STOPPED)    # in pyzmq's own name)
            bye_mons[n] = ctx.socket(zmq.PAIR)
            bye_mons[n].connect(f"inproc://head-scale-bye-{n}")
            b.connect(endpoint_of(n))
            b.send(byes[n], zmq.NOBLOCK)
            bye_socks[n] = b
            socks[n].close(linger=int(max(0.0, deadline - time.monotonic()) * 1000))
            closed_with_linger.add(n)
        if len(shook) == len(socks) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
        read_all()
    for n, s in socks.items():
        if n not in closed_with_linger:
            s.close(linger=0)
    # Every handshaken socket's linger ends at the deadline: one seen gone before it was drained.
    time.sleep(max(0.0, deadline - 0.05 * linger_s - time.monotonic()))
    read_all()
    lingering = {n for n in closed_with_linger if stopped.get(n, math.inf) >= deadline}
    read_all()                      # a handshake the close raced with: that link's records may have gone
    up = set(bye_shook)            # the byes that had the rest of the linger to leave
    for n, b in bye_socks.items():
        b.close(linger=int(max(0.0, deadline - time.monotonic()) * 1000) if n in up else 0)
    stop_by = time.monotonic() + 2.0   # the others' monitors: a handshake the close raced with comes before their stop
    while len(bye_stopped | up) < len(bye_socks) and time.monotonic() < stop_by:
        time.sleep(0.02)
        read_all()
    print(f"head-scale sender: {len(shook)} of {len(socks)} links handshaken, linger {linger_s} s, "
          f"{len(lingering)} still lingering near its end; {len(up)} of {len(bye_socks)} byes' links "
          f"handshaken in time, {len(bye_shook - up)} as they closed", file=sys.stderr, flush=True)
    for m in (*mons.values(), *bye_mons.values()):
        m.close(linger=0)
    unsent = {n: sent[n] for n in socks if n not in shook}
    unsent.update({n: 1 for n in bye_socks if n not in bye_shook})
    raced = shook - closed_with_linger     # closed at once, yet handshaken meanwhile: some may have gone
    unconfirmed = {n: min(sent[n], SENDER_HWM + _ZMQ_OUT_BATCH_FRAMES) for n in lingering | raced}
    for n in bye_shook - up:               # the bye's link came up as it closed: the bye may have gone
        unconfirmed[n] = unconfirmed.get(n, 0) + 1
    return unsent, unconfirmed


def _written_per_node(recs: list[dict], num_nodes: int) -> dict[int, int]:
    """Each node's records in a head's lines: one per aggregated step it is not missing from, its
    own step lines (late), its hello and its bye."""
    out = dict.fromkeys(range(num_nodes), 0)
    everyone = set(out)
    for r in recs:
        kind, rank = r["kind"], r.get("rank")
        if kind == "metrics" and rank is None:
            for n in everyone - set(r.get("missing_ranks", [])):
                out[n] += 1
        elif kind in ("metrics", "bye") or kind == "hello" and r["info"].get("forwarded_by") == "node daemon":
            if rank in out:
                out[rank] += 1
    return out


class StepArrivals:
    """When each step's aggregated record reached a subscriber of `pub` (unix s), on a thread;
    latency_ms: from each step's `t` (its records' send time) to then, p50 / p95 / max."""

    def __init__(self, pub: str) -> None:
        from telemetry.consumers.subscribe import Subscriber

        self.sub = Subscriber(pub, topics=("metrics",))
        self.at: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            for _kind, rec in self.sub.records(timeout_ms=100):
                if rec.get("kind") == "metrics" and "rank" not in rec:
                    self.at.setdefault(rec["step"], time.time())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sub.close()

    def latency_ms(self, steps: list[dict]) -> dict:
        t_sent = {r["step"]: r["t"] for r in steps}
        lat = sorted(self.at[s] - t_sent[s] for s in self.at if s in t_sent)

        def q(f: float) -> float:
            return round(lat[min(len(lat) - 1, int(f * len(lat)))] * 1000, 1) if lat else float("nan")
        return {"latency_ms_p50": q(0.5), "latency_ms_p95": q(0.95), "latency_ms_max": q(1.0)}


def _vm(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int, stat: Path | None = None) -> float:
    """A process's CPU seconds (or a thread's, by its `stat` file)."""
    fields = (stat or Path(f"/proc/{pid}/stat")).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _threads_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads by name (libzmq's I/O threads are `ZMQbg/IO/N`)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            cpu = _cpu_s(pid, task / "stat")
        except OSError:
            continue                                # gone meanwhile
        out[comm] = out.get(comm, 0.0) + cpu
    return out


CGROUP_CPU = Path("/sys/fs/cgroup/cpu")      # cgroup v1's cpu controller (as root)


class CpuCap:
    """The head held to a share of one core (--head-cpu-share): a cgroup v1 cpu group with a CFS
    quota, as a head on a busy machine gets (its other daemons, the training job's own threads).
    Needs root and cgroup v1's cpu controller; says so and exits 2 without them."""

    PERIOD_US = 100_000

    def __init__(self, share: float) -> None:
        self.dir = CGROUP_CPU / f"head-scale-{os.getpid()}"
        try:
            self.dir.mkdir()
            (self.dir / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (self.dir / "cpu.cfs_quota_us").write_text(str(max(1000, int(share * self.PERIOD_US))))
        except OSError as exc:
            print(f"head-scale: --head-cpu-share needs root and cgroup v1's cpu controller ({exc})", file=sys.stderr)
            sys.exit(2)

    def add(self, pid: int) -> None:
        (self.dir / "cgroup.procs").write_text(str(pid))       # the process, its threads, later ones too

    def close(self) -> None:
        for pid in (self.dir / "cgroup.procs").read_text().split():
            try:
                (CGROUP_CPU / "cgroup.procs").write_text(pid)
            except OSError:
                pass                                            # gone meanwhile
        self.dir.rmdir()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--rate", type=float, default=10.0, help="steps a second of every node")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--metrics", type=int, default=50, help="values in a node's record")
    ap.add_argument("--senders", type=int, default=2, help="sender processes")
    ap.add_argument("--linger-s", type=float, default=2.0,
                    help="how long a node's queue may take to reach the head at its end (the forwarder's close_linger_s)")
    ap.add_argument("--node-heartbeat-s", type=float, default=5.0,
                    help="each node pings its head this often, with a timeout as long and a TTL of both, as the "
                         "forwarder does by default (forward.heartbeat_ivl_s, heartbeat_timeout_s); 0: no pings")
    ap.add_argument("--groups", type=int, default=0,
                    help="group heads between the nodes and the job's head (0: the nodes send to the head)")
    ap.add_argument("--head-cpu-share", type=float, default=0.0,
                    help="hold the head (and group heads) to this share of one core (cgroup v1, root); 0: no cap")
    ap.add_argument("--memory-mb", type=float, default=0.0,
                    help="the heads' memory budget (0: the daemon's default; a head reserves room for each node "
                         "link and refuses a budget that cannot hold them, naming the least that does)")
    ap.add_argument("--kill-head-at", type=float, default=0.0, help="SIGKILL the head this many seconds in")
    ap.add_argument("--head-down-s", type=float, default=10.0, help="and start it again this much later")
    ap.add_argument("--sender", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.sender:
        return sender_main(a)
    if a.groups and a.nodes % a.groups:
        ap.error(f"--nodes {a.nodes} is not a multiple of --groups {a.groups}")
    if a.kill_head_at and (a.groups or not 0 < a.kill_head_at < a.seconds or a.head_down_s < 0):
        ap.error("--kill-head-at: a time within --seconds, without --groups")
    _raise_nofile()
    from testkit.faults import Endpoints, free_port, launch, wait_forwarded

    work = Path(tempfile.mkdtemp(prefix="head-scale-", dir="/tmp"))
    eps = Endpoints()
    port = free_port()
    remote = f"tcp://127.0.0.1:{port}"
    base = {"pollers": {"nvml_enabled": False}, "daemon_record_interval_s": 5,
            **({"memory_mb": a.memory_mb} if a.memory_mb else {})}
    head_args = dict(config=base, extra=("--remote-ingest", remote), world_size=a.groups or a.nodes)
    cap = CpuCap(a.head_cpu_share) if a.head_cpu_share > 0 else None
    head = launch(work / "head", eps, **head_args)
    pid = head.proc.pid
    if cap:
        cap.add(pid)
    groups, group_eps = [], []
    for g in range(a.groups):
        gp = free_port()
        group_eps.append(f"tcp://127.0.0.1:{gp}")
        groups.append(launch(work / f"group{g}", Endpoints(),
                             config={**base, "forward": {"endpoint": remote, "node_rank": g, "num_nodes": a.groups}},
                             extra=("--remote-ingest", group_eps[-1]), world_size=a.nodes // a.groups))
        if cap:
            cap.add(groups[-1].proc.pid)
    node_endpoints = ",".join(group_eps) if groups else remote
    arrivals = StepArrivals(eps.pub)
    per = math.ceil(a.nodes / a.senders)
    senders = []
    for i in range(a.senders):
        first, count = i * per, min(per, a.nodes - i * per)
        if count <= 0:
            break
        senders.append(subprocess.Popen(
            [sys.executable, "-m", "benchmarks.head_scale", "--sender", "--endpoint", node_endpoints, "--nodes", str(a.nodes),
             "--rate", str(a.rate), "--seconds", str(a.seconds), "--linger-s", str(a.linger_s), "--metrics", str(a.metrics),
             "--node-heartbeat-s", str(a.node_heartbeat_s), "--first", str(first),
             "--count", str(count)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for p in senders:
        assert p.stdout.readline().strip() == "ready"
    time.sleep(1.0)                      # every hello in
    rss0, cpu0, w0 = _vm(pid, "VmRSS"), _cpu_s(pid), time.monotonic()
    threads0 = _threads_cpu_s(pid)
    gcpu0 = [_cpu_s(gd.proc.pid) for gd in groups]
    for p in senders:
        p.stdin.write("go\n")
        p.stdin.flush()
    killed = None
    if a.kill_head_at:
        time.sleep(max(0.0, w0 + a.kill_head_at - time.monotonic()))
        cpu_killed = _cpu_s(pid)
        head.proc.kill()
        head.proc.wait(60)
        killed = time.monotonic()
        print(f"head-scale: head SIGKILLed at {killed - w0:.1f} s", file=sys.stderr, flush=True)
        time.sleep(a.head_down_s)
        head = launch(work / "head", eps, **head_args)       # the same directory, endpoints and port
        print(f"head-scale: head started again after {time.monotonic() - killed:.1f} s", file=sys.stderr, flush=True)
        cpu0 -= cpu_killed                 # the first head's share, then the second's from zero
        pid = head.proc.pid
        if cap:
            cap.add(pid)
    outs = [json.loads(p.stdout.readline()) for p in senders]
    for p in senders:
        p.wait(300)
    cpu1, w1 = _cpu_s(pid), time.monotonic()
    threads1 = _threads_cpu_s(pid) if killed is None else {}
    gcpu1 = [_cpu_s(gd.proc.pid) for gd in groups]
    rss_peak = _vm(pid, "VmHWM")
    grss_peak = [_vm(gd.proc.pid, "VmHWM") for gd in groups]
    # A group head's drain forwards what it holds and ends its link (a bye) to the job head.
    gfinals = [gd.drain(timeout_s=300) for gd in groups]
    for gd in groups:
        gd.stop()
    gsent = {g: f["sinks"]["forward"]["seq"] for g, f in enumerate(gfinals)}
    if groups:
        wait_forwarded(head, dict(enumerate(gfinals)), "the job head has every group's records")
    final = head.drain(timeout_s=300)
    arrivals.close()
    head.stop()
    if cap:
        cap.close()
    sent = {int(k): v for o in outs for k, v in o["sent"].items()}
    srcs = {int(k): v for o in outs for k, v in o["src"].items()}
    unsent = {int(k): v for o in outs for k, v in o["unsent_no_handshake"].items()}
    unconfirmed = {int(k): v for o in outs for k, v in o["unconfirmed_at_close"].items()}
    # Exactness, per node: what the head took in + counted lost == sent.
    recs = [json.loads(line) for line in (work / "head" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["kind"] == "metrics" and "rank" not in r]
    step_nums = [r["step"] for r in steps]
    incomplete = [r["step"] for r in steps if r.get("missing_ranks")]
    per_node = {int(k): v for f in (gfinals or [final]) for k, v in f.get("per_rank", {}).items()}
    # Per node: what the head took in + counted lost (by the head: lost, refused; by the node:
    # unsent on a link that never completed its handshake) == sent, exactly; or, for a node whose
    # close's linger ran out with records queued, within the node's "not confirmed" bound.
    if killed is None:
        got = {n: per_node[n]["received"] + per_node[n]["refused"] + per_node[n]["lost"] if n in per_node else 0
               for n in sent}
    else:
        written = _written_per_node(recs, a.nodes)
        got = {n: written[n] + per_node[n]["lost"] + per_node[n]["refused"] if n in per_node else 0 for n in sent}
    accounted = {n: got[n] + unsent.get(n, 0) for n in sent}
    not_confirmed = {n for n in sent if n in unconfirmed and accounted[n] <= sent[n] <= accounted[n] + unconfirmed[n]
                     and accounted[n] != sent[n]}
    inexact = {n: (per_node.get(n), unsent.get(n), unconfirmed.get(n), sent[n]) for n in sent
               if accounted[n] != sent[n] and n not in not_confirmed}
    per_group = {int(k): v for k, v in final.get("per_rank", {}).items()} if groups else {}
    groups_inexact = {g: (per_group.get(g), gsent[g]) for g in gsent
                      if g not in per_group or sum(per_group[g][k] for k in ("received", "refused", "lost")) != gsent[g]}
    del srcs
    n_steps = int(a.seconds * a.rate)
    cpu_pct = 100 * (cpu1 - cpu0) / (w1 - w0)
    result = {
        "nodes": a.nodes, "rate": a.rate, "seconds": a.seconds, "metrics": a.metrics,
        "head_cpu_share": a.head_cpu_share or None, "linger_s": a.linger_s,
        "node_records_per_s": a.nodes * a.rate,
        "steps_expected": n_steps, "steps_written": len(step_nums), "steps_written_twice": len(step_nums) - len(set(step_nums)),
        "steps_incomplete": len(incomplete),
        "records_in": final.get("records_in"), "records_lost": final.get("records_lost"),
        "groups": a.groups,
        "nodes_inexact": len(inexact), "inexact_sample": dict(list(inexact.items())[:3]),
        "nodes_unsent_no_handshake": len(unsent), "records_unsent_no_handshake": sum(unsent.values()),
        "nodes_cut_at_close": len(unconfirmed),
        "nodes_within_not_confirmed_bound": len(not_confirmed),
        "records_lost_at_close": sum(sent[n] - accounted[n] for n in not_confirmed),
        "records_sent": sum(sent.values()), "senders_behind_s": max(o["behind_s"] for o in outs),
        "head_cpu_percent_of_a_core": round(cpu_pct, 1), "head_us_per_node_record": round(
            1e6 * (cpu1 - cpu0) / max(1, a.nodes * n_steps), 1),
        # The head's CPU by thread, and over its node links: what a link costs it a second (all of
        # it, for idle links: --rate below 1/--seconds).
        "head_cpu_percent_by_thread": {k: round(100 * (v - threads0.get(k, 0.0)) / (w1 - w0), 2)
                                       for k, v in sorted(threads1.items())},
        "head_us_per_link_second": round(1e6 * (cpu1 - cpu0) / (a.nodes * (w1 - w0)), 2),
        "head_rss_mb_before": round(rss0), "head_rss_mb_peak": round(rss_peak),
        **arrivals.latency_ms(steps),
        "connections_refused": sum(c.get("refused", 0) for f in (final, *gfinals)
                                   for c in f.get("security", {}).get("connections", {}).values()),
    }
    if killed is not None:
        result["head_killed"] = {
            "at_s": a.kill_head_at, "down_s": a.head_down_s, "run": final.get("run"),
            "written": sum(written.values()), "lost": sum(p["lost"] for p in per_node.values()),
            "refused": sum(p["refused"] for p in per_node.values()),
            "overcount_nodes": sum(written[n] + per_node.get(n, {}).get("lost", 0) + per_node.get(n, {}).get("refused", 0)
                                   > sent[n] for n in sent),
            "records_in_this_head": final.get("records_in")}
    if groups:
        gcpu = [100 * (c1 - c0) / (w1 - w0) for c0, c1 in zip(gcpu0, gcpu1)]
        result.update({
            "groups_inexact": len(groups_inexact), "groups_inexact_sample": dict(list(groups_inexact.items())[:3]),
            "group_records_lost": sum(f.get("records_lost", 0) for f in gfinals),
            "group_cpu_percent_of_a_core_max": round(max(gcpu), 1), "group_cpu_percent_of_a_core_sum": round(sum(gcpu), 1),
            "group_rss_mb_peak_max": round(max(grss_peak)), "group_rss_mb_peak_sum": round(sum(grss_peak)),
        })
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
