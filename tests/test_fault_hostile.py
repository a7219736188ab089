"""Hostile input at the ingest socket: the daemon never crashes, counts every bad frame, loses
none of the valid traffic around it, and its memory stays bounded."""
from __future__ import annotations

import random
import socket
import time

import msgpack
import psutil
import pytest
import zmq

from protocol import MAX_FRAME_BYTES, MalformedRecord, decode, encode_metrics
from telemetry.client import TelemetryClient
from testkit.daemon_proc import raw_push

NUM_STEPS = 400


def hostile_frames(seed: int = 0) -> dict[str, list[bytes]]:
    """Frames that must each be refused by the decoder (checked here before use)."""
    rng = random.Random(seed)
    good = encode_metrics(99, 5, 0, 0, 1000, 7, {"train/loss": 1.0, "train/lr": 0.1})
    head = msgpack.packb([3, 1, 1, 0, 0, 0, 0, "x"])
    frames = {
        "random_bytes": [rng.randbytes(rng.randint(0, 300)) for _ in range(300)],
        "truncated": [good[:rng.randint(0, len(good) - 1)] for _ in range(100)],
        "deeply_nested": [b"\x99" + head[1:] + b"\x81\xa1a" + b"\x91" * d + b"\xc0" for d in (10_000, 100_000)],
        "wrong_types": [msgpack.packb(x) for x in (
            # A bad value beside a bad header or step (a bad value alone costs only itself: test_values_refused.py).
            [2, 1, 1, 0, 0, 0, 0, -5, {"x": "text"}], [2, 1, 1, 0, 0, 0, 0, "5", {}], [2, 1, 1, -1, 0, 0, 0, 5, {}],
            [2, 1, 1, -1, 0, 0, 0, 5, {1: 2.0}], [9, 1, 1, 0, 0, 0, 0, 5, {}], [3, 1, 1, 0, 0, 0, 0, "", {}],
            [2, 1, 1, 0, 0, 0, 0, 5, [1.0]], {"kind": 2}, "metrics", 42, None, [], [2, 1, (1 << 64) - 1, 0, 0, 0, 0, 5, {}],
        )] * 5,
        "wrong_versions": [msgpack.packb([2, v, 1, 0, 0, 0, 0, 5, {"x": 1.0}]) for v in (0, 2, 99, -1, 1 << 40)] * 10,
    }
    for name, fs in frames.items():
        for f in fs:
            with pytest.raises(MalformedRecord):
                decode(f)
    return frames


def _raw_tcp_garbage(port: int, payloads: list[bytes]) -> None:
    for p in payloads:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(p)
                time.sleep(0.01)
        except OSError:
            pass   # the daemon may hang up first; that is the point


def test_hostile_input_is_counted_and_valid_traffic_survives(make_daemon):
    d = make_daemon(transport="tcp", world_size=1, per_rank=True)
    proc = psutil.Process(d.proc.pid)
    port = int(d.ingest.rsplit(":", 1)[1])
    frames = hostile_frames()
    num_bad = sum(len(v) for v in frames.values())
    multipart = [[b"\xc1bad", b"\xc1worse", b""] for _ in range(20)]      # each part is counted
    num_bad += sum(len(m) for m in multipart)

    tm = TelemetryClient(d.ingest, rank=0)
    for step in range(NUM_STEPS // 2):
        tm.log(step, {"train/loss": 1.0 + step})
    d.wait_for(lambda recs: any(r.get("step") == NUM_STEPS // 2 - 1 for r in recs))
    rss_before = proc.memory_info().rss

    ctx = zmq.Context()
    try:
        bad = raw_push(ctx, d.ingest)
        for fs in frames.values():
            for f in fs:
                bad.send(f)
        for m in multipart:
            bad.send_multipart(m)
        # Interleave valid traffic with the garbage, from the real client.
        for step in range(NUM_STEPS // 2, NUM_STEPS):
            tm.log(step, {"train/loss": 1.0 + step})
        tm.close()
        # Every refused frame is counted, exactly; none of them became a record.
        deadline = time.monotonic() + 120
        while d.status()["records_malformed"] < num_bad and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)
        assert d.status()["records_malformed"] == num_bad
        # Oversized frames on their own connection: libzmq drops that peer (MAXMSGSIZE).
        big = raw_push(ctx, d.ingest)
        for _ in range(3):
            big.send(b"\x00" * (MAX_FRAME_BYTES + 1))
            time.sleep(0.2)
        _raw_tcp_garbage(port, [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 4, random.Random(1).randbytes(4096),
                                b"\xff\xff\xff\xff" * 100] * 5)
        deadline = time.monotonic() + 120
        while True:
            st = d.status()
            conns = st["security"]["connections"]["ingest"]
            if (st["records_malformed"] >= num_bad and conns["handshake_failed"] >= 1
                    and conns["disconnected"] >= 3 + 15 or time.monotonic() > deadline):
                break
            time.sleep(0.2)
    finally:
        ctx.destroy(linger=0)
    rss_after = psutil.Process(d.proc.pid).memory_info().rss
    assert d.proc.poll() is None, "the daemon died"
    final = d.drain()
    # Raw TCP bytes not starting like ZMTP 3 are read by libzmq's ZMTP 1.0 compatibility as
    # frames: those are counted as malformed too, the rest as failed handshakes.
    assert final["records_malformed"] >= num_bad
    assert set(final["per_rank"]) == {"0"}
    # The valid client lost nothing: every record it sent arrived (hello + steps + bye).
    sent = tm.stats()["sent"]
    assert tm.stats()["dropped"] == 0
    assert final["per_rank"]["0"]["received"] == sent and final["per_rank"]["0"]["lost"] == 0
    assert sorted(r["step"] for r in d.read_jsonl("metrics", aggregated=False)) == list(range(NUM_STEPS))
    # Connection-level attacks are counted too (see telemetry/shared/security/watch.py for what is not).
    conns = final["security"]["connections"]["ingest"]
    assert conns["handshake_failed"] >= 1 and conns["disconnected"] >= 3 + 15
    # Bounded memory: 3 frames past MAXMSGSIZE and ~160 kB of junk cost no lasting growth.
    assert rss_after - rss_before < 64 * 2**20, (rss_before, rss_after)
