"""Who reads a dashboard: its token (on by default, as loopback TCP is open to every local user),
--token-file and --no-token, --allow-remote beyond loopback; and its flags checked first (one
line, exit 2). Real dashboard processes, real HTTP; "another local user" is uid 65534."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testkit.dashboard_proc import ROOT, Dashboard
from testkit.hosts import EVIL_HOSTS, GOOD_HOSTS
from other_user import can_act_as_other_user, http_status_as_other_user


def _run_dir(tmp_path: Path) -> Path:
    tel = tmp_path / "run" / "telemetry"
    tel.mkdir(parents=True)
    (tel / "metrics.jsonl").write_text(json.dumps({"kind": "hello", "t": 1.7e9, "rank": 0, "info": {
        "config": {"optim": {"lr": 1e-3}}}}) + "\n" + json.dumps(
        {"kind": "metrics", "t": 1.7e9, "step": 1, "values": {"train/loss": 2.5}}) + "\n")
    return tmp_path / "run"


def _status(req: urllib.request.Request | str) -> tuple[int, dict]:
    try:
        resp = urllib.request.urlopen(req, timeout=60)
        return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def _session(dash: Dashboard, token: str | None) -> tuple[int, dict, dict]:
    """POST /api/session with `token`: (status, headers, JSON answer or {})."""
    req = urllib.request.Request(dash.url + "api/session", method="POST", data=b"",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        resp = urllib.request.urlopen(req, timeout=60)
        return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), {}


def _data_with(dash: Dashboard, secret: str) -> int:
    return _status(urllib.request.Request(dash.url + "api/data", headers={"Authorization": f"Bearer {secret}"}))[0]


def test_api_needs_the_token_printed_once_in_the_address(tmp_path):
    dash = Dashboard(str(_run_dir(tmp_path)))
    try:
        assert dash.token and len(dash.token) >= 16 and dash.login_url == f"{dash.url}#token={dash.token}"
        # Without it: the page and its files (no data), but no data.
        for path in ("api/data", "api/stream?since=0"):
            code, _ = _status(dash.url + path)
            assert code == 403, path
        assert _status(dash.url)[0] == 200 and _status(dash.url + "static/dashboard.js")[0] == 200
        assert _data_with(dash, "nope-nope-nope-nope") == 403
        # A cookie is never a credential, and none is ever set (a browser sends 127.0.0.1's
        # cookies to every port of it: another local user's server among them).
        port = dash.url.rsplit(":", 1)[1].strip("/")
        for cookie in (f"telemetry_dashboard_{port}={dash.token}", f"token={dash.token}"):
            assert _status(urllib.request.Request(dash.url + "api/data", headers={"Cookie": cookie}))[0] == 403
        for url in (dash.url, f"{dash.url}?token={dash.token}"):
            code, headers = _status(url)
            assert code == 200 and "Set-Cookie" not in headers, headers
        # The page's exchange: the token for this start's session key, itself a credential.
        assert _session(dash, None)[0] == 403 and _session(dash, "not-the-token-at-all")[0] == 403
        code, headers, got = _session(dash, dash.token)
        assert code == 200 and "Set-Cookie" not in headers
        key = got["session"]
        assert len(key) >= 32 and key != dash.token and _data_with(dash, key) == 200
        data = dash.get_json("api/data")                                          # curl's way: the token
        assert data["runs"][0]["config"]["config"]["optim"]["lr"] == 1e-3
        assert data["runs"][0]["latest"]["train/loss"] == 2.5
        if can_act_as_other_user():     # another local user on loopback, without the token
            assert http_status_as_other_user(dash.url + "api/data") == "403"
    finally:
        assert dash.stop() == 0


def test_a_token_of_your_own_or_none(tmp_path):
    """--token-file: the same token on every start, but the page's session key is new at each:
    a key kept in a browser dies with the server that gave it."""
    run = _run_dir(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text("my-own-dashboard-token-123\n")
    token_file.chmod(0o600)
    keys = []
    for _ in range(2):
        dash = Dashboard(str(run), "--token-file", str(token_file))
        try:
            assert dash.token is None and "token from" in dash.lines[0]     # a token of your own is not printed
            assert _status(dash.url + "api/data")[0] == 403
            assert _data_with(dash, "my-own-dashboard-token-123") == 200
            keys.append(_session(dash, "my-own-dashboard-token-123")[2]["session"])
            assert _data_with(dash, keys[-1]) == 200
            assert all(_data_with(dash, old) == 403 for old in keys[:-1])   # the earlier start's key
        finally:
            assert dash.stop() == 0
    dash = Dashboard(str(run), "--no-token")
    try:
        assert dash.token is None and "no token" in dash.lines[0]
        assert _status(dash.url + "api/data")[0] == 200
        assert _session(dash, None)[:3:2] == (200, {"session": None})
    finally:
        assert dash.stop() == 0


def test_loopback_names_are_loopback_addresses_and_localhost_only():
    """DNS rebinding: the Host check took any name that starts with `127.` (127.attacker.example,
    127.0.0.1.nip.io: DNS names anyone can point at 127.0.0.1). The same rule for a tcp endpoint
    (is_loopback: whether CURVE is needed) and an --addr (is_loopback_addr: --allow-remote)."""
    from telemetry.consumers.httpaccess import host_is_loopback, is_loopback_addr
    from telemetry.shared.endpoints import is_loopback

    for host in GOOD_HOSTS:
        assert host_is_loopback(host.replace("PORT", "8765")), host
    for host in EVIL_HOSTS:
        assert not host_is_loopback(host.replace("PORT", "8765")), host
    for addr in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "127.1"):
        assert is_loopback_addr(addr) and is_loopback(f"tcp://{addr}:5555" if ":" not in addr
                                                      else f"tcp://[{addr}]:5555"), addr
    for addr in ("127.0.0.1.nip.io", "127.attacker.example", "localhost.attacker.example", "0.0.0.0", "*", "::",
                 "10.0.0.1", "127.0.0.256"):
        assert not is_loopback_addr(addr) and not is_loopback(f"tcp://{addr}:5555"), addr
    assert is_loopback("ipc:///tmp/x.sock")


def test_a_page_reaching_the_port_by_another_name_is_refused(tmp_path):
    """Real HTTP with a forged Host, to a --no-token dashboard (where the Host check is all that
    stands between a rebinding page and the run) and to one with its token."""
    run = _run_dir(tmp_path)
    for args in (["--no-token"], []):
        dash = Dashboard(str(run), *args)
        port = dash.url.rsplit(":", 1)[1].strip("/")
        try:
            for host in EVIL_HOSTS:
                assert _status(dash.request("api/data", {"Host": host.replace("PORT", port)}))[0] == 403, host
                assert _status(dash.request("", {"Host": host.replace("PORT", port)}))[0] == 403, host
            for host in GOOD_HOSTS:
                assert _status(dash.request("api/data", {"Host": host.replace("PORT", port)}))[0] == 200, host
        finally:
            assert dash.stop() == 0


def _refused(args: list[str], *words: str) -> str:
    out = subprocess.run([sys.executable, "-m", "telemetry", "dashboard", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("telemetry dashboard: ") and "serving" not in out.stdout, out.stderr
    for w in words:
        assert w in out.stderr, out.stderr
    return out.stderr


@pytest.mark.parametrize("args, words", [
    (["--port", "abc"], ["--port", "'abc'"]),
    (["--port", "99999"], ["--port", "<= 65535"]),
    (["--port", "-1"], ["--port", ">= 0"]),
    (["--memory-mb", "0"], ["--memory-mb", ">= 64"]),
    (["--memory-mb", "-1"], ["--memory-mb", ">= 64"]),
    (["--memory-mb", "nan"], ["--memory-mb", "'nan'"]),
    (["--max-series", "0"], ["--max-series", ">= 1"]),
    (["--token-file", "/nonexistent/token"], ["--token-file /nonexistent/token"]),
    (["--token-file", "/dev/zero"], ["not a regular file"]),
    (["--no-token", "--token-file", "/etc/hostname"], ["give one of them"]),
    (["--addr", "0.0.0.0"], ["beyond loopback", "--allow-remote"]),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, args, words):
    _refused([str(_run_dir(tmp_path)), *args], *words)


def test_a_short_or_spaced_token_file_is_refused(tmp_path):
    for text, word in (("short", "at least 16"), ("two words in it here", "without spaces"), ("", "without spaces")):
        path = tmp_path / "token"
        path.write_text(text)
        _refused([str(tmp_path), "--token-file", str(path)], word)


def test_a_sigterm_while_a_handler_starts_still_stops_the_server():
    """Seen in loaded CI-like runs (2 of 3, two workers beside a CPU hog): the dashboard did not
    stop on SIGTERM. The SIGTERM (KeyboardInterrupt, detach_on_signals) landed in Thread.start()
    while it waited for a handler thread that had already answered and given its connection
    slot back; process_request gave the slot back a second time, BoundedSemaphore raised
    ValueError, socketserver printed it and served on. Here the race is made certain: the
    handler runs to its end, then start() is interrupted. The interrupt must come through and
    every slot be free again."""
    from telemetry.consumers import httpaccess

    class _HandlerDoneThenInterrupted:
        def process_request(self, request, client_address):
            self.process_request_thread(request, client_address)   # the handler answered, slot back
            raise KeyboardInterrupt                                 # then start() is interrupted

        def process_request_thread(self, request, client_address):
            pass

        def shutdown_request(self, request):
            pass

    server = type("Server", (httpaccess.BoundedConnections, _HandlerDoneThenInterrupted), {"max_connections": 2})()
    for i in range(3):
        with pytest.raises(KeyboardInterrupt):
            server.process_request(object(), ("127.0.0.1", 1000 + i))
    # Both slots free again: two can be taken, not a third.
    assert server._slots.acquire(blocking=False) and server._slots.acquire(blocking=False)
    assert not server._slots.acquire(blocking=False)


def test_a_connection_its_peer_resets_is_counted_not_printed(capfd):
    """A fresh-clone run beside a CPU hog: Chromium reset a connection of the dashboard's while it
    read the request, and socketserver printed the ConnectionResetError's traceback in the
    dashboard's output. The dashboard and the exporter share the server mixin: a peer's reset or
    close mid-request is counted, nothing printed, and the server serves on; any other error out
    of a handler is one line."""
    import socket
    import struct
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from telemetry.consumers import httpaccess
    from telemetry.consumers.dashboard.server import DashboardServer
    from telemetry.consumers.prometheus import MetricsServer

    assert DashboardServer.handle_error is MetricsServer.handle_error is httpaccess.BoundedConnections.handle_error

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/boom":
                raise RuntimeError("a handler's own bug")
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    class Server(httpaccess.BoundedConnections, ThreadingHTTPServer):
        daemon_threads = True
        error_prefix = "test server"

    with Server(("127.0.0.1", 0), Handler) as srv:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        addr = srv.server_address
        for sent in (b"", b"GET /api/da", b"GET / HTTP/1.1\r\nHost: x\r\n"):   # nothing, half a line, no end
            s = socket.create_connection(addr, timeout=60)
            s.sendall(sent)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()                                                        # an RST
        deadline = time.monotonic() + 120
        while srv.num_dropped < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.num_dropped == 3
        with pytest.raises(ConnectionError):      # closed without an answer (RemoteDisconnected)
            urllib.request.urlopen(f"http://127.0.0.1:{addr[1]}/boom", timeout=60)
        assert urllib.request.urlopen(f"http://127.0.0.1:{addr[1]}/", timeout=60).read() == b"ok"
        srv.shutdown()
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    assert err.splitlines() == ["test server: a request from 127.0.0.1 failed: RuntimeError: a handler's own bug"], err
