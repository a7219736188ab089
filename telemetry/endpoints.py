"""Where the sockets are: defaults shared by the client, the daemon and the consumers.

Precedence: an explicit argument, then the environment ($TELEMETRY_ENDPOINT, $TELEMETRY_PUB,
$TELEMETRY_CONTROL), then ipc sockets in a private per-run directory:
    $TELEMETRY_RUNTIME_DIR, else /tmp/telemetry-<uid>/<run>   (mode 0700)
where <run> is $TELEMETRY_RUN_NAME or "default". A TCP endpoint given as a bare port or
"tcp://*:P" binds to 127.0.0.1: listening beyond loopback is an explicit choice (tcp://0.0.0.0:P).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

ENV_INGEST = "TELEMETRY_ENDPOINT"
ENV_PUB = "TELEMETRY_PUB"
ENV_CONTROL = "TELEMETRY_CONTROL"
ENV_RUNTIME_DIR = "TELEMETRY_RUNTIME_DIR"
ENV_RUN_NAME = "TELEMETRY_RUN_NAME"
ENV_DISABLED = "TELEMETRY_DISABLED"

_SOCKET_FILES = {"ingest": "ingest.sock", "pub": "pub.sock", "control": "control.sock"}
_ENV = {"ingest": ENV_INGEST, "pub": ENV_PUB, "control": ENV_CONTROL}


class EndpointError(ValueError):
    pass


def runtime_dir(create: bool = False) -> Path:
    """The private directory holding the default ipc sockets; made 0700 when `create`."""
    explicit = os.environ.get(ENV_RUNTIME_DIR)
    if explicit:
        path = Path(explicit)
    else:
        run = os.environ.get(ENV_RUN_NAME) or "default"
        path = Path("/tmp") / f"telemetry-{os.getuid()}" / run
    if create:
        for p in (path.parent, path) if not explicit else (path,):
            p.mkdir(mode=0o700, exist_ok=True)
            st = p.stat()
            # Someone else's directory, or one others can write into, would let them read our
            # records or impersonate the daemon.
            if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
                if st.st_uid == os.getuid():
                    p.chmod(0o700)
                else:
                    raise EndpointError(f"{p} is not owned by this user; refusing to put sockets there")
    return path


def resolve(which: str, explicit: str | None = None, create_dir: bool = False) -> str:
    """The endpoint for 'ingest', 'pub' or 'control'."""
    ep = explicit or os.environ.get(_ENV[which])
    if not ep:
        return "ipc://" + str(runtime_dir(create=create_dir) / _SOCKET_FILES[which])
    return normalize(ep)


def normalize(ep: str) -> str:
    """Accept 'PORT', 'tcp://*:PORT', 'ipc://path', 'tcp://host:port'; loopback by default."""
    ep = ep.strip()
    if ep.isdigit():
        return f"tcp://127.0.0.1:{ep}"
    if ep.startswith("tcp://*:"):
        return "tcp://127.0.0.1:" + ep[len("tcp://*:"):]
    if not ep.startswith(("tcp://", "ipc://", "inproc://")):
        raise EndpointError(f"endpoint {ep!r}: expected tcp://HOST:PORT, ipc://PATH or a port number")
    if ep.startswith("ipc://") and len(ep) - len("ipc://") > 107:
        raise EndpointError(f"ipc path too long for a unix socket (max 107 bytes): {ep}")
    return ep


def is_loopback(ep: str) -> bool:
    if not ep.startswith("tcp://"):
        return True
    host = ep[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
