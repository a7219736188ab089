"""The dashboard's and the Prometheus exporter's memory and answers for a run of 1M metric names.

    .venv/bin/python benchmarks/consumer_memory.py [--names 1000000] [--per-record 1000]
                                                   [--repo DIR | --before REV] [--case dashboard,exporter]
                                                   [--max-series N] [--steps 100000 --values 100]
                                                   [--ranges 32] [--memory-mb N] [--json OUT]

dashboard  writes a metrics.jsonl of --names distinct names (records of --per-record new names
           each, plus train/loss), starts the real `telemetry dashboard` on it, waits for its
           "serving" line (the history is loaded), times GET /api/data (with the token when the
           dashboard has one) and reports its size and the process's peak and current RSS
           (VmHWM, VmRSS from /proc).
exporter   binds a PUB socket here and publishes the same records as the daemon would (topic,
           JSON line), starts the real `telemetry export-prometheus --pub` on it, waits until
           every value has been taken (the exporter's own counters add up, or its CPU time stops
           moving for the old code), times GET /metrics (with the token it printed, if any), and
           reports the same.
points     the dashboard on a run of --steps records of --values values each (the same names
           every step): long series rather than many, which the store thins beyond its share.

--ranges N (dashboard and points): after the /api/data timings, N concurrent full-range reads
(GET /api/range over every step, width 1200, the first 200 step-axis keys, as a page asks) from
N threads at once; reports how many were answered, refused (503) and counted (`ranges_refused`),
and the peak RSS (VmHWM) after them. --memory-mb N is passed to the dashboard.

--max-series N is passed to both consumers (the new code only): with a large N, the byte
bounds under --memory-mb are what hold.

--repo DIR runs the consumers of another checkout (the "before"); --before REV makes one with
`git archive REV` into a temporary directory. Both run with this interpreter.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 900.0


def proc_mb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def records(num_names: int, per_record: int):
    step = 0
    for start in range(0, num_names, per_record):
        step += 1
        values = {"train/loss": 1.0 / step}
        values.update({f"user/r{step}/metric_{i}": float(i) for i in range(min(per_record, num_names - start))})
        yield {"kind": "metrics", "t": 1.7e9 + step, "step": step, "values": values}


def start(repo: Path, args: list[str]) -> tuple[subprocess.Popen, list[str], threading.Event]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRY_")}
    env.update({"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(repo)})
    proc = subprocess.Popen([sys.executable, "-m", "telemetry", *args], cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line)
            if "serving http" in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("never served:\n" + "".join(lines[-20:]))
    return proc, lines, ready


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def timed_get(url: str, headers: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    body = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=600).read()
    return time.perf_counter() - t0, len(body)


def _concurrent_ranges(url: str, headers: dict[str, str], run: dict, num: int) -> dict:
    """`num` full-range /api/range reads at once: their answers' codes and the count refused."""
    import urllib.error
    from urllib.parse import quote

    keys = [s["key"] for s in run["series"] if s["axis"] == "step"][:200]
    x1 = max((max(s["x"]) for s in run["series"] if s["axis"] == "step" and s["x"]), default=0)
    path = f"{url}api/range?run={run['id']}&x0=0&x1={x1}&width=1200" + "".join(f"&key={quote(k)}" for k in keys)
    codes: list[int] = []
    go = threading.Event()

    def read() -> None:
        go.wait()
        try:
            with urllib.request.urlopen(urllib.request.Request(path, headers=headers), timeout=600) as r:
                r.read()
                codes.append(r.status)
        except urllib.error.HTTPError as exc:
            codes.append(exc.code)

    threads = [threading.Thread(target=read) for _ in range(num)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    last = json.loads(urllib.request.urlopen(urllib.request.Request(path, headers=headers), timeout=600).read())
    return {"ranges": num, "range_keys": len(keys), "ranges_ok": codes.count(200), "ranges_503": codes.count(503),
            "ranges_refused_counted": last.get("ranges_refused"), "ranges_wall_s": round(wall, 2)}


def case_dashboard(repo: Path, recs, tmp: Path, extra: list[str], case: str = "dashboard",
                   concurrent: int = 0) -> dict:
    tel = tmp / "names" / "telemetry"
    tel.mkdir(parents=True)
    with open(tel / "metrics.jsonl", "w") as f:
        for rec in recs:
            f.write(json.dumps(rec) + "\n")
    size_mb = (tel / "metrics.jsonl").stat().st_size / 1e6
    t0 = time.monotonic()
    proc, lines, _ = start(repo, ["dashboard", str(tmp / "names"), "--port", "0", *extra])
    try:
        load_s = time.monotonic() - t0
        m = re.search(r"serving (http://127\.0\.0\.1:\d+/)([?#]token=(\S+))?", "".join(lines))
        headers = {"Authorization": f"Bearer {m.group(3)}"} if m.group(3) else {}
        rss_loaded = proc_mb(proc.pid, "VmRSS")
        answers = [timed_get(m.group(1) + "api/data?width=1200", headers) for _ in range(3)]
        data = json.loads(urllib.request.urlopen(urllib.request.Request(m.group(1) + "api/data", headers=headers),
                                                 timeout=600).read())
        status = data["status"][0]
        ranges = _concurrent_ranges(m.group(1), headers, data["runs"][0], concurrent) if concurrent else {}
        return {"case": case, **ranges, "jsonl_mb": round(size_mb, 1), "load_s": round(load_s, 2),
                "rss_loaded_mb": round(rss_loaded, 1), "peak_rss_mb": round(proc_mb(proc.pid, "VmHWM"), 1),
                "rss_after_mb": round(proc_mb(proc.pid, "VmRSS"), 1),
                "api_data_s": [round(s, 3) for s, _ in answers], "api_data_mb": round(answers[0][1] / 1e6, 3),
                "series_kept": len(data["runs"][0]["series"]), "budget": status.get("budget")}
    finally:
        stop(proc)


def case_exporter(repo: Path, num_names: int, per_record: int, extra: list[str]) -> dict:
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    proc, lines, _ = start(repo, ["export-prometheus", "--pub", f"tcp://127.0.0.1:{port}", "--port", "0", *extra])
    try:
        url = re.search(r"serving (http://[^ ]+/metrics)", "".join(lines)).group(1)
        token = re.search(r"Authorization: Bearer ([\w-]+)", "".join(lines))   # the random one it printed
        headers = {"Authorization": f"Bearer {token.group(1)}"} if token else {}
        # PUB/SUB slow joiner: publish a marker until the exporter shows it, then the load.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pub.send_multipart([b"metrics", json.dumps({"kind": "metrics", "t": 1.7e9, "step": 0,
                                                        "values": {"bench/marker": 1.0}}).encode()])
            time.sleep(0.2)
            if b"telemetry_bench_marker" in urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                                                   timeout=60).read():
                break
        t0 = time.monotonic()
        total = 0
        for rec in records(num_names, per_record):
            pub.send_multipart([b"metrics", json.dumps(rec).encode()])
            total += len(rec["values"])
        # Taken all: the new exporter's counters add up; the old one's CPU time stops moving.
        last_cpu, still = -1.0, 0
        while time.monotonic() - t0 < READY_TIMEOUT_S:
            time.sleep(1.0)
            now = cpu_s(proc.pid)
            still = still + 1 if now - last_cpu < 0.05 else 0
            last_cpu = now
            if still >= 3:
                break
        feed_s = time.monotonic() - t0
        answers = [timed_get(url, headers) for _ in range(3)]
        text = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=600).read().decode()
        own = {k: float(v) for k, v in re.findall(r"^(telemetry_exporter_\w+) (\S+)$", text, re.M)}
        return {"case": "exporter", "values_sent": total, "feed_s": round(feed_s, 1),
                "peak_rss_mb": round(proc_mb(proc.pid, "VmHWM"), 1), "rss_after_mb": round(proc_mb(proc.pid, "VmRSS"), 1),
                "metrics_s": [round(s, 3) for s, _ in answers], "metrics_mb": round(answers[0][1] / 1e6, 3),
                "samples": sum(1 for line in text.splitlines() if line and not line.startswith("#")), "own": own}
    finally:
        stop(proc)
        pub.close(0)
        ctx.term()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", type=int, default=1_000_000)
    ap.add_argument("--per-record", type=int, default=1_000)
    ap.add_argument("--case", default="dashboard,exporter")
    ap.add_argument("--repo", type=Path, default=ROOT)
    ap.add_argument("--before", metavar="REV", help="run the consumers of REV (git archive into a temp dir)")
    ap.add_argument("--max-series", type=int)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--values", type=int, default=100)
    ap.add_argument("--ranges", type=int, default=0, help="concurrent full-range reads after the load")
    ap.add_argument("--memory-mb", type=int, help="the consumers' --memory-mb")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="consumer-memory-"))
    repo = args.repo
    try:
        if args.before:
            repo = tmp / "repo"
            repo.mkdir()
            archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(repo)], input=archive, check=True)
        out = []
        extra = ["--max-series", str(args.max_series)] if args.max_series else []
        extra += ["--memory-mb", str(args.memory_mb)] if args.memory_mb else []
        for case in args.case.split(","):
            if case == "dashboard":
                res = case_dashboard(repo, records(args.names, args.per_record), tmp / "dash", extra,
                                     concurrent=args.ranges)
            elif case == "points":
                long_run = ({"kind": "metrics", "t": 1.7e9 + s, "step": s,
                             "values": {f"train/v{i}": float((s * (i + 1)) % 1009) for i in range(args.values)}}
                            for s in range(1, args.steps + 1))
                res = case_dashboard(repo, long_run, tmp / "points", extra, case="points", concurrent=args.ranges)
            elif case == "exporter":
                res = case_exporter(repo, args.names, args.per_record, extra)
            else:
                raise SystemExit(f"--case {case}: expected dashboard, points or exporter")
            res["code"] = args.before or str(repo)
            print(json.dumps(res), flush=True)
            out.append(res)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
