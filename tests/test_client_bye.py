"""The bye, a client's final seq and drop count, travels on a connection of its own at close
(telemetry/client/core.py): it must reach the daemon even when the records connection's tail
does not, and the daemon passes it on after that client's records, never before them."""
from __future__ import annotations

import signal
import threading
import time

from telemetry.client import TelemetryClient


def test_a_bye_that_arrives_first_goes_out_after_the_records(make_daemon):
    # The daemon is stopped while the client floods and starts to close, so its records queue
    # up on one connection while the bye waits on the other; libzmq then hands the daemon one
    # message per connection in turn: the bye arrives among the first.
    d = make_daemon(per_rank=True, world_size=1, config={"rcvhwm": 100})
    tm = TelemetryClient(d.ingest, rank=0, sndhwm=5000, linger_ms=20_000)
    tm.log(0, {"x": 0.0})
    d.wait_for(lambda recs: any(r.get("step") == 0 for r in recs), kind="metrics")
    d.proc.send_signal(signal.SIGSTOP)
    try:
        for i in range(1, 3001):
            tm.log(i, {"x": float(i)})
        closer = threading.Thread(target=tm.close, kwargs={"timeout_s": 20.0})
        closer.start()
        time.sleep(1.0)
    finally:
        d.proc.send_signal(signal.SIGCONT)
    closer.join(30)
    sent = tm.stats()
    final = d.drain()
    assert final["records_in_by_kind"]["bye"] == 1
    lines = [r for r in d.read_jsonl() if r.get("kind") in ("metrics", "bye") and r.get("rank") == 0]
    kinds = [r["kind"] for r in lines]
    assert kinds.count("bye") == 1 and kinds[-1] == "bye", kinds[-5:]
    # Everything the client tried is written or counted lost (over ipc, libzmq may discard the
    # tail a full queue held when the client hung up: counted in transit, not vanished).
    assert (len(lines) - 1) + final["records_lost"] == sent["seq"] - 2, (final, sent)   # - hello, bye
    assert final["records_lost_in_transit"] + final["records_dropped_by_clients"] == final["records_lost"]


def test_the_daemon_holds_an_early_bye_until_the_records_are_in(make_daemon):
    """Two connections of one client (src 9): its hello, then the bye on the other connection,
    then the records 0.5 s later on the first."""
    import zmq

    from protocol import encode_bye, encode_hello, encode_metrics

    d = make_daemon(per_rank=True, world_size=1)
    ctx = zmq.Context()
    rec_sock, bye_sock = d.push(ctx), d.push(ctx)
    try:
        rec_sock.send(encode_hello(9, 0, 0, 0, time.time_ns(), {"pid": 1}))
        d.wait_for(lambda _: d.status()["records_in_by_kind"]["hello"] == 1, kind="daemon")
        bye_sock.send(encode_bye(9, 0, 6, 0, time.time_ns(), {"sent": 7, "dropped": 0}))
        d.wait_for(lambda _: d.status()["records_in_by_kind"]["bye"] == 1, kind="daemon")
        time.sleep(0.5)
        for seq in range(1, 6):
            rec_sock.send(encode_metrics(9, 0, seq, 0, time.time_ns(), seq, {"x": 1.0}))
        final = d.drain()
    finally:
        bye_sock.close(0)
        rec_sock.close(0)
        ctx.term()
    assert final["records_lost"] == 0
    kinds = [r["kind"] for r in d.read_jsonl() if r.get("kind") in ("metrics", "bye") and r.get("rank") == 0]
    assert kinds == ["metrics"] * 5 + ["bye"], kinds
