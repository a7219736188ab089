"""A live dashboard in the browser: the run's history from metrics.jsonl, then live updates.

    telemetry dashboard [RUN_DIR] [--pub EP] [--port 8765] [--addr 127.0.0.1] [--allow-remote]
                        [--token-file FILE | --no-token] [--memory-mb 256] [--max-series 10000]

RUN_DIR is a run dir (holding telemetry/metrics.jsonl), its telemetry dir, or a folder of run
dirs (`telemetry dashboard runs/`: the runs side by side, each one a colour). Live updates come
from the daemon's PUB socket when one is named (--pub, $TELEMETRY_PUB, or the run's private
socket through $TELEMETRY_RUNTIME_DIR / $TELEMETRY_RUN_NAME, as run.sh sets them), else from
metrics.jsonl as it grows. Without RUN_DIR only live records are shown.

The page shows loss (train, eval per dataset), lr, grad norm, tokens/s, MFU, step time with the
spread across ranks and the slowest rank, the phase breakdown stacked, per-dataset metrics, GPU
utilization/memory/power/temperature per GPU, host CPU and memory, events as markers and as a
list, and the daemon's own counters. It says when the daemon is not reachable (it reconnects
by itself) and when the run has ended. It costs the training nothing: it only reads the file
and subscribes. Charts are drawn by uPlot, shipped inside the package: no network is needed.

The page is served on 127.0.0.1, which every local user can reach, so its data asks for a
token (as Jupyter does): a random one per start, carried once by the address printed
(http://127.0.0.1:8765/#token=...: a fragment, never sent over the wire). The page trades it
for this start's session key, kept for this port alone and sent in its requests' Authorization
header, never as a cookie (server.py says why); every /api/ request without the token or the
key is refused (403), `curl -H "Authorization: Bearer TOKEN"` works. --token-file FILE gives
your own (the printed address then has none: add #token=...), --no-token turns it off. To
serve beyond loopback (--addr), pass --allow-remote as well, or better keep it on loopback and
tunnel the port (ssh -N -L 8765:127.0.0.1:8765 host).

Memory: the process keeps under --memory-mb (default 256): series beyond --max-series (default
10,000, the first to come are kept) are dropped, long series are thinned (minimum and maximum
kept), the oldest events forgotten beyond their share; each counted and shown on the page.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

DEFAULT_PORT = 8765
# A history larger than this (MB) is read while serving (--wait-history-mb): a smaller one is a
# short wait; a long run's file takes far longer, and the page is there at once.
WAIT_HISTORY_MB = 64.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    from telemetry.consumers import httpaccess
    from telemetry.consumers.dashboard.budget import DEFAULT_MAX_SERIES, DEFAULT_MEMORY_MB
    from telemetry.shared.config import nonempty_arg
    from telemetry.shared.config import number_arg
    from telemetry.shared.endpoints import endpoint_arg

    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?", type=nonempty_arg,
                   help="run dir, its telemetry dir, or a folder of run dirs (several runs side by side)")
    p.add_argument("--pub", type=endpoint_arg, metavar="EP", help="the daemon's PUB endpoint for live updates (default "
                   "$TELEMETRY_PUB, or the run's ipc socket when $TELEMETRY_RUNTIME_DIR or $TELEMETRY_RUN_NAME "
                   "is set; else metrics.jsonl is followed)")
    httpaccess.add_port_argument(p, DEFAULT_PORT)
    p.add_argument("--addr", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    httpaccess.add_remote_argument(p, "can read the run with its token (with --no-token, without)")
    httpaccess.add_token_arguments(p, "reads the run", "a random one, in the address printed")
    httpaccess.add_budget_arguments(p, DEFAULT_MEMORY_MB, DEFAULT_MAX_SERIES,
                                    "what is shed to stay under it is counted and shown on the page")
    p.add_argument("--wait-history-mb", type=number_arg(float, lo=0, hi=1 << 30), default=WAIT_HISTORY_MB,
                   metavar="MB", help=f"a history (metrics.jsonl and its pieces) up to this size is read before "
                   f"serving; a larger one while serving, the page showing what came so far (default {WAIT_HISTORY_MB:g})")


def _pub_from_environment() -> bool:
    from telemetry.shared import endpoints

    return any(os.environ.get(v) for v in (endpoints.ENV_PUB, endpoints.ENV_RUNTIME_DIR, endpoints.ENV_RUN_NAME))


def find_runs(path: Path) -> list[Path]:
    """The telemetry dirs under `path`: itself (a run), or each run dir directly inside it."""
    from telemetry.consumers.readjsonl import find_log_dir

    try:
        return [find_log_dir(path)]
    except FileNotFoundError:
        pass
    runs = []
    if path.is_dir():
        for child in sorted(path.iterdir()):
            if child.is_dir():
                try:
                    runs.append(find_log_dir(child))
                except FileNotFoundError:
                    continue
    return runs


def _load_then_follow(hub, feeds) -> None:
    """A long history, read while the server answers (pages show what came so far and the
    progress); then every page reloads once (Hub.reset) and the feeds go live."""
    for feed in feeds:
        try:
            feed.load_history()
        finally:
            feed.store.loading_history = False
    hub.reset()
    for feed in feeds:
        feed.start()


def _fail(msg: str) -> int:
    print(f"telemetry dashboard: {msg}", file=sys.stderr)
    return 2


def _said_once(store) -> None:
    from telemetry.consumers.terminal import printable

    # The run's name may be a hello's (wandb.init's name, or whatever a TCP publisher sent): one
    # line, no escape sequence reaches the terminal.
    print(f"telemetry dashboard: run {printable(store.name)}: {len(store.series):,} series kept (its share of "
          "--max-series and --memory-mb): values of new series are dropped from now on, counted on the page",
          file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers import httpaccess
    from telemetry.consumers.dashboard.budget import plan
    from telemetry.consumers.dashboard.live import FileFeed, Hub, PubFeed
    from telemetry.consumers.dashboard.server import DashboardServer
    from telemetry.consumers.dashboard.store import RunStore
    from telemetry.consumers.readjsonl import Unreadable, history_bytes, run_dir_of
    from telemetry.consumers.subscribe import AttachError, attach

    port, memory_mb, max_series = args.port, args.memory_mb, args.max_series
    try:
        token = httpaccess.token_from_args(args)
    except httpaccess.FlagError as exc:
        return _fail(str(exc))
    refusal = httpaccess.refuse_remote(args.addr, port, args.allow_remote,
                                       "could read the run" + (" (--no-token: no login at all)" if token is None
                                                               else " with its token"))
    if refusal:
        return _fail(refusal)
    log_dirs: list[Path] = []
    root = Path(args.run_dir) if args.run_dir else None
    if root is not None:
        if not root.exists():
            return _fail(f"{root} does not exist")
        try:
            log_dirs = find_runs(root)
        except Unreadable as exc:
            return _fail(str(exc))
        if not log_dirs:
            if not root.is_dir():     # a file is never a run about to start, whatever the environment
                return _fail(f"no metrics.jsonl in {root} or {root / 'telemetry'}")
            if not (args.pub or _pub_from_environment()):
                return _fail(f"no metrics.jsonl in {root}, {root / 'telemetry'} or the run dirs inside {root}")
            # A run about to write its first records: live, and its dir for drain.json.
            log_dirs = [root / "telemetry" if (root / "telemetry").is_dir() else root]
    live_pub = args.pub is not None or _pub_from_environment() or root is None
    if len(log_dirs) > 1 and args.pub:
        return _fail("--pub names one daemon: give one run dir with it (several runs are followed from their files)")

    budget = plan(memory_mb, max_series, num_runs=max(1, len(log_dirs)))
    stores, feeds = [], []
    hub = Hub(max_log_bytes=budget.max_log_bytes)
    try:
        if len(log_dirs) <= 1 and live_pub:
            log_dir = log_dirs[0] if log_dirs else None
            name = run_dir_of(log_dir).name if log_dir else "live"
            # Attach first: what the daemon publishes while the history is read is queued.
            sub = attach("telemetry dashboard", args.pub, watch_connection=True)
            store = RunStore("r0", name, log_dir, limits=budget.store)
            feed = PubFeed(hub, store, sub, log_dir)
            stores.append(store)
            feeds.append(feed)
        else:
            from telemetry.consumers.subscribe import detach_on_signals

            detach_on_signals()
            for i, log_dir in enumerate(log_dirs):
                store = RunStore(f"r{i}", run_dir_of(log_dir).name, log_dir, name_from_hello=len(log_dirs) == 1,
                                 limits=budget.store)
                stores.append(store)
                feeds.append(FileFeed(hub, store, log_dir))
    except AttachError as exc:
        print(exc, file=sys.stderr)
        return 2
    for store in stores:
        store.on_first_drop = _said_once
        hub.add(store)
    server = None
    history_mb = sum(history_bytes(s.log_dir) for s in stores) / 2**20
    in_background = history_mb > args.wait_history_mb
    try:
        if not in_background:
            for feed in feeds:
                feed.load_history()
        try:
            server = DashboardServer((args.addr, port), hub, allow_any_host=args.allow_remote, token=token,
                                     max_points_sent=budget.max_points_sent, max_range_bytes=budget.max_range_bytes)
        except (OSError, OverflowError) as exc:
            print(httpaccess.cannot_listen("telemetry dashboard", args.addr, port, exc), file=sys.stderr)
            return 2    # the --port or --addr given, as the daemon's taken endpoint is
        if in_background:
            for store in stores:
                store.loading_history = True
            threading.Thread(target=_load_then_follow, args=(hub, feeds), name="dashboard-history",
                             daemon=True).start()
        else:
            for feed in feeds:
                feed.start()
        host, bound = server.server_address[:2]
        shown = "127.0.0.1" if host in ("127.0.0.1", "0.0.0.0") else host
        names = ", ".join(s.name for s in stores)
        # The random token is in the address, once (as Jupyter prints it); a token of the user's own is not.
        url = f"http://{shown}:{bound}/" + (f"#token={token}" if token and not args.token_file else "")
        access = ("no token: every local user can read it" if token is None
                  else f"token from {args.token_file}: add #token=..." if args.token_file
                  else "the address carries its token")
        print(f"telemetry dashboard: serving {url} ({len(stores)} run{'s' if len(stores) > 1 else ''}: "
              f"{names}; live from {stores[0].source if len(stores) == 1 else 'their metrics.jsonl'}; {access}; "
              f"memory budget {memory_mb} MB)"
              + (f"; reading its {history_mb:,.0f} MB of history while serving" if in_background else ""), flush=True)
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.stopping = True
            server.server_close()
        for feed in feeds:
            feed.stop()
            if not feed.is_alive() and isinstance(feed, PubFeed) and not feed.ident:
                feed.sub.close()   # never started: its socket is still ours to close
    return 0
