"""The dashboard's HTTP side (standard library only): the page, its files, data, live events.

    GET /                       the page (static/index.html); it takes a token from its own
                                address (/#token=T as printed; /?token=T of older links)
    POST /api/session           Authorization: Bearer <token> -> {"session": KEY}: this server's
                                session key, the page's credential from then on
    GET /static/<file>          the page's script and style, uPlot (shipped in the package)
    GET /api/data?width=PX      every run: its series downsampled to PX pixel columns, its
                                events, latest values, state; and `seq`, the change number
    GET /api/range?run=ID&x0=A&x1=B&width=PX&key=K...
                                a zoomed step range of those series, from the store or,
                                where it thinned them, the run's files (ranges.py)
    GET /api/media?run=ID&since=N
                                the run's kept media (images, histograms, tables): media.py
    GET /api/media/file?run=ID&name=N
                                one kept media file
    GET /api/stream?since=SEQ&instance=ID
                                server-sent events: `changes` (new points and events after
                                SEQ), `status` (each run's state, every STATUS_EVERY_S), and
                                `reload` when the page fell too far behind
Requests whose Host is not a loopback address or `localhost` are refused (a web page on a name
pointed at 127.0.0.1 must not read a local run by DNS rebinding: httpaccess.host_is_loopback),
unless the server was started for remote viewers.

With a token (the default: loopback TCP is open to every local user), every /api/ request
needs `Authorization: Bearer <token>` or `Authorization: Bearer <session key>`; without it the
answer is 403. The page and its static files carry no data and need none.

The page's credential is never a cookie: a browser sends a cookie of 127.0.0.1 to every port
of 127.0.0.1, so another local user's page on another port received it and replayed it. The
page exchanges the token in its address for the session key (POST /api/session), keeps the key
in its origin's localStorage (an origin is scheme, host and port: no page on another port
reads it) and sends it in the Authorization header of its own requests, which a browser never
adds by itself. The key is random per server start: it dies with the server, whatever the token.
"""
from __future__ import annotations

import json
import math
import mimetypes
import secrets
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from telemetry.consumers import httpaccess
from telemetry.consumers.httpaccess import HTTP_TIMEOUT_S, BoundedConnections
from telemetry.consumers.dashboard.live import Hub
from telemetry.consumers.dashboard.media import MediaIndex
from telemetry.consumers.dashboard.ranges import MAX_KEYS as MAX_RANGE_KEYS
from telemetry.consumers.dashboard.ranges import StepBlocks, downsampled
from telemetry.consumers.dashboard.budget import Reservations, fit_range
from telemetry.shared.numbers import nonfinite_as_null

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATUS_EVERY_S = 1.0
DEFAULT_WIDTH_PX = 1200
MAX_WIDTH_PX = 8000
# Points of one /api/data answer, all series together, unless the server is told otherwise.
DEFAULT_MAX_POINTS_SENT = 400_000
# A range answer that does not fit beside those being built waits this long for room (a page's
# requests overlapping by a moment go through), then is refused (503) with when to ask again.
RANGE_WAIT_S = 2.0
RANGE_RETRY_AFTER_S = 1


class DashboardServer(BoundedConnections, ThreadingHTTPServer):
    daemon_threads = True          # a page left open never holds the exit
    allow_reuse_address = True
    error_prefix = "telemetry dashboard"

    def __init__(self, addr: tuple[str, int], hub: Hub, allow_any_host: bool = False, token: str | None = None,
                 max_points_sent: int = DEFAULT_MAX_POINTS_SENT, max_range_bytes: int = 8 << 20) -> None:
        super().__init__(addr, Handler)
        self.hub = hub
        self.media = {run_id: MediaIndex(store.log_dir) for run_id, store in hub.stores.items()}
        self.ranges: dict[str, StepBlocks] = {}
        self.range_lock = threading.Lock()
        # The range answers being built, their bytes reserved before (budget.Reservations).
        self.range_bytes = Reservations(max_range_bytes)
        self.allow_any_host = allow_any_host
        self.token = token
        self.session_key = secrets.token_urlsafe(32) if token else None   # this start's, never the token's
        self.max_points_sent = max_points_sent
        self.data_lock = threading.Lock()   # one /api/data answer in memory at a time
        self.stopping = False


def _dumps(obj: Any) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:   # a non-finite number somewhere (an event's data): the slow, safe way
        return json.dumps(nonfinite_as_null(obj), separators=(",", ":"), allow_nan=False).encode()


class Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    protocol_version = "HTTP/1.1"
    timeout = HTTP_TIMEOUT_S      # an idle keep-alive or a stalled reader lets go of its thread

    def log_message(self, format: str, *args: Any) -> None:   # one line per request is noise here
        pass

    def _host_ok(self) -> bool:
        return self.server.allow_any_host or httpaccess.host_is_loopback(self.headers.get("Host") or "")

    def _bearer_is(self, secret: str) -> bool:
        return httpaccess.token_matches(httpaccess.bearer_token(self.headers.get("Authorization")), secret)

    def _authorized(self) -> bool:
        """The token or this start's session key, in the Authorization header (a cookie is
        never looked at: see the module docstring)."""
        srv = self.server
        return srv.token is None or self._bearer_is(srv.token) or self._bearer_is(srv.session_key)

    def _send(self, status: int, body: bytes, content_type: str, cache: bool = False,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=3600" if cache else "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")    # an old /?token= link's address stays here
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if not self._host_ok():
            self._send(HTTPStatus.FORBIDDEN, b"forbidden: not a loopback Host\n", "text/plain")
            return
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path in ("/", "/index.html"):
            self._static("index.html")
        elif url.path.startswith("/static/"):
            self._static(url.path[len("/static/"):])
        elif url.path.startswith("/api/") and not self._authorized():
            self._forbidden()
        elif url.path == "/api/data":
            self._data(query)
        elif url.path == "/api/stream":
            self._stream(query)
        elif url.path == "/api/range":
            self._range(query)
        elif url.path in ("/api/media", "/api/media/file"):
            self._media(url.path, query)
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    def _forbidden(self) -> None:
        self._send(HTTPStatus.FORBIDDEN, _dumps({"error": "this dashboard needs its token: open the address "
                                                          "`telemetry dashboard` printed (it ends in #token=...)"}),
                   "application/json")

    def do_POST(self) -> None:
        """POST /api/session: the token (Authorization: Bearer) for this start's session key."""
        length = self.headers.get("Content-Length") or "0"
        if self.headers.get("Transfer-Encoding") or not length.isdigit() or int(length) > 0:
            self.close_connection = True    # a body is never read here: the connection goes with it
        if not self._host_ok():
            self._send(HTTPStatus.FORBIDDEN, b"forbidden: not a loopback Host\n", "text/plain")
        elif urlsplit(self.path).path != "/api/session":
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
        elif self.server.token is None:
            self._send(HTTPStatus.OK, _dumps({"session": None}), "application/json")   # --no-token: none needed
        elif self._bearer_is(self.server.token):
            self._send(HTTPStatus.OK, _dumps({"session": self.server.session_key}), "application/json")
        else:
            self._forbidden()

    def _static(self, name: str) -> None:
        # Only plain file names of the static dir: no path ever leaves it.
        path = STATIC_DIR / name
        if "/" in name or name.startswith(".") or not path.is_file():
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
            return
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype == "application/javascript":
            ctype += "; charset=utf-8"
        self._send(HTTPStatus.OK, path.read_bytes(), ctype, cache=name.startswith("uPlot"))

    def _data(self, query: dict) -> None:
        try:
            width = int(query.get("width", [DEFAULT_WIDTH_PX])[0])
        except ValueError:
            width = DEFAULT_WIDTH_PX
        width = min(MAX_WIDTH_PX, max(100, width))
        hub = self.server.hub
        max_points = self.server.max_points_sent // max(1, len(hub.stores))
        with self.server.data_lock:
            seq = hub.seq   # read before the snapshots: a change in between is sent again, never lost
            body = {"seq": seq, "instance": hub.instance,
                    "runs": [s.snapshot(width, max_points) for s in hub.stores.values()], "status": hub.statuses()}
            data = _dumps(body)
            del body
        self._send(HTTPStatus.OK, data, "application/json")

    def _range(self, query: dict) -> None:
        """A zoomed step range of some series, per pixel column (ranges.py)."""
        store = self.server.hub.stores.get(query.get("run", [""])[0])
        try:
            x0, x1 = float(query["x0"][0]), float(query["x1"][0])
            width = min(MAX_WIDTH_PX, max(100, int(query.get("width", [DEFAULT_WIDTH_PX])[0])))
            if not (math.isfinite(x0) and math.isfinite(x1) and x0 <= x1):
                raise ValueError("x0 and x1 finite, x0 <= x1")
        except (KeyError, ValueError) as exc:
            self._send(HTTPStatus.BAD_REQUEST, _dumps({"error": f"x0, x1 (x0 <= x1) and width: {exc}"}),
                       "application/json")
            return
        if store is None:
            self._send(HTTPStatus.NOT_FOUND, b"no such run\n", "text/plain")
            return
        keys = query.get("key", [])[:MAX_RANGE_KEYS]
        num_buckets = max(16, width // 2)
        # Its bytes reserved before it is built (cut to fewer columns when it would not fit the
        # share alone): concurrent answers stay within their share of the budget; one that finds
        # no room in RANGE_WAIT_S is told to come back (503, Retry-After), and counted.
        gate = self.server.range_bytes
        num_buckets, cost = fit_range(*store.range_sizes(keys), num_buckets, gate.max_bytes, span=x1 - x0 + 1)
        if not gate.reserve(cost, RANGE_WAIT_S):
            self._send(HTTPStatus.SERVICE_UNAVAILABLE,
                       _dumps({"error": "range answers in flight fill their share of the memory budget; retry",
                               "ranges_refused": gate.num_refused}),
                       "application/json", headers={"Retry-After": str(RANGE_RETRY_AFTER_S)})
            return
        try:
            self._range_answer(store, keys, x0, x1, num_buckets)
        finally:
            gate.release(cost)

    def _range_answer(self, store, keys: list[str], x0: float, x1: float, num_buckets: int) -> None:
        series, thinned = store.zoomed(keys, x0, x1, num_buckets)
        truncated, read = False, 0
        if thinned and store.log_dir is not None:
            blocks = self.server.ranges.setdefault(store.run_id, StepBlocks(store.log_dir))
            with self.server.range_lock:      # one file read at a time: its memory is one answer's
                got, truncated, read = blocks.read(x0, x1, set(thinned), num_buckets=num_buckets)
            if not truncated:                 # a cut answer: the page keeps what it holds
                for key, (xs, ys) in got.items():
                    series[key] = downsampled(xs, ys, num_buckets)
        body = {"run": store.run_id, "x0": x0, "x1": x1, "truncated": truncated, "read_bytes": read,
                "ranges_refused": self.server.range_bytes.num_refused,
                "series": {k: {"x": xs, "y": ys} for k, (xs, ys) in series.items()}}
        self._send(HTTPStatus.OK, _dumps(body), "application/json")

    def _media(self, path: str, query: dict) -> None:
        index = self.server.media.get(query.get("run", [""])[0])
        if index is None:
            self._send(HTTPStatus.NOT_FOUND, b"no such run\n", "text/plain")
        elif path == "/api/media":
            try:
                since = int(query.get("since", ["0"])[0])
            except ValueError:
                since = 0
            self._send(HTTPStatus.OK, _dumps(index.items(since)), "application/json")
        else:
            found = index.file(query.get("name", [""])[0])
            if found is None:
                self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
            else:
                self._send(HTTPStatus.OK, found[0], found[1], cache=True)   # a kept file never changes

    def _stream(self, query: dict) -> None:
        try:
            seq = int(query.get("since", ["0"])[0])
        except ValueError:
            seq = 0
        hub = self.server.hub
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        next_status = 0.0
        try:
            if query.get("instance", [hub.instance])[0] != hub.instance or seq > hub.seq:
                self._event("reload", {"seq": hub.seq})   # numbers from another run of this server
                return
            while not self.server.stopping:
                seq_now, changes = hub.changes_since(seq, timeout_s=STATUS_EVERY_S)
                if changes is None:
                    self._event("reload", {"seq": seq_now})
                    return
                if changes:
                    points: dict[str, list] = {}
                    events: list = []
                    for _seq, run_id, pts, evs in changes:
                        points.setdefault(run_id, []).extend(pts)
                        events.extend(evs)
                    seq = changes[-1][0]
                    self._event("changes", {"seq": seq, "points": points, "events": events})
                now = time.monotonic()
                if now >= next_status:
                    self._event("status", {"status": hub.statuses()})
                    next_status = now + STATUS_EVERY_S
        except (BrokenPipeError, ConnectionResetError):
            pass   # the page was closed

    def _event(self, name: str, data: Any) -> None:
        self.wfile.write(b"event: " + name.encode() + b"\ndata: " + _dumps(data) + b"\n\n")
        self.wfile.flush()
