"""Transports for `tm.log()` at a training loop's cadence, measured outside the client (issue 56).

In one process, interleaved in blocks (order flipped each round), the caller's cost of one record
of 10 floats a step, after a sleep of --cadence between steps:
- raw: msgpack + a zmq PUSH send(NOBLOCK) over ipc (the floor the issue measures against);
- tm.log: the shipped client on the same kind of socket;
- dgram: msgpack + a non-blocking send on a connected AF_UNIX SOCK_DGRAM socket (a system call on
  the caller's thread, no I/O thread to wake in the sending process);
- ring: msgpack + a copy into a shared-memory ring (a file mmapped by both) that the receiver
  polls every 5 ms (no system call at all on the caller's thread).
One receiver process reads all four. Reported per variant: the caller's time a call (median,
p99), the sending process's CPU a call (every thread) and the receiver's, each less what the same
number of empty steps cost (an empty block in every round: at short cadences the difference of
two large numbers, read it across runs). A prototype for choosing a design: no wrap in its ring (sized for a run),
no accounting, no fork handling.

    .venv/bin/python -m benchmarks.transport_designs --cadence 0.1 --calls 40 --rounds 3
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import msgpack
import zmq

RING_BYTES = 4 << 20
HDR = 64                      # [bytes written u64][bytes read u64], then the records: [len u32][frame]
POLL_MS = 5


def receiver(d: str) -> None:
    ctx = zmq.Context(1)
    pull = ctx.socket(zmq.PULL)
    pull.bind(f"ipc://{d}/z")
    dg = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dg.bind(f"{d}/d")
    dg.setblocking(False)
    fd = os.open(f"{d}/r", os.O_RDWR)
    mm = mmap.mmap(fd, RING_BYTES + HDR)
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    poller.register(dg.fileno(), zmq.POLLIN)
    n = {"zmq": 0, "dgram": 0, "ring": 0}
    print("ready", flush=True)
    while True:
        ev = dict(poller.poll(POLL_MS))
        if pull in ev:
            while True:
                try:
                    f = pull.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if f == b"stop":
                    print(json.dumps(n), flush=True)
                    os._exit(0)
                n["zmq"] += 1
        if dg.fileno() in ev:
            while True:
                try:
                    dg.recv(65536)
                except BlockingIOError:
                    break
                n["dgram"] += 1
        w, r = struct.unpack_from("<QQ", mm, 0)
        while r < w:
            ln, = struct.unpack_from("<I", mm, HDR + r)
            mm[HDR + r + 4:HDR + r + 4 + ln]
            r += 4 + ln
            n["ring"] += 1
        struct.pack_into("<Q", mm, 8, r)


def _cpu_s(pid: int) -> float:
    """Every thread's CPU time of `pid` (schedstat: nanoseconds)."""
    t = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            t += int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
        except OSError:
            pass
    return t / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cadence", type=float, default=0.001, help="seconds slept between calls")
    ap.add_argument("--calls", type=int, default=600, help="calls a block")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--receiver", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.receiver:
        receiver(a.receiver)
        return 0
    from telemetry import TelemetryClient

    d = tempfile.mkdtemp(prefix="transport-designs-")
    with open(f"{d}/r", "wb") as f:
        f.truncate(RING_BYTES + HDR)
    rp = subprocess.Popen([sys.executable, "-m", "benchmarks.transport_designs", "--receiver", d],
                          stdout=subprocess.PIPE, text=True)
    assert rp.stdout.readline().strip() == "ready"
    ctx = zmq.Context(1)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 10_000)
    push.connect(f"ipc://{d}/z")
    dg = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dg.connect(f"{d}/d")
    dg.setblocking(False)
    mm = mmap.mmap(os.open(f"{d}/r", os.O_RDWR), RING_BYTES + HDR)
    tm = TelemetryClient(f"ipc://{d}/z", rank=0)
    pack = msgpack.Packer().pack
    values = {f"train/m{i}": 1.0 + i for i in range(10)}
    written = [0]

    def raw(step: int) -> None:
        push.send(pack((1, 1, 7, 0, step, 0, time.time_ns(), step, values)), zmq.NOBLOCK)

    def tm_log(step: int) -> None:
        tm.log(step, values)

    def dgram(step: int) -> None:
        try:
            dg.send(pack((1, 1, 7, 0, step, 0, time.time_ns(), step, values)))
        except BlockingIOError:
            pass

    def ring(step: int) -> None:
        b = pack((1, 1, 7, 0, step, 0, time.time_ns(), step, values))
        w = written[0]
        if w + 4 + len(b) > RING_BYTES:
            return
        struct.pack_into("<I", mm, HDR + w, len(b))
        mm[HDR + w + 4:HDR + w + 4 + len(b)] = b
        written[0] = w = w + 4 + len(b)
        struct.pack_into("<Q", mm, 0, w)          # published after the record (x86: stores in order)

    variants = {"none": None, "raw": raw, "tm.log": tm_log, "dgram": dgram, "ring": ring}
    res = {k: {"t": [], "cpu": 0.0, "rcpu": 0.0} for k in variants}

    def block(f) -> tuple[float, float, list[int]]:
        ts = []
        c0, r0 = time.process_time(), _cpu_s(rp.pid)
        for i in range(a.calls):
            time.sleep(a.cadence)
            t0 = time.perf_counter_ns()
            if f is not None:
                f(i)
            ts.append(time.perf_counter_ns() - t0)
        time.sleep(0.05)
        return time.process_time() - c0, _cpu_s(rp.pid) - r0, ts

    for rnd in range(a.rounds):
        for k in (list(variants) if rnd % 2 == 0 else list(variants)[::-1]):
            cpu, rcpu, ts = block(variants[k])
            res[k]["t"] += ts
            res[k]["cpu"] += cpu
            res[k]["rcpu"] += rcpu
    tm.close()
    push.send(b"stop")
    got = rp.stdout.readline().strip()
    rp.wait(10)
    n = a.calls * a.rounds
    out = {"cadence_s": a.cadence, "load": open("/proc/loadavg").read().split()[:3], "received": json.loads(got)}
    for k, v in res.items():
        if k == "none":          # the empty blocks, in every round: what a call's CPU is counted beyond
            continue
        t = sorted(v["t"])
        out[k] = {"median_us": round(statistics.median(t) / 1e3, 2), "p99_us": round(t[int(0.99 * len(t))] / 1e3, 2),
                  "cpu_per_call_us": round((v["cpu"] - res["none"]["cpu"]) / n * 1e6, 1),
                  "receiver_cpu_per_call_us": round((v["rcpu"] - res["none"]["rcpu"]) / n * 1e6, 1)}
        out[k]["ratio_to_raw"] = round(out[k]["median_us"] / out["raw"]["median_us"], 2)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
