"""Control socket (ROUTER): one JSON request, one JSON reply.

    {"cmd": "status", "token": T}  -> the daemon's counters (see Daemon.status)
    {"cmd": "drain", "token": T}   -> stop intake, drain every queue, flush, fsync; the reply comes
                                      once that is done and carries the final counters; then the
                                      daemon exits. An optional "exit_code" (int): the script's, as
                                      its launcher saw it (`telemetry run`): the run ends with it;
                                      with it an optional "exited_at" (a finite unix time): when
                                      the script exited (the goodput ledger's end of its launch)
    {"cmd": "ping"}                -> {"ok": true} (no token: it tells nothing)
    {"cmd": "exclude", "token": T, "start": S, "end": E, "reason": R}
                                   -> the daemon writes a goodput/exclude event (data start, end:
                                      unix times, reason: text) into the run: planned maintenance
                                      the goodput ledger takes out of the wall (`telemetry goodput
                                      --exclude`; telemetry/shared/goodput.py, `excluded`)

The token is the control socket's own credential: reaching the socket is not enough (any local
user can connect to loopback TCP; under CURVE every allow-listed node key can). The daemon makes
a random one at start and writes it, readable only by its owner, beside the socket: for
ipc://PATH in PATH.token, for TCP in <runtime dir>/control-<port>.token. `request` reads it from
there, or from $TELEMETRY_CONTROL_TOKEN (a consumer on another host). Requests are size-bounded
and anything that is not such an object gets {"ok": false, "error": ...}.

A control socket that is a CURVE server (TCP with `security.curve_loopback`, or beyond loopback)
admits only allowed keys. So that `telemetry status` and `drain` on the daemon's own host need no
key of their own, the daemon makes a key pair for them at start, allowed for its lifetime on that
socket only (never on a node listener), and writes it beside the token, under the same rules
(0600, the owner's): <token path without .token>.curve, three z85 lines (the server's public
key, the client's public and secret keys). `request` uses it unless $TELEMETRY_CURVE_* name keys.
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
import time
from pathlib import Path
from typing import Callable

from telemetry.shared.numbers import is_int, is_number

MAX_REQUEST_BYTES = 4096
ENV_TOKEN = "TELEMETRY_CONTROL_TOKEN"
COMMANDS = ("status", "drain", "ping", "exclude")
MAX_REASON_CHARS = 200     # an exclusion's reason, kept in the event
_OPEN = ("ping",)      # commands that need no token


def token_path(endpoint: str) -> Path:
    """Where the daemon serving `endpoint` keeps its control token."""
    from telemetry.shared import endpoints

    if endpoint.startswith("ipc://"):
        return Path(os.path.abspath(endpoint[len("ipc://"):] + ".token"))
    port = endpoint.rsplit(":", 1)[-1]
    return endpoints.runtime_dir() / f"control-{port}.token"


def issue_token(endpoint: str) -> str:
    """Make a token and write it (0600, never through a symlink) where `request` looks."""
    from telemetry.shared import endpoints

    if not endpoint.startswith("ipc://"):
        endpoints.runtime_dir(create=True)
    token = secrets.token_hex(16)
    # For TCP, the host it is bound to on the second line: the file is found by port alone, and
    # read_token gives it only to a request for that listener (never to another host's, or to
    # another loopback address's, on the same port).
    host = "" if endpoint.startswith("ipc://") else "\n" + _host_of(endpoint)
    _write_private(token_path(endpoint), token + host + "\n", "the control token")
    return token


_WILDCARD = ("*", "0.0.0.0", "::", "")
_LOOPBACK_NAMES = ("localhost", "ip6-localhost")


def _host_of(endpoint: str) -> str:
    from telemetry.shared import endpoints

    return endpoints.tcp_host(endpoint).lower()


def _same_listener(asked: str, bound: str) -> bool:
    """Is a request for host `asked` (at the token's port) one for the daemon bound to `bound`?
    Its own address, a loopback name for its loopback address, or, bound to every address,
    this host's loopback or name; never another host, nor another loopback address (anyone
    may listen on 127.0.0.2 at the same port)."""
    import socket

    from telemetry.shared import endpoints

    if asked == bound:
        return True
    if bound in _WILDCARD:
        return (endpoints.is_loopback_host(asked) or asked in _LOOPBACK_NAMES
                or asked in (socket.gethostname().lower(), socket.getfqdn().lower()))
    if asked in _LOOPBACK_NAMES:
        return bound in ("127.0.0.1", "::1")
    try:                # a name for the bound address (the head's host name): what it resolves to
        return bound in {info[4][0] for info in socket.getaddrinfo(asked, None)}
    except (OSError, UnicodeError):
        return False


def curve_path(endpoint: str) -> Path:
    """Where the daemon serving `endpoint` keeps its control clients' CURVE keys (if CURVE)."""
    return token_path(endpoint).with_suffix(".curve")


def _write_private(path: Path, text: str, what: str) -> None:
    """Write a new file, 0600, never through a symlink (whatever was there is replaced)."""
    from telemetry.shared import endpoints

    try:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise endpoints.EndpointError(f"cannot write {what} {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _read_private(path: Path, limit: int) -> str:
    """A plain file of ours that nobody else can read, or "" (absent, or not such a file: a
    directory or a device there is looked at, never opened as a file, a FIFO never waited on)."""
    from telemetry.shared import files

    try:
        with files.open_regular(path, nofollow=True) as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                return ""
            return f.read(limit).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def write_curve_keys(endpoint: str, keys: tuple[bytes, bytes, bytes]) -> None:
    """(server public, client public, client secret), z85: for `request` on this host."""
    _write_private(curve_path(endpoint), "".join(k.decode("ascii") + "\n" for k in keys), "the control keys")


def apply_local_curve(sock, endpoint: str) -> bool:
    """Make `sock` a CURVE client with the daemon's control keys for `endpoint`, if it wrote
    them (its control socket is a CURVE server); True if so."""
    keys = _read_private(curve_path(endpoint), 512).split()
    if len(keys) != 3:
        return False
    server, public, secret = (k.encode("ascii") for k in keys)
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server, public, secret
    return True


def read_token(endpoint: str) -> str:
    """The token for `endpoint`: $TELEMETRY_CONTROL_TOKEN, else the daemon's file if it is a plain
    file of ours that nobody else can read; "" when there is none."""
    env = os.environ.get(ENV_TOKEN)
    if env:
        return env.strip()
    lines = _read_private(token_path(endpoint), 256).split("\n")
    if len(lines) > 1 and lines[1].strip() and not _same_listener(_host_of(endpoint), lines[1].strip()):
        return ""       # the token of another listener on this port (an older daemon's file: one line)
    return lines[0].strip()


def parse_request(frame: bytes, token: str) -> tuple[str | None, str]:
    """(command, error): command is None when the request is not understood or not authorised."""
    if len(frame) > MAX_REQUEST_BYTES:
        return None, "request too large"
    try:
        req = json.loads(frame)
    except (ValueError, UnicodeDecodeError, RecursionError):   # 4 kB of "[" is 2,000 levels: past json's limit
        return None, "not JSON"
    if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
        return None, 'expected {"cmd": "status" | "drain" | "ping", "token": "..."}'
    cmd = req["cmd"]
    if cmd not in COMMANDS:
        return None, f"unknown command {cmd[:40]!r}"
    given = req.get("token")
    if cmd not in _OPEN and not (isinstance(given, str) and hmac.compare_digest(given.encode(), token.encode())):
        return None, (f"not authorised: {cmd!r} needs the daemon's control token (the file beside its "
                      f"control socket, readable by its owner, or ${ENV_TOKEN})")
    return cmd, ""


def exit_code_of(frame: bytes) -> int | None:
    """The "exit_code" of a drain request (parse_request accepted it), or None: absent, or not an
    int of a process's exit-status range (a shell's 0..255, 128+N for a signal)."""
    try:
        code = json.loads(frame).get("exit_code")
    except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        return None
    return code if is_int(code) and 0 <= code <= 255 else None


def exclusion_of(frame: bytes) -> dict | None:
    """An exclude request's window (parse_request accepted it): {"start", "end", "reason"}, or None
    where start and end are not finite unix times with end after start, or the reason no text."""
    import math

    try:
        req = json.loads(frame)
        start, end, reason = req.get("start"), req.get("end"), req.get("reason", "")
    except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        return None
    if not all(is_number(x) and math.isfinite(x) for x in (start, end)) or not end > start:
        return None
    if not isinstance(reason, str):
        return None
    return {"start": float(start), "end": float(end), "reason": reason[:MAX_REASON_CHARS]}


class GaveUp(Exception):
    """request()'s `give_up` said so before an answer came (the daemon asked has exited)."""


# How often request() asks its `give_up` while it waits for the answer.
GIVE_UP_CHECK_S = 0.2
# The longest wait libzmq takes (RCVTIMEO and SNDTIMEO are milliseconds in a C int).
MAX_WAIT_MS = 2**31 - 1


def request(endpoint: str, cmd: str, timeout_s: float = 5.0, exit_code: int | None = None,
            extra: dict | None = None, give_up: Callable[[], bool] | None = None) -> dict:
    """Client side: send one command, wait at most `timeout_s` for the reply. exit_code: a
    drain's, the script's (see the module docstring); extra: the command's other fields (an
    exclude's start, end and reason); give_up: asked every GIVE_UP_CHECK_S while it waits,
    True ends the wait with GaveUp (the daemon's process is gone: no answer can come)."""
    import zmq

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    # libzmq takes milliseconds as a C int: a longer wait (a drain_timeout_s of a year) is the
    # longest it can, about 24 days, not an error that loses the request.
    wait_ms = int(min(timeout_s * 1000, MAX_WAIT_MS))
    sock.setsockopt(zmq.RCVTIMEO, wait_ms)
    sock.setsockopt(zmq.SNDTIMEO, wait_ms)
    try:
        from telemetry.shared.security.curve import apply_client_curve

        # Keys from $TELEMETRY_CURVE_* (a control endpoint beyond loopback, from another host),
        # else the daemon's own for this host's commands, where its control socket is CURVE.
        if not apply_client_curve(sock) and endpoint.startswith("tcp://"):
            apply_local_curve(sock, endpoint)
        sock.connect(endpoint)
        body = {"cmd": cmd}
        if cmd not in _OPEN:
            body["token"] = read_token(endpoint)
        if exit_code is not None:
            body["exit_code"] = exit_code
        body.update(extra or {})
        sock.send(json.dumps(body).encode())
        if give_up is not None:
            deadline = time.monotonic() + timeout_s
            while not sock.poll(int(GIVE_UP_CHECK_S * 1000)):
                if give_up():
                    raise GaveUp(f"the daemon at {endpoint} is gone; it did not answer")
                if time.monotonic() >= deadline:
                    raise zmq.Again()
        answer = sock.recv()
        try:
            return json.loads(answer)
        except RecursionError:    # whatever answers there (another user's port) nested it past json's limit
            raise ValueError("an answer nested deeper than json's recursion limit") from None
    except zmq.Again:
        raise TimeoutError(f"no answer from a telemetry daemon at {endpoint} within {timeout_s:g} s") from None
    finally:
        sock.close()
