"""CURVE encryption and authentication for endpoints beyond loopback.

Server side (the daemon): `DaemonSecurity` checks the daemon's bind endpoints at start: any TCP
endpoint that is not loopback needs a `security:` section (the daemon's CURVE secret key and a
directory of allowed client public keys), or the daemon refuses to start. With it, such
endpoints are CURVE servers, and a ZAP handler (zmq.auth's ThreadAuthenticator) admits only
clients whose public key is in the allow-list; every refusal is counted (`security.auth_refused`
in `telemetry status`). Options are applied per bind: libzmq copies a socket's options into each
listener when it binds, so one PULL socket can serve local ranks over ipc without keys and node
daemons over TCP with CURVE.

Client side (ranks, forwarders, consumers): `apply_client_curve(sock)` sets the client's key
pair and the server's public key from explicit files or from the environment:
    TELEMETRY_CURVE_SERVER_KEY   the server's public key file (NAME.key)
    TELEMETRY_CURVE_CLIENT_KEY   this client's secret key file (NAME.key_secret)
Keys come from `telemetry keygen`. The allow-list is read once at start: restart the daemon to
admit a new key. Each allowed key speaks for one node (identity.py): a head refuses, and counts,
a record a node's key sends as another node.
"""
from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from telemetry.shared import endpoints
from telemetry.shared.endpoints import EndpointError

if TYPE_CHECKING:
    from telemetry.shared.security.identity import AllowList

log = logging.getLogger("telemetry.shared.security")

ENV_SERVER_KEY = "TELEMETRY_CURVE_SERVER_KEY"
ENV_CLIENT_KEY = "TELEMETRY_CURVE_CLIENT_KEY"
ZAP_DOMAIN = "telemetry"


class SecurityError(EndpointError):
    """A configuration that would expose an endpoint without CURVE, or unusable key files."""


@dataclass(kw_only=True, slots=True)
class SecurityConfig:
    """The daemon's `security:` config section (loaded with the daemon config, which names a bad key)."""

    server_secret_key: str = ""       # the daemon's NAME.key_secret (telemetry keygen)
    allowed_clients_dir: str = ""     # directory of client public keys NAME.key; others are refused
    curve_loopback: bool = False      # CURVE on loopback TCP too (shared hosts; tests on 127.0.0.x)

    def __post_init__(self) -> None:
        if bool(self.server_secret_key) != bool(self.allowed_clients_dir):
            raise SecurityError("security: server_secret_key and allowed_clients_dir go together")
        if self.server_secret_key and not Path(self.server_secret_key).is_file():
            raise SecurityError(f"security.server_secret_key: no such file {self.server_secret_key}")
        if self.allowed_clients_dir and not Path(self.allowed_clients_dir).is_dir():
            raise SecurityError(f"security.allowed_clients_dir: no such directory {self.allowed_clients_dir}")
        if self.curve_loopback and not self.server_secret_key:
            raise SecurityError("security.curve_loopback needs server_secret_key and allowed_clients_dir")

    @property
    def enabled(self) -> bool:
        return bool(self.server_secret_key)


def load_secret_key(path: str | os.PathLike, private: bool = False) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys from a NAME.key_secret file. Only a regular file is read (a
    FIFO at the path never blocks). `private`: the daemon's own key must be as ssh wants a
    private key: this user's (or root's) and readable by nobody else, or SecurityError; whoever
    can read it can be this daemon to its nodes and consumers."""
    import zmq.auth

    try:
        _check_key_file(path, private)
    except OSError as exc:
        raise SecurityError(f"cannot read CURVE key {path}: {exc.strerror or exc}") from None
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read CURVE key {path}: {exc}") from None
    if not secret:
        raise SecurityError(f"{path} holds no secret key (use the .key_secret file)")
    return public, secret


def _check_key_file(path: str | os.PathLike, private: bool) -> None:
    """OSError when `path` is not a regular file; SecurityError when `private` and the file is
    another user's or readable, writable or runnable by group or others."""
    from telemetry.shared import files

    with files.open_regular(path) as f:      # NotRegularFile (an OSError): a FIFO is never waited on
        st = os.fstat(f.fileno())
    if not private:
        return
    if st.st_uid not in (os.geteuid(), 0):
        raise SecurityError(f"CURVE secret key {path} is another user's (uid {st.st_uid}): use a key file of your own")
    if st.st_mode & 0o077:
        raise SecurityError(f"CURVE secret key {path} is open to others (mode {stat.S_IMODE(st.st_mode):o}): "
                            f"anyone who can read it can pose as this daemon; run `chmod 600 {path}`")


def load_public_key(path: str | os.PathLike) -> bytes:
    import zmq.auth

    try:
        public, _ = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read CURVE key {path}: {exc}") from None
    return public


def needs_curve(endpoint: str, cfg: SecurityConfig) -> bool:
    if not endpoint.startswith("tcp://"):
        return False
    return not endpoints.is_loopback(endpoint) or cfg.curve_loopback


def apply_client_curve(sock: zmq.Socket, server_key: str | None = None, client_key: str | None = None) -> bool:
    """Make `sock` a CURVE client if keys are given (or set in the environment); True if so.

    server_key: the server's public key file; client_key: this client's .key_secret file.
    Call before connect. Without either, the socket is left as it is (ipc and loopback).
    """
    server_key = server_key or os.environ.get(ENV_SERVER_KEY)
    client_key = client_key or os.environ.get(ENV_CLIENT_KEY)
    if not server_key and not client_key:
        return False
    if not (server_key and client_key):
        raise SecurityError(f"CURVE needs both ${ENV_SERVER_KEY} (server public key) and "
                            f"${ENV_CLIENT_KEY} (client secret key)")
    public, secret = load_secret_key(client_key)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = load_public_key(server_key)
    return True


def _make_authenticator(ctx: zmq.Context, allow: "AllowList"):
    from zmq.auth.thread import ThreadAuthenticator
    from zmq.utils import z85

    from telemetry.shared.security.identity import NODE_DOMAIN, NODE_USER_PREFIX

    class CountingAuthenticator(ThreadAuthenticator):
        """The allow-list ZAP handler, counting its answers (written on its thread only). On the
        node listener's domain a connection's User-Id names its key (identity.NodeGuard)."""

        num_allowed = 0
        num_refused = 0
        _domain = ""

        async def handle_zap_message(self, msg: list[bytes]) -> None:
            # One request at a time on this thread: curve_user_id, called inside, reads it.
            self._domain = msg[2].decode("utf-8", "replace") if len(msg) > 2 else ""
            await super().handle_zap_message(msg)

        def curve_user_id(self, client_public_key: bytes) -> str:
            if self._domain != NODE_DOMAIN:
                return "local"
            return NODE_USER_PREFIX + allow.names.get(z85.encode(client_public_key), "")

        def _send_zap_reply(self, request_id, status_code, status_text, user_id="anonymous"):
            if status_code == b"200":
                self.num_allowed += 1
            else:
                self.num_refused += 1
                # One line per refusal is fine here: refusals are per connection attempt, not per
                # record, and an operator wants to see who knocked.
                log.warning("refused a CURVE client: %s", status_text.decode("ascii", "replace"))
            super()._send_zap_reply(request_id, status_code, status_text, user_id)

    return CountingAuthenticator(ctx)


class DaemonSecurity:
    """The daemon's side: check binds, run the ZAP allow-list, make sockets CURVE servers."""

    def __init__(self, ctx: zmq.Context, cfg: SecurityConfig, bind_endpoints: dict[str, str]) -> None:
        from telemetry.shared.security.watch import ConnectionWatch

        self.cfg = cfg
        self.auth = None
        self.allow = None                 # identity.AllowList: which node each allowed key speaks for
        self.guard = None                 # identity.NodeGuard on the remote ingest (node_guard)
        self.secured: list[str] = []
        self.connections = ConnectionWatch()
        exposed = [f"{n}={ep}" for n, ep in bind_endpoints.items()
                   if ep and ep.startswith("tcp://") and not endpoints.is_loopback(ep)]
        if exposed and not cfg.enabled:
            raise SecurityError(
                "refusing to listen beyond loopback without CURVE: " + ", ".join(exposed)
                + ". Make keys with `telemetry keygen` and set security.server_secret_key and "
                "security.allowed_clients_dir in the daemon config (or bind to 127.0.0.1 / ipc).")
        if cfg.enabled:
            from telemetry.shared.security.identity import NODE_DOMAIN, AllowList

            self._public, self._secret = load_secret_key(cfg.server_secret_key, private=True)
            self.allow = AllowList(cfg.allowed_clients_dir)
            if not self.allow.names:
                log.warning("security.allowed_clients_dir %s holds no *.key files: every CURVE client "
                            "will be refused", cfg.allowed_clients_dir)
            self.auth = _make_authenticator(ctx, self.allow)
            self.auth.start()
            # The same keys on every listener; the node listener's domain also names them (User-Id).
            self.auth.allow_any = False
            self.auth.certs[ZAP_DOMAIN] = dict.fromkeys(self.allow.names, True)
            self.auth.certs[NODE_DOMAIN] = dict.fromkeys(self.allow.names, True)

    def prepare(self, sock: zmq.Socket, endpoint: str, name: str = "") -> None:
        """Set `sock`'s security options for its next bind (to `endpoint`)."""
        if self.auth is not None and needs_curve(endpoint, self.cfg):
            from telemetry.shared.security.identity import NODE_DOMAIN

            sock.curve_secretkey = self._secret
            sock.curve_publickey = self._public
            sock.curve_server = True
            sock.zap_domain = (NODE_DOMAIN if name == "remote_ingest" else ZAP_DOMAIN).encode()
            self.secured.append(name or endpoint)
        elif sock.curve_server:
            # Options carry over to later binds of the same socket: switch CURVE off again (a
            # NULL connection then passes the ZAP handler, which has no address lists).
            sock.curve_server = False

    def node_guard(self, sock: zmq.Socket, remote_endpoint: str):
        """The per-frame check of which node a record speaks as (identity.NodeGuard), for a socket
        whose remote ingest is a CURVE listener; None where there is none to check (no keys)."""
        if self.auth is None or not remote_endpoint or not needs_curve(remote_endpoint, self.cfg):
            return None
        from telemetry.shared.security.identity import NodeGuard

        self.guard = NodeGuard(sock, self.allow.node_user_ids())
        return self.guard

    def control_client_keys(self) -> tuple[bytes, bytes, bytes]:
        """A key pair for this daemon's own control clients (`telemetry status`, `drain` on this
        host), allowed for as long as the daemon runs, on no node listener: (server public,
        client public, client secret), z85. The daemon writes it beside its control token."""
        public, secret = zmq.curve_keypair()
        self.auth.certs[ZAP_DOMAIN] = {**self.auth.certs[ZAP_DOMAIN], public: True}
        return self._public, public, secret

    def watch(self, sockets: dict[str, zmq.Socket], limits: dict[str, tuple[int, tuple[str, ...]]] | None = None) -> None:
        """Count connection events (handshake failures, disconnects) on these bound sockets;
        `limits`: name -> (most connections at once, the endpoints that socket is bound to)."""
        for name, sock in sockets.items():
            limit, eps = (limits or {}).get(name, (0, ()))
            self.connections.watch(name, sock, limit, eps)
        self.connections.start()

    def stats(self) -> dict:
        out: dict = {"curve": self.auth is not None, "connections": self.connections.stats()}
        if self.auth is not None:
            out.update(secured=list(self.secured), auth_allowed=self.auth.num_allowed,
                       auth_refused=self.auth.num_refused)
        if self.guard is not None:
            out.update(self.guard.stats())
        return out

    def counters(self) -> dict[str, int]:
        """The daemon record's share: refusals and connection-level rejections."""
        conns = self.connections.stats().values()
        return {
            "telemetry/auth_refused": self.auth.num_refused if self.auth is not None else 0,
            "telemetry/identity_refused": self.guard.num_refused if self.guard is not None else 0,
            "telemetry/handshake_failed": sum(c["handshake_failed"] + c["auth_failed"] for c in conns),
            "telemetry/disconnects": sum(c["disconnected"] for c in conns),
            "telemetry/connections_refused": sum(c.get("refused", 0) for c in conns),
        }

    def close(self) -> None:
        """Stop the watch and the ZAP thread; before the context is destroyed. Safe twice."""
        self.connections.close()
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
