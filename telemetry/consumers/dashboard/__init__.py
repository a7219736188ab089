"""A live dashboard in the browser: the run's history from metrics.jsonl, then live updates.

    telemetry dashboard [RUN_DIR] [--pub EP] [--port 8765] [--addr 127.0.0.1]

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

The page is served on 127.0.0.1. It has no login: to serve it beyond loopback (--addr), pass
--allow-remote as well, or better keep it on loopback and tunnel the port
(ssh -N -L 8765:127.0.0.1:8765 host).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_PORT = 8765


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                   help="run dir, its telemetry dir, or a folder of run dirs (several runs side by side)")
    p.add_argument("--pub", metavar="EP", help="the daemon's PUB endpoint for live updates (default "
                   "$TELEMETRY_PUB, or the run's ipc socket when $TELEMETRY_RUNTIME_DIR or $TELEMETRY_RUN_NAME "
                   "is set; else metrics.jsonl is followed)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT}; 0 = any free)")
    p.add_argument("--addr", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow an --addr beyond loopback: anyone who reaches the port sees the run (no login)")


def _pub_from_environment() -> bool:
    from telemetry.shared import endpoints

    return any(os.environ.get(v) for v in (endpoints.ENV_PUB, endpoints.ENV_RUNTIME_DIR, endpoints.ENV_RUN_NAME))


def _is_loopback_addr(addr: str) -> bool:
    from telemetry.shared.endpoints import is_loopback

    return is_loopback(f"tcp://{addr}:0")


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


def _fail(msg: str) -> int:
    print(f"telemetry dashboard: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.dashboard.live import FileFeed, Hub, PubFeed
    from telemetry.consumers.dashboard.server import DashboardServer
    from telemetry.consumers.dashboard.store import RunStore
    from telemetry.consumers.readjsonl import run_dir_of
    from telemetry.consumers.subscribe import AttachError, attach

    if not _is_loopback_addr(args.addr) and not args.allow_remote:
        return _fail(f"--addr {args.addr} is beyond loopback and the page has no login: anyone who reaches "
                     "the port would see the run. Pass --allow-remote to serve it anyway, or keep 127.0.0.1 "
                     f"and tunnel it (ssh -N -L {args.port}:127.0.0.1:{args.port} host)")
    if not 0 <= args.port <= 65535:
        return _fail(f"--port {args.port}: expected 0..65535")
    log_dirs: list[Path] = []
    root = Path(args.run_dir) if args.run_dir else None
    if root is not None:
        if not root.exists():
            return _fail(f"{root} does not exist")
        log_dirs = find_runs(root)
        if not log_dirs:
            if not (args.pub or _pub_from_environment()):
                return _fail(f"no metrics.jsonl in {root}, {root / 'telemetry'} or the run dirs inside {root}")
            # A run about to write its first records: live, and its dir for drain.json.
            log_dirs = [root / "telemetry" if (root / "telemetry").is_dir() else root]
    live_pub = args.pub is not None or _pub_from_environment() or root is None
    if len(log_dirs) > 1 and args.pub:
        return _fail("--pub names one daemon: give one run dir with it (several runs are followed from their files)")

    stores, feeds = [], []
    hub = Hub()
    try:
        if len(log_dirs) <= 1 and live_pub:
            log_dir = log_dirs[0] if log_dirs else None
            name = run_dir_of(log_dir).name if log_dir else "live"
            # Attach first: what the daemon publishes while the history is read is queued.
            sub = attach("telemetry dashboard", args.pub, watch_connection=True)
            store = RunStore("r0", name, log_dir)
            feed = PubFeed(hub, store, sub, log_dir)
            stores.append(store)
            feeds.append(feed)
        else:
            from telemetry.consumers.subscribe import detach_on_signals

            detach_on_signals()
            for i, log_dir in enumerate(log_dirs):
                store = RunStore(f"r{i}", run_dir_of(log_dir).name, log_dir, name_from_hello=len(log_dirs) == 1)
                stores.append(store)
                feeds.append(FileFeed(hub, store, log_dir))
    except AttachError as exc:
        print(exc, file=sys.stderr)
        return 2
    for store in stores:
        hub.add(store)
    server = None
    try:
        for feed in feeds:
            feed.load_history()
        try:
            server = DashboardServer((args.addr, args.port), hub, allow_any_host=args.allow_remote)
        except OSError as exc:
            print(f"telemetry dashboard: cannot listen on {args.addr}:{args.port}: {exc}", file=sys.stderr)
            return 1
        for feed in feeds:
            feed.start()
        host, port = server.server_address[:2]
        shown = "127.0.0.1" if host in ("127.0.0.1", "0.0.0.0") else host
        names = ", ".join(s.name for s in stores)
        print(f"telemetry dashboard: serving http://{shown}:{port}/ ({len(stores)} run{'s' if len(stores) > 1 else ''}: "
              f"{names}; live from {stores[0].source if len(stores) == 1 else 'their metrics.jsonl'})", flush=True)
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
