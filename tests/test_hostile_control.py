"""A control request nested past json's recursion limit (4 kB of "[", within MAX_REQUEST_BYTES)
is answered "not JSON", and the server goes on answering: a real ROUTER socket and REQ client."""
from __future__ import annotations

import msgspec
import zmq

from telemetry.daemon.control_server import ControlServer
from telemetry.shared import control as control_protocol


def test_a_deeply_nested_request_is_refused_and_the_server_goes_on(tmp_path):
    ctx = zmq.Context()
    srv = ControlServer(ctx, status=lambda: {"records_in": 7}, on_drain=lambda: None)
    endpoint = f"ipc://{tmp_path}/control"
    srv.sock.bind(endpoint)
    srv.issue_token(endpoint)
    token = control_protocol.token_path(endpoint).read_text().split("\n")[0]   # (then, for TCP, its host)
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(endpoint)
    try:
        def ask(body: bytes) -> dict:
            req.send(body)
            while not req.poll(50):
                srv.serve()
            return msgspec.json.decode(req.recv())

        deep = b"[" * (control_protocol.MAX_REQUEST_BYTES - 1)
        assert ask(deep) == {"ok": False, "error": "not JSON"}
        assert control_protocol.exit_code_of(deep) is None
        assert ask(msgspec.json.encode({"cmd": "status", "token": token})) == {"ok": True, "records_in": 7}
    finally:
        req.close()
        srv.close()
        ctx.term()
