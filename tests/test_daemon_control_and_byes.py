"""Three of the daemon's pieces alone: its control server (a real ROUTER socket, real requests with
and without the token), the hellos it keeps, and the byes it holds behind their client's records."""
from __future__ import annotations

import json
import types

import msgspec
import zmq

from telemetry.daemon import memory
from telemetry.daemon.byes import BYE_HOLD_MAX_S, BYE_HOLD_S, HeldByes
from telemetry.daemon.control_server import ControlServer
from telemetry.daemon.hellos import Hellos
from telemetry.shared.security.redact import Redactor
from telemetry.shared import control as control_protocol


class _Src:
    def __init__(self, received: int, sent: int) -> None:
        self.received, self.sent = received, sent

    def transit(self) -> int:
        return self.sent - self.received


def _bye(src: int, rank: int = 0):
    return types.SimpleNamespace(src=src, rank=rank)


def test_a_bye_with_nothing_on_its_way_is_not_held():
    byes = HeldByes()
    assert not byes.hold(_bye(1), _Src(5, 5), now=0.0)
    assert not byes.hold(_bye(2), None, now=0.0)       # a client nobody accounted
    assert len(byes) == 0


def test_a_held_bye_goes_once_its_records_are_in_or_stop_coming_or_at_the_latest():
    byes = HeldByes()
    a, b, c = _bye(1), _bye(2), _bye(3)
    srcs = {1: _Src(0, 10), 2: _Src(0, 10), 3: _Src(0, 10)}
    assert all(byes.hold(x, srcs[x.src], now=0.0) for x in (a, b, c))
    assert byes.release(1.0, srcs) == [] and len(byes) == 3
    srcs[1].received = 10                               # all of a's records are in
    srcs[3].received = 4                                # c's still come: its hold starts again
    assert byes.release(1.5, srcs) == [a]
    assert byes.release(BYE_HOLD_S + 0.1, srcs) == [b]  # b's stopped coming
    for t in range(3, int(BYE_HOLD_MAX_S)):             # c's keep trickling in: held, up to the maximum
        srcs[3].received += 1
        srcs[3].sent += 1
        assert byes.release(float(t), srcs) == [], t
    assert byes.release(BYE_HOLD_MAX_S, srcs) == [c] and len(byes) == 0


def test_a_drain_releases_every_held_bye_in_the_order_they_came():
    byes = HeldByes()
    srcs = {1: _Src(0, 10), 2: _Src(0, 10)}
    a, b = _bye(1), _bye(2)
    byes.hold(a, srcs[1], 0.0)
    byes.hold(b, srcs[2], 0.0)
    assert byes.release(0.1, srcs, everything=True) == [a, b] and len(byes) == 0


def test_the_control_server_answers_status_ping_and_drain_with_the_token_only(tmp_path):
    ctx = zmq.Context()
    drains = []
    srv = ControlServer(ctx, status=lambda: {"records_in": 7}, on_drain=lambda: drains.append(1))
    endpoint = f"ipc://{tmp_path}/control"
    srv.sock.bind(endpoint)
    srv.issue_token(endpoint)
    token = control_protocol.token_path(endpoint).read_text().split("\n")[0]   # (then, for TCP, its host)
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(endpoint)
    dec = msgspec.json.Decoder()
    try:
        def ask(body: dict) -> dict:
            req.send(msgspec.json.encode(body))
            while not req.poll(50):
                srv.serve()
            return dec.decode(req.recv())

        assert ask({"cmd": "status", "token": token}) == {"ok": True, "records_in": 7}
        assert ask({"cmd": "ping", "token": token}) == {"ok": True}
        bad = ask({"cmd": "status", "token": "not-it"})
        assert bad["ok"] is False and "token" in bad["error"]
        assert drains == []
        req.send(msgspec.json.encode({"cmd": "drain", "token": token}))
        for _ in range(100):
            srv.serve()
            if drains:
                break
            req.poll(10)
        assert drains == [1] and not req.poll(100)      # not answered before the drain is over
        srv.answer_drain({"ok": True, "drained": True})
        assert req.poll(2000) and dec.decode(req.recv()) == {"ok": True, "drained": True}
    finally:
        req.close()
        srv.close()
        ctx.term()
    assert not control_protocol.token_path(endpoint).exists()


def test_a_drain_requests_exit_code_and_exit_time_are_kept_for_the_script_exit_event(tmp_path):
    """`telemetry run`'s drain request carries the script's exit code and when it exited
    (exited_at, a unix time): exit_data is what the drain's script_exit event says. A bad
    exited_at (not a finite number) is left out, the exit code kept; no exit code, no event."""
    ctx = zmq.Context()
    made = []

    def drain(body: str) -> dict | None:
        """`body` as the drain request of a daemon of its own (a daemon drains once: a drain
        request read after its drain began is another's, answered, its exit code not taken)."""
        srv = ControlServer(ctx, status=lambda: {}, on_drain=lambda: None)
        endpoint = f"ipc://{tmp_path}/control{len(made)}"
        srv.sock.bind(endpoint)
        srv.issue_token(endpoint)
        req = ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(endpoint)
        made.extend((req, srv))
        token = control_protocol.token_path(endpoint).read_text().split("\n")[0]   # (then, for TCP, its host)
        req.send((f'{{"cmd": "drain", "token": "{token}"' + body).encode())
        while not srv._drain_requesters:
            req.poll(10)
            srv.serve()
        srv.answer_drain({"ok": True})
        assert req.poll(2000)
        req.recv()
        return srv.exit_data

    try:
        assert drain("}") is None
        assert drain(', "exit_code": 1, "exited_at": 1800000000.25}') == {"exit_code": 1, "exited_at": 1_800_000_000.25}
        # Python's json reads NaN, Infinity and 1e400 (an infinity) too: none is a time.
        for bad in ('"soon"', "true", "null", "[1.0]", "NaN", "Infinity", "1e400"):
            assert drain(f', "exit_code": 137, "exited_at": {bad}}}') == {"exit_code": 137}, bad
    finally:
        for x in made:
            x.close()
        ctx.term()


def test_a_drain_request_during_the_drain_is_answered_marked_and_its_exit_code_not_taken(tmp_path):
    ctx = zmq.Context()
    srv = ControlServer(ctx, status=lambda: {}, on_drain=lambda: None)
    endpoint = f"ipc://{tmp_path}/control"
    srv.sock.bind(endpoint)
    srv.issue_token(endpoint)
    token = control_protocol.token_path(endpoint).read_text().split("\n")[0]
    first, late = ctx.socket(zmq.REQ), ctx.socket(zmq.REQ)
    try:
        for r in (first, late):
            r.setsockopt(zmq.LINGER, 0)
            r.connect(endpoint)
        first.send(f'{{"cmd": "drain", "token": "{token}", "exit_code": 0}}'.encode())
        while not srv._drain_requesters:
            first.poll(10)
            srv.serve()
        srv.draining = True              # the daemon serves its socket from within the drain
        late.send(f'{{"cmd": "drain", "token": "{token}", "exit_code": 9}}'.encode())
        assert srv.sock.poll(5000)       # it has arrived, unread: answer_drain reads it
        srv.answer_drain({"ok": True, "records_in": 5})
        assert first.poll(2000) and late.poll(2000)
        assert json.loads(first.recv()) == {"ok": True, "records_in": 5}
        assert json.loads(late.recv()) == {"ok": True, "records_in": 5, "drain_under_way": True}
        assert srv.exit_data == {"exit_code": 0}
    finally:
        first.close()
        late.close()
        srv.close()
        ctx.term()


def test_telemetry_runs_drain_request_says_when_the_script_exited(monkeypatch):
    """`telemetry run` sends the script's exit code and exited_at (stamped when its wait returned)."""
    from telemetry.shared import control
    from telemetry.tools import run

    sent = []
    monkeypatch.setattr(control, "request", lambda *a, **kw: sent.append(kw) or {"ok": True})
    run._drain(types.SimpleNamespace(wait=lambda timeout=None: 0, poll=lambda: None), "/nonexistent", "/nonexistent",
               1, 1_800_000_000.5, 102.0)
    (kw,) = sent
    assert kw["exit_code"] == 1 and kw["extra"] == {"exited_at": 1_800_000_000.5}
    assert kw["timeout_s"] == 102.0          # the drain's own deadline and more, not a fixed minute


def test_hellos_are_redacted_bounded_in_ranks_and_a_world_size_believed_only_when_sane(caplog, monkeypatch):
    monkeypatch.setattr("telemetry.daemon.hellos.MAX_WORLD_SIZE", 8)   # the real bound is 65,536
    MAX_WORLD_SIZE = 8
    shed = memory.Shed()
    hellos = Hellos(memory.HelloInfos(1 << 20, shed), Redactor())
    info = hellos.take(0, {"world_size": 4, "config": {"wandb": {"api_key": "s3cret-value"}}})
    assert "s3cret-value" not in repr(info) and hellos.by_rank[0] is info
    assert hellos.world_size(0, info) == 4
    for bad in (True, 0, -1, 2.0, MAX_WORLD_SIZE + 1, "4"):
        assert hellos.world_size(1, {"world_size": bad}) is None, bad
    assert sum("world_size" in r.getMessage() for r in caplog.records) == 1     # told once
    assert hellos.world_size(1, {}) is None
    for rank in range(1, MAX_WORLD_SIZE + 5):
        hellos.take(rank, {"rank": rank})
    assert len(hellos.by_rank) == MAX_WORLD_SIZE
    assert hellos.num_not_kept == 5 and hellos.num_in == MAX_WORLD_SIZE + 5
    hellos.take(0, {"again": 1})                     # a rank already kept is updated, not refused
    assert hellos.by_rank[0] == {"again": 1} and hellos.num_not_kept == 5
