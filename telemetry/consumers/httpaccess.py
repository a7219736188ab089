"""Who may read a consumer's HTTP port, and the checks of its flags: shared by `telemetry
dashboard` and `telemetry export-prometheus`.

- Loopback unless asked: an --addr beyond loopback is refused without --allow-remote (anyone
  who reaches the port reads the run). On loopback, a request whose Host header is not a
  loopback name is refused (a web page elsewhere reaching 127.0.0.1 by DNS rebinding).
- A token: loopback TCP is open to every local user, so a port that serves a run's data asks
  for a secret unless told not to (--no-token). `token_from_args` picks it: the user's
  (`read_token_file`) or a new random one; `token_matches` compares in constant time.
- The flags both share: --port, --memory-mb and --max-series are checked at the flag
  (telemetry.shared.config.number_arg: argparse's one line and exit 2); a token file is read
  by read_token_file, whose FlagError is one line naming the flag (the command exits 2).
"""
from __future__ import annotations

import hmac
import os
import secrets
import stat
import sys

# A token is sent in a header: printable ASCII without spaces, and short.
MAX_TOKEN_BYTES = 4096
MIN_TOKEN_CHARS = 16
# A consumer below this cannot hold its interpreter and libraries; above it is a typo.
MIN_MEMORY_MB = 64
MAX_MEMORY_MB = 1 << 20   # the daemon's --memory-mb has the same bounds
MAX_SERIES = 10_000_000
# Connections served at once, and how long one may sit without a whole request or a write going
# through. ThreadingHTTPServer gives every accepted connection a thread that waits forever for
# its request: another local user's idle connections each held a thread (and its stack) for
# good, and past a few hundred the accept loop slowed to a few a second while real scrapes waited
# (tests/test_http_backlog.py holds such connections open as another user). With the limit,
# someone holding all of them still shuts others out for up to HTTP_TIMEOUT_S at a time: the
# port is open to every local user (README "Trust model"); the bound is on the memory.
MAX_HTTP_CONNECTIONS = 512
HTTP_TIMEOUT_S = 30


class BoundedConnections:
    """Mixin for a ThreadingHTTPServer: at most MAX_HTTP_CONNECTIONS handled at once, one beyond
    closed at once and counted (num_refused); give the handler `timeout = HTTP_TIMEOUT_S`. A
    handler's exception is no traceback (handle_error).

    Each accepted connection holds one slot, given back exactly once: by its handler thread when
    it ends, or by process_request when the thread never took it. The two can both see the end
    of one connection: a SIGTERM turned KeyboardInterrupt (subscribe.detach_on_signals) lands in
    Thread.start() while it waits for a handler that has already answered. A second release then
    raised ValueError ("released too many times"), which socketserver printed and served on:
    the KeyboardInterrupt was lost and the server never stopped.
    """

    max_connections = MAX_HTTP_CONNECTIONS
    # The listen backlog: socketserver's default of 5 let a burst of concurrent requests (a page's
    # range reads, several scrapers) overflow it while the accept loop was busy; the kernel dropped
    # their handshakes and some clients got a reset instead of an answer or a 503. Connections past
    # the limit are closed and counted by process_request, not lost in the kernel.
    request_queue_size = MAX_HTTP_CONNECTIONS
    num_refused = 0
    num_dropped = 0   # connections their peer reset or closed mid-request (handle_error)
    error_prefix = "telemetry"   # handle_error's line: the program's name
    _slots = None
    _held = None      # request -> True while its slot is out; whoever pops it gives the slot back
    _drop_lock = None  # num_dropped is counted by the handler threads

    def process_request(self, request, client_address):
        import threading

        if self._slots is None:
            self._slots = threading.BoundedSemaphore(self.max_connections)
            self._held = {}
            self._drop_lock = threading.Lock()
        if not self._slots.acquire(blocking=False):
            self.num_refused += 1
            self.shutdown_request(request)
            return
        self._held[request] = True
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_back(request)
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_back(request)

    def _give_back(self, request) -> None:
        if self._held.pop(request, None):     # dict.pop is atomic: one of the two callers gets True
            self._slots.release()

    def handle_error(self, request, client_address):
        """An exception out of a handler: socketserver printed its traceback and served on. A peer
        that resets or closes its connection while it is read or answered (a browser closing a
        kept-alive connection or a tab, a scraper giving up) is the peer's doing: counted, not
        printed (a fresh-clone run beside a CPU hog: Chromium's reset printed a traceback in the
        dashboard's output). Anything else is one line on stderr, the server serving on."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            with self._drop_lock:     # set by process_request, before any handler thread starts
                self.num_dropped += 1
            return
        print(f"{self.error_prefix}: a request from {client_address[0]} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)


class FlagError(ValueError):
    """A bad flag value: the message is one line naming the flag."""


def is_loopback_addr(addr: str) -> bool:
    from telemetry.shared.endpoints import is_loopback

    return is_loopback(f"tcp://{addr}:0")


def add_remote_argument(p, what: str) -> None:
    p.add_argument("--allow-remote", action="store_true",
                   help=f"allow an --addr beyond loopback: anyone who reaches the port {what}")


def refuse_remote(addr: str, port: str, allow_remote: bool, what: str) -> str | None:
    """The refusal to print for an --addr beyond loopback without --allow-remote, else None."""
    if allow_remote or is_loopback_addr(addr):
        return None
    return (f"--addr {addr} is beyond loopback: anyone who reaches the port {what}. Pass --allow-remote "
            f"to serve it anyway, or keep 127.0.0.1 and tunnel it (ssh -N -L {port}:127.0.0.1:{port} host)")


def cannot_listen(prog: str, addr: str, port: int | str, exc: BaseException) -> str:
    """The one line for a port the consumer cannot bind: a taken one says so and how to get a
    free one (--port 0: the system picks, and the command prints it)."""
    import errno

    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return (f"{prog}: port {port} on {addr} is taken (another dashboard or exporter, or any other "
                f"server): choose another with --port P, or --port 0 for any free one (printed at start)")
    if isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL:
        return f"{prog}: cannot listen on {addr}:{port}: {addr} is not an address of this machine (--addr)"
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
    return f"{prog}: cannot listen on {addr}:{port}: {why}"


def host_is_loopback(host_header: str) -> bool:
    """Whether a request's Host header names a loopback address or `localhost`, with or without
    a port: 127.0.0.1:8765, localhost, [::1]:9464. A DNS name is refused whatever it starts
    with: a page on 127.0.0.1.nip.io (or any name its owner points at 127.0.0.1) is another
    site, and a browser lets it read what that name serves (DNS rebinding)."""
    from telemetry.shared.endpoints import is_loopback_host

    host = (host_header or "").strip()
    if host.startswith("["):             # [IPv6]:port: brackets hold an IPv6 address, nothing else
        name, bracket, rest = host[1:].partition("]")
        if not bracket or ":" not in name or (rest and not rest.startswith(":")):
            return False
        port = rest[1:]
    else:
        name, _, port = host.partition(":")
    if port and not (port.isascii() and port.isdigit()):
        return False
    return is_loopback_host(name)


def add_port_argument(p, default: int) -> None:
    from telemetry.shared.config import number_arg

    p.add_argument("--port", type=number_arg(int, lo=0, hi=65535), default=default,
                   help=f"HTTP port (default {default}; 0 = any free)")


def add_budget_arguments(p, default_mb: int, default_series: int, shed: str) -> None:
    """--memory-mb and --max-series, checked at the flag (argparse's one line and exit 2)."""
    from telemetry.shared.config import number_arg

    p.add_argument("--memory-mb", type=number_arg(int, lo=MIN_MEMORY_MB, hi=MAX_MEMORY_MB), default=default_mb,
                   help=f"memory budget of the process in MB (default {default_mb}, {MIN_MEMORY_MB} to "
                        f"{MAX_MEMORY_MB}): {shed}")
    p.add_argument("--max-series", type=number_arg(int, lo=1, hi=MAX_SERIES), default=default_series,
                   help=f"distinct series kept (default {default_series:,}): the first to come are kept, values "
                        "of newer ones are dropped and counted")


def new_token() -> str:
    return secrets.token_urlsafe(24)


def add_token_arguments(p, what: str, default_help: str) -> None:
    """--token-file FILE and --no-token; the token itself: token_from_args."""
    from telemetry.shared.config import nonempty_arg

    p.add_argument("--token-file", type=nonempty_arg, metavar="FILE",
                   help=f"the access token, read from FILE (default: {default_help})")
    p.add_argument("--no-token", action="store_true",
                   help=f"no access token: every local user (and with --allow-remote, anyone) {what}")


def token_from_args(args) -> str | None:
    """The token a server asks for: --token-file's, a new random one by default (loopback TCP
    is open to every local user), None with --no-token. FlagError: both flags, a bad file."""
    if args.no_token and args.token_file:
        raise FlagError("--no-token and --token-file: give one of them")
    if args.no_token:
        return None
    return read_token_file(args.token_file) if args.token_file else new_token()


def read_token_file(path: str) -> str:
    """The token in `path` (surrounding whitespace stripped). FlagError when it is missing, empty,
    too long or not printable ASCII, or when the file is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise FlagError(f"--token-file {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):      # said as a config file's is (shared.config.read_text)
            raise FlagError(f"--token-file {path}: " + ("is a directory, not a file" if stat.S_ISDIR(mode)
                                                          else "not a regular file"))
        data = os.read(fd, MAX_TOKEN_BYTES + 1)
    finally:
        os.close(fd)
    token = data.strip()
    if len(data) > MAX_TOKEN_BYTES:
        raise FlagError(f"--token-file {path}: longer than {MAX_TOKEN_BYTES} bytes")
    if not token or not all(0x21 <= b <= 0x7e for b in token):
        raise FlagError(f"--token-file {path}: expected one token of printable ASCII without spaces")
    if len(token) < MIN_TOKEN_CHARS:
        raise FlagError(f"--token-file {path}: a token of at least {MIN_TOKEN_CHARS} characters, please "
                        "(`python -c 'import secrets; print(secrets.token_urlsafe(24))'` makes one)")
    return token.decode("ascii")


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison (a timing difference must not spell the token out)."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("ascii"))


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() in ("bearer", "token") else None
