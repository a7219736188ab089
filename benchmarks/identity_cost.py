"""What the head's per-frame identity check costs (telemetry/shared/security/identity.py).

    .venv/bin/python benchmarks/identity_cost.py [--frames 20000] [--rounds 5] [--values 50]

A CURVE PULL socket set up as a head's remote ingest (DaemonSecurity: ZAP, the node listener's
domain) receives `--frames` node records (one metrics record of `--values` values, as a node's
forward sink sends) from a client with an allowed, bound key; once they are all queued in
libzmq, they are read off as the daemon's intake reads them, alternately:
    plain   sock.recv(NOBLOCK) through loops.read_frames_upto (what every daemon did before)
    guard   NodeGuard.recv through the same loop (a head with CURVE node links now)
Prints microseconds per frame for each, per round and the medians, and the difference.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protocol import encode_metrics  # noqa: E402
from telemetry.daemon.loops import read_frames_upto  # noqa: E402
from telemetry.shared.security.curve import DaemonSecurity, SecurityConfig, apply_client_curve  # noqa: E402
from telemetry.shared.security.identity import write_allowed  # noqa: E402
from telemetry.tools.keygen import make_pair  # noqa: E402


def _read_all(recv, n: int) -> float:
    t0 = time.perf_counter()
    got = 0
    while got < n:
        frames, _ = read_frames_upto(recv, zmq.Again, 1024, 1 << 20)
        got += len(frames)
    return time.perf_counter() - t0


def _fill(push: zmq.Socket, pull: zmq.Socket, frames: list[bytes]) -> None:
    for f in frames:
        push.send(f)
    # Wait until libzmq holds them all on the receiving side (POLLIN alone says one is there).
    deadline = time.monotonic() + 60
    while pull.getsockopt(zmq.EVENTS) & zmq.POLLIN == 0 or push.getsockopt(zmq.EVENTS) & zmq.POLLOUT == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.5)     # the I/O thread moves the last batches in; no counter says when


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--values", type=int, default=50)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="identity-cost-"))
    keys = work / "keys"
    make_pair(keys, "head")
    allowed = keys / "allowed"
    allowed.mkdir(mode=0o700)
    pub, _ = make_pair(keys, "node0")
    write_allowed(allowed, pub, 0)
    ctx = zmq.Context()
    sec = DaemonSecurity(ctx, SecurityConfig(server_secret_key=str(keys / "head.key_secret"),
                                             allowed_clients_dir=str(allowed), curve_loopback=True), {})
    pull = ctx.socket(zmq.PULL)
    pull.rcvhwm = 0
    sec.prepare(pull, "tcp://127.0.0.1:0", "remote_ingest")
    pull.bind("tcp://127.0.0.1:0")
    guard = sec.node_guard(pull, "tcp://127.0.0.1:1")
    push = ctx.socket(zmq.PUSH)
    push.sndhwm = 0
    apply_client_curve(push, str(keys / "head.key"), str(keys / "node0.key_secret"))
    push.connect(pull.getsockopt(zmq.LAST_ENDPOINT).decode())
    values = {f"train/metric_{i}": 1.0 + i for i in range(a.values)}
    frames = [encode_metrics(7, 0, i, 0, time.time_ns(), i, values) for i in range(a.frames)]
    plain = functools.partial(pull.recv, zmq.NOBLOCK)
    out: dict[str, list[float]] = {"plain": [], "guard": []}
    for _ in range(a.rounds):
        for name, recv in (("plain", plain), ("guard", guard.recv)):
            _fill(push, pull, frames)
            out[name].append(_read_all(recv, a.frames) / a.frames * 1e6)
    assert guard.num_refused == 0
    for name, xs in out.items():
        print(f"{name:6s} µs/frame: " + " ".join(f"{x:.2f}" for x in xs) + f"   median {statistics.median(xs):.2f}")
    print(f"guard - plain: {statistics.median(out['guard']) - statistics.median(out['plain']):.2f} µs/frame "
          f"({a.frames} frames of {len(frames[0])} B, {a.rounds} rounds)")
    push.close(0)
    pull.close(0)
    sec.close()
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
