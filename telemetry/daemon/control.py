"""Control socket (REP): one JSON request, one JSON reply.

    {"cmd": "status"}  -> the daemon's counters (see Daemon.status)
    {"cmd": "drain"}   -> stop intake, drain every queue, flush, fsync; the reply comes once that is
                          done and carries the final counters; then the daemon exits
    {"cmd": "ping"}    -> {"ok": true}
Requests are size-bounded and anything that is not such an object gets {"ok": false, "error": ...}.
"""
from __future__ import annotations

import json

MAX_REQUEST_BYTES = 4096


def parse_request(frame: bytes) -> tuple[str | None, str]:
    """(command, error): command is None when the request is not understood."""
    if len(frame) > MAX_REQUEST_BYTES:
        return None, "request too large"
    try:
        req = json.loads(frame)
    except (ValueError, UnicodeDecodeError):
        return None, "not JSON"
    if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
        return None, 'expected {"cmd": "status" | "drain" | "ping"}'
    if req["cmd"] not in ("status", "drain", "ping"):
        return None, f"unknown command {req['cmd'][:40]!r}"
    return req["cmd"], ""


def request(endpoint: str, cmd: str, timeout_s: float = 5.0) -> dict:
    """Client side: send one command, wait at most `timeout_s` for the reply."""
    import zmq

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
    try:
        from telemetry.security.curve import apply_client_curve

        apply_client_curve(sock)   # keys from $TELEMETRY_CURVE_*: a control endpoint beyond loopback
        sock.connect(endpoint)
        sock.send(json.dumps({"cmd": cmd}).encode())
        return json.loads(sock.recv())
    except zmq.Again:
        raise TimeoutError(f"no answer from a telemetry daemon at {endpoint} within {timeout_s:g} s") from None
    finally:
        sock.close()
