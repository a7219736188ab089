"""The daemon's control endpoint: `telemetry status`, `telemetry drain` and pings.

A ROUTER socket; each request carries the endpoint's token (telemetry/shared/control.py: the
token file beside an ipc endpoint, 0600). `status` and `ping` are answered at once; a `drain`
is answered after the drain, with the final counters, so its requester learns how it ended.
What a status says is the daemon's (`status`, a callable); what a drain does too (`on_drain`).
"""
from __future__ import annotations

import json
import math
from typing import Callable

import msgspec
import zmq

from telemetry.shared import control as control_protocol
from telemetry.shared.numbers import is_number

_json = msgspec.json.Encoder()
MAX_REQUEST_BYTES = 1 << 16


class ControlServer:
    """Owns the control socket (bound by the daemon, which also puts it under its connection
    watch) and the token; `serve()` answers what is queued, never blocking."""

    def __init__(self, ctx: zmq.Context, status: Callable[[], dict], on_drain: Callable[[], None],
                 on_exclude: Callable[[dict], None] | None = None) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        self._status = status
        self._on_drain = on_drain
        self._on_exclude = on_exclude    # an exclude request's window (shared/control.py)
        self._token: str | None = None
        self._endpoint = ""
        self._drain_requesters: list[list[bytes]] = []
        self._late_requesters: list[list[bytes]] = []     # drain requests read during the drain
        self._ended = False                   # drained: answer_drain has run
        self.draining = False                 # served from within the drain (Daemon._serve_control_while_draining)
        self.exit_code: int | None = None     # a drain request's: the script's (shared/control.py)
        self.exited_at: float | None = None   # ... and when the script exited (unix time), where it says

    def issue_token(self, endpoint: str, curve_keys: tuple[bytes, bytes, bytes] | None = None) -> None:
        """Once bound: the token that requests must carry, written beside the endpoint; and where
        the socket is a CURVE server, the key pair this host's commands use (shared/control.py)."""
        self._endpoint = endpoint
        self._token = control_protocol.issue_token(endpoint)
        if curve_keys is not None:
            control_protocol.write_curve_keys(endpoint, curve_keys)

    def serve(self) -> None:
        while True:
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(parts) < 3 or parts[-2] != b"":
                continue  # not a REQ envelope; nothing sensible to answer
            ident, body = parts[:-1], parts[-1]
            cmd, error = control_protocol.parse_request(body, self._token)
            if cmd == "status":
                reply = {"ok": True, **self._status()}
            elif cmd == "ping":
                reply = {"ok": True}
            elif cmd == "exclude" and (self._ended or self.draining):
                # The goodput ledger has closed (or is closing) its books: a window now is never booked.
                reply = {"ok": False, "error": "exclude: the run has ended (the daemon is draining or has drained)"}
            elif cmd == "exclude":
                window = control_protocol.exclusion_of(body)
                if window is None or self._on_exclude is None:
                    reply = {"ok": False, "error": "exclude: start and end are unix times, end after start"
                             if window is None else "exclude: this daemon keeps no goodput ledger"}
                else:
                    self._on_exclude(window)
                    reply = {"ok": True, **window}
            elif cmd == "drain" and (self.draining or self._ended):
                # A drain already under way (another's request, a signal): answered with its final
                # counters, marked, as its exit code came too late to be taken (`telemetry run`
                # says so: the run lacks the script's exit code).
                self._late_requesters.append(ident)
                continue
            elif cmd == "drain":
                code = control_protocol.exit_code_of(body)
                if code is not None:
                    self.exit_code = code
                    self.exited_at = _exited_at_of(body)
                self._drain_requesters.append(ident)
                self._on_drain()
                continue  # answered after the drain, with the final counters
            else:
                reply = {"ok": False, "error": error}
            self._reply(ident, reply)

    @property
    def exit_data(self) -> dict | None:
        """The data of the drain's `script_exit` event: {"exit_code"} and, where the request said
        it, "exited_at" (when the script exited, by its launcher's clock: the goodput ledger ends
        the launch there, not at the event's own time, the drain's latency later); None without
        an exit code."""
        if self.exit_code is None:
            return None
        data: dict = {"exit_code": self.exit_code}
        if self.exited_at is not None:
            data["exited_at"] = self.exited_at
        return data

    def answer_drain(self, final: dict) -> None:
        """The drain is over: each requester gets the final counters, and so does a request that
        came since the socket was last served (a `telemetry status` or a second `telemetry
        drain` during the drain's last moments: the final counters are the daemon's status now)."""
        self._status = lambda: final
        self._on_drain = lambda: None
        self._ended = True
        self.serve()
        for ident in self._drain_requesters:
            self._reply(ident, final)
        for ident in self._late_requesters:
            self._reply(ident, {**final, "drain_under_way": True})
        self._drain_requesters.clear()
        self._late_requesters.clear()

    def close(self) -> None:
        """The socket (a reply still queued gets 200 ms) and the token file."""
        self.sock.close(linger=200)
        if self._endpoint:
            for path in (control_protocol.token_path(self._endpoint), control_protocol.curve_path(self._endpoint)):
                try:
                    path.unlink()
                except OSError:
                    pass

    def _reply(self, ident: list[bytes], reply: dict) -> None:
        try:
            self.sock.send_multipart([*ident, _json.encode(reply)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass


def _exited_at_of(frame: bytes) -> float | None:
    """A drain request's "exited_at" (parse_request accepted it): a finite number, else None (a
    bad one is ignored: the exit code still counts)."""
    try:
        at = json.loads(frame).get("exited_at")
    except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        return None
    return float(at) if is_number(at) and math.isfinite(at) else None
