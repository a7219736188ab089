"""A node's forwarder counts what it could not hand to its head: per node, what reached the head
+ what the node counted (dropped at its send queue, unsent on a link that never completed its
handshake, not confirmed at its close) accounts for every record it tried to send.

Real sockets on loopback: a "head" that accepts TCP and never speaks ZMTP, one that speaks ZMTP
but never reads until the node has closed, and one that reads (nothing is counted there)."""
from __future__ import annotations

import socket
import threading

import msgspec
import zmq

from telemetry.daemon.sinks.base import Out
from telemetry.daemon.sinks.forward import ForwardConfig, ForwardSink


def _metrics(step: int, num_values: int = 1) -> Out:
    values = {f"train/m{i}": 1.0 + step * 1e-3 + i for i in range(num_values)}
    rec = {"kind": "metrics", "step": step, "t": 1.7e9 + step, "values": values}
    return Out("metrics", rec, msgspec.json.encode(rec))


def _run_node(endpoint: str, num_steps: int, num_values: int = 1, **cfg) -> ForwardSink:
    sink = ForwardSink(ForwardConfig(endpoint=endpoint, node_rank=0, num_nodes=1, **cfg))
    sink.start()
    for first in range(0, num_steps, 100):
        sink.consume([_metrics(s, num_values) for s in range(first, min(num_steps, first + 100))])
    sink.flush()
    sink.close()
    return sink


def _read_all(pull: zmq.Socket, quiet_ms: int = 1000) -> int:
    n = 0
    while pull.poll(quiet_ms):
        pull.recv(zmq.NOBLOCK)
        n += 1
    return n


def _head_that_reads_late() -> tuple[zmq.Socket, int]:
    """A "head" whose queues are as small as libzmq and the kernel allow; it is read only after
    the node has closed. Returns the socket and its port."""
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 1)
    pull.setsockopt(zmq.RCVBUF, 4096)
    pull.setsockopt(zmq.LINGER, 0)
    return pull, pull.bind_to_random_port("tcp://127.0.0.1")


def test_a_head_that_never_speaks_zmtp_every_record_counted_unsent():
    # Accepts the TCP connection, reads the node's greeting and never answers: the handshake
    # never completes, so nothing the node queued can have reached it.
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(8)
    conns, stop = [], threading.Event()

    def accept() -> None:
        lst.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = lst.accept()
            except OSError:
                continue
            c.setblocking(False)
            conns.append(c)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        sink = _run_node(f"tcp://127.0.0.1:{lst.getsockname()[1]}", 500, close_linger_s=0.5)
    finally:
        stop.set()
        t.join(5)
        for c in conns:
            c.close()
        lst.close()
    s = sink.stats()
    assert conns, "the node never connected"
    # Every record tried (the hellos, the steps, the bye) is either refused by the send queue or counted unsent.
    assert s["refused_by_send_queue"] + s.get("unsent_no_handshake", 0) == s["seq"] and s["seq"] >= 502, s
    assert s["connects"] == 0 and not s["link_up"] and s["unconfirmed_at_close"] == 0, s


def test_a_head_that_never_reads_what_the_linger_leaves_is_counted_not_confirmed():
    pull, port = _head_that_reads_late()
    try:
        # Far more than the kernel's socket buffers hold (~1 KB records, 30 MB): the send queue
        # fills (drops) and is still full at the close.
        sink = _run_node(f"tcp://127.0.0.1:{port}", 30_000, num_values=60, close_linger_s=0.3, max_buffered=200)
        s = sink.stats()
        arrived = _read_all(pull)        # the head reads at last: what the node's kernel had taken
    finally:
        pull.close()
    assert s["connects"] >= 1, s
    assert s["refused_by_send_queue"] > 0, s           # the full queue, counted
    lost_at_close = s["seq"] - arrived - s["refused_by_send_queue"]
    assert lost_at_close > 0, (s, arrived)     # the linger ran out with records queued
    # Exact or within its stated bound: the node's counts + what arrived cover every record tried.
    assert 0 < lost_at_close <= s.get("unconfirmed_at_close", 0), (s, arrived)
    # The bound is the send queue's plus one engine batch (8 KiB of frames, each more than a record's
    # 16-byte envelope), not everything ever sent.
    assert s["unconfirmed_at_close"] <= 200 + 8192 // 16, s
    assert s["unsent_no_handshake"] == 0, s


def test_a_head_behind_its_node_still_gets_the_bye_with_the_final_seq():
    # The records' link is backed up (the head reads nothing until the node has closed, its send
    # queue full, what the linger leaves cut): the bye goes on a link of its own, so the head
    # learns the node's final seq and drop count, and can count exactly what never came.
    from protocol import KIND_BYE

    pull, port = _head_that_reads_late()
    try:
        sink = _run_node(f"tcp://127.0.0.1:{port}", 30_000, num_values=60, close_linger_s=0.5, max_buffered=200)
        s = sink.stats()
        frames = []
        while pull.poll(1000):
            frames.append(msgspec.msgpack.decode(pull.recv(zmq.NOBLOCK)))
    finally:
        pull.close()
    assert s["refused_by_send_queue"] > 0 and s["unconfirmed_at_close"] > 0, s    # backed up, cut at the close
    byes = [f for f in frames if f[0] == KIND_BYE]
    assert len(byes) == 1, (s, len(frames))
    # (kind, version, src, rank, seq, dropped, ...): the last seq, and every refusal counted in it.
    assert byes[0][2] == s["src"] and byes[0][4] == s["seq"] - 1 and byes[0][5] == s["refused_by_send_queue"], \
        (byes[0][:6], s)
    assert len(frames) < s["seq"] - s["refused_by_send_queue"], (len(frames), s)    # records were cut
    assert s["unsent_no_handshake"] == 0, s


def test_a_head_that_reads_nothing_else_is_counted():
    ctx = zmq.Context.instance()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    got = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set() or pull.poll(500):
            if pull.poll(100):
                got.append(pull.recv(zmq.NOBLOCK))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        sink = _run_node(f"tcp://127.0.0.1:{port}", 1000, close_linger_s=30.0)
    finally:
        stop.set()
        t.join(60)
        pull.close()
    s = sink.stats()
    assert s["connects"] >= 1 and s["refused_by_send_queue"] == 0, s
    assert s["unsent_no_handshake"] == 0 and s["unconfirmed_at_close"] == 0, s
    assert len(got) == s["seq"], (s, len(got))


def test_a_node_daemon_reports_what_its_head_never_took_in_status_and_drain(tmp_path):
    # A node daemon whose "head" accepts TCP and never speaks ZMTP: its ranks' steps are forwarded
    # into a link that never completes its handshake; the user sees the count at the drain and a
    # warning line in the daemon's log.
    from daemon_util import start_daemon

    from telemetry import TelemetryClient

    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(8)
    try:
        d = start_daemon(tmp_path, world_size=1, config={
            "pollers": {"nvml_enabled": False},
            "forward": {"endpoint": f"tcp://127.0.0.1:{lst.getsockname()[1]}", "node_rank": 0, "num_nodes": 1,
                        "close_linger_s": 0.5}})
        tm = TelemetryClient(d.ingest, rank=0)
        for step in range(1, 21):
            tm.log(step, {"train/loss": 1.0 / step})
        tm.close()
        d.wait_for(lambda recs: any(r.get("step") == 20 and "rank" not in r for r in recs if r["kind"] == "metrics"))
        live = d.status()["sinks"]["forward"]
        assert live["connects"] == 0 and not live.get("link_up"), live
        fwd = d.drain()["sinks"]["forward"]
    finally:
        lst.close()
    # Every record the forwarder tried (its hellos, 20 steps, the ranks' bye, its daemon records,
    # its own bye) is dropped at the socket or counted unsent; none reached a head.
    assert fwd["seq"] >= 22 and fwd["refused_by_send_queue"] + fwd.get("unsent_no_handshake", 0) == fwd["seq"], fwd
    assert "never completed its handshake" in d.output(), d.output()[-2000:]


def test_a_head_that_comes_up_during_the_close_gets_everything_and_the_bye():
    # Nothing listens while the node runs; the head binds while the node is closing: the close
    # gives the link its linger to complete a handshake, then everything goes, the bye on a link
    # of its own (it may come before the records: the head holds it until they are in).
    from protocol import KIND_BYE

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    ctx = zmq.Context.instance()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    sink = ForwardSink(ForwardConfig(endpoint=f"tcp://127.0.0.1:{port}", node_rank=0, num_nodes=1,
                                     close_linger_s=30.0, reconnect_ivl_s=0.05, reconnect_ivl_max_s=0.1))
    sink.start()
    sink.consume([_metrics(s) for s in range(50)])
    up = threading.Timer(0.5, lambda: pull.bind(f"tcp://127.0.0.1:{port}"))
    up.start()
    try:
        sink.close()
        up.join(10)
        kinds = []
        while pull.poll(1000):
            kinds.append(msgspec.msgpack.decode(pull.recv(zmq.NOBLOCK))[0])
    finally:
        up.cancel()
        pull.close()
    s = sink.stats()
    assert s["connects"] == 1 and s["unsent_no_handshake"] == s["unconfirmed_at_close"] == 0, s
    assert len(kinds) == s["seq"] and kinds.count(KIND_BYE) == 1, (s, kinds)


def test_a_head_behind_its_node_counts_the_node_exactly_from_its_bye(tmp_path):
    # A real head, stopped while the node queues records, continued during the node's close: the
    # bye, on its own link, reaches the head ahead of the backlog; the head holds it until the
    # records are in (or counted at its drain), and its own figures for the node add up to what
    # the node sent, its source closed by the bye.
    import os
    import signal
    import time

    from testkit.faults import Endpoints, free_port, launch

    remote = f"tcp://127.0.0.1:{free_port()}"
    head = launch(tmp_path / "head", Endpoints(), config={"pollers": {"nvml_enabled": False}},
                  extra=("--remote-ingest", remote), world_size=1)
    stopped = False
    try:
        sink = ForwardSink(ForwardConfig(endpoint=remote, node_rank=0, num_nodes=1, close_linger_s=2.0,
                                         max_buffered=100_000))
        sink.start()
        deadline = time.monotonic() + 60
        while sink.num_connects == 0 and time.monotonic() < deadline:    # a hang detector
            time.sleep(0.05)
            sink._check_link()
        assert sink.num_connects == 1
        os.kill(head.proc.pid, signal.SIGSTOP)
        stopped = True
        for first in range(0, 8_000, 100):
            sink.consume([_metrics(s, 100) for s in range(first, first + 100)])
        resume = threading.Timer(1.0, lambda: os.kill(head.proc.pid, signal.SIGCONT))
        resume.start()
        sink.close()
        resume.join(10)
        stopped = False
        final = head.drain(timeout_s=300)
    finally:
        if stopped:
            os.kill(head.proc.pid, signal.SIGCONT)
        head.stop()
    s = sink.stats()
    assert s["unsent_no_handshake"] == 0, s
    node = final["per_rank"]["0"]
    assert node["received"] + node["refused"] + node["lost"] == s["seq"] and node["open"] == 0, (node, s)


def test_a_head_gone_before_the_close_the_bye_is_counted_unsent(caplog):
    # The link was up, then the head went away: the bye's own link never completes a handshake
    # within the linger, so the bye cannot have left: counted unsent, said in a warning.
    import time

    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    # A linger long enough that the records' link, drained, is seen gone well within it on a
    # loaded box (the bye's link is given all of it, and never completes its handshake).
    sink = ForwardSink(ForwardConfig(endpoint=f"tcp://127.0.0.1:{port}", node_rank=0, num_nodes=1,
                                     close_linger_s=3.0))
    sink.start()
    sink.consume([_metrics(s) for s in range(10)])
    got = 0
    deadline = time.monotonic() + 60                     # a hang detector
    while (got < sink.seq or sink.num_connects == 0) and time.monotonic() < deadline:    # hellos, 10 steps
        sink._check_link()        # (a handshake sends the hello again, with the link's address)
        if pull.poll(100):
            pull.recv(zmq.NOBLOCK)
            got += 1
    pull.close()
    before = sink.seq
    with caplog.at_level("WARNING", logger="telemetry.daemon.sinks.forward"):
        sink.close()
    s = sink.stats()
    assert got == before and s["connects"] == 1, (got, s)
    assert s["unsent_no_handshake"] == 1 and s["seq"] == before + 1, s     # the bye, and only it
    assert "the bye's link" in caplog.text and "never completed its handshake" in caplog.text, caplog.text
    # The records' link had nothing queued at the close: nothing of it is unconfirmed, however
    # long the bye's link was waited for.
    assert s["unconfirmed_at_close"] == 0 and "still queued" not in caplog.text, (s, caplog.text)


def test_a_close_without_linger_still_hands_the_bye_to_a_head_that_is_there():
    # close_linger_s: 0 (a node that must not wait for its queue at its end): the bye's own link
    # still gets the time to complete its handshake, so a head that is there gets the bye and its
    # final seq, close after close.
    import time

    from protocol import KIND_BYE

    for attempt in range(3):
        pull = zmq.Context.instance().socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        kinds: list[int] = []
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                if pull.poll(50):
                    kinds.append(msgspec.msgpack.decode(pull.recv(zmq.NOBLOCK))[0])

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        sink = ForwardSink(ForwardConfig(endpoint=f"tcp://127.0.0.1:{port}", node_rank=0, num_nodes=1,
                                         close_linger_s=0.0))
        sink.start()
        sink.consume([_metrics(s) for s in range(10)])
        deadline = time.monotonic() + 60                     # a hang detector
        while (len(kinds) < sink.seq or sink.num_connects == 0) and time.monotonic() < deadline:
            sink._check_link()
            time.sleep(0.02)
        sink.close()
        deadline = time.monotonic() + 10
        while KIND_BYE not in kinds and time.monotonic() < deadline:
            time.sleep(0.02)
        stop.set()
        reader.join()
        pull.close()
        s = sink.stats()
        assert kinds.count(KIND_BYE) == 1 and s["unsent_no_handshake"] == 0, (attempt, kinds, s)


def test_the_bye_goes_over_curve_with_keys_read_at_start(tmp_path):
    # A CURVE head; the node's key files are gone by its close (a job's secrets cleaned up
    # early): the bye's own link still speaks with the keys read at start, and the head gets it.
    from protocol import KIND_BYE
    from telemetry.shared.security.curve import load_secret_key
    from testkit.faults import node_keys

    keys, _ = node_keys(tmp_path, 1)
    server_public, server_secret = load_secret_key(keys / "head.key_secret")
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.curve_server = True
    pull.curve_publickey, pull.curve_secretkey = server_public, server_secret
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    try:
        sink = ForwardSink(ForwardConfig(endpoint=f"tcp://127.0.0.1:{port}", node_rank=0, num_nodes=1,
                                         server_public_key=str(keys / "head.key"),
                                         client_secret_key=str(keys / "node0.key_secret"), close_linger_s=5.0))
        sink.start()
        sink.consume([_metrics(s) for s in range(20)])
        for f in keys.glob("node0.key*"):
            f.unlink()
        sink.close()
        kinds = []
        while pull.poll(1000):
            kinds.append(msgspec.msgpack.decode(pull.recv(zmq.NOBLOCK))[0])
    finally:
        pull.close()
    s = sink.stats()
    assert s["curve"], s
    assert len(kinds) == s["seq"] and kinds.count(KIND_BYE) == 1, (s, kinds)
    assert s["unsent_no_handshake"] == s["unconfirmed_at_close"] == 0, s


def test_a_head_that_never_links_is_said_once_while_the_node_runs(caplog, monkeypatch, tmp_path):
    # A head endpoint whose name does not resolve (a typo in a cluster's config): the node says
    # so once NO_LINK_WARN_S after its start, naming the cause, not only at its drain.
    import time

    from telemetry.daemon.sinks import forward
    from testkit.faults import node_keys

    monkeypatch.setattr(forward, "NO_LINK_WARN_S", 2.0)
    keys, _ = node_keys(tmp_path, 1)
    sink = ForwardSink(ForwardConfig(endpoint="tcp://nohost.invalid:5557", node_rank=0, num_nodes=1,
                                     server_public_key=str(keys / "head.key"),
                                     client_secret_key=str(keys / "node0.key_secret"), close_linger_s=0.0))
    with caplog.at_level("WARNING", logger="telemetry.daemon.sinks.forward"):
        sink.start()
        sink.consume([_metrics(s) for s in range(3)])
        sink.flush()
        assert "no link to the head" not in caplog.text      # not before its time
        time.sleep(2.1)
        for _ in range(3):
            sink.flush()
        sink.close()
    said = [r.getMessage() for r in caplog.records if "no link to the head daemon" in r.getMessage()]
    assert len(said) == 1 and "nohost.invalid does not resolve" in said[0], caplog.text
    assert sink.stats()["unsent_no_handshake"] == sink.seq, sink.stats()
