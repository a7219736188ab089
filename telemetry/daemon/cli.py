"""Run the telemetry daemon: ingest records from training ranks, aggregate them per step,
write <log-dir>/metrics.jsonl, publish on PUB, log to W&B, answer on the control socket.

Prints a line containing "telemetry daemon ready" once every socket is bound. SIGTERM, SIGINT
or `telemetry drain` stop intake, drain every queue, fsync and exit.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from telemetry.shared.config import nonempty_arg, out_dir_arg, writable_dir_problem
from telemetry.shared.endpoints import endpoint_arg


MAX_PID = 1 << 22          # Linux's pid_max can go no higher


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ingest", type=endpoint_arg, metavar="EP", help="PULL endpoint the ranks send to "
                   "(default $TELEMETRY_ENDPOINT, else a private ipc socket)")
    p.add_argument("--pub", type=endpoint_arg, metavar="EP", help="PUB endpoint for consumers (default $TELEMETRY_PUB or ipc)")
    p.add_argument("--control", type=endpoint_arg, metavar="EP", help="control endpoint for status/drain "
                   "(default $TELEMETRY_CONTROL or ipc)")
    p.add_argument("--log-dir", type=out_dir_arg, metavar="DIR", help="where metrics.jsonl and daemon.log go (default ./telemetry)")
    p.add_argument("--run-name", type=nonempty_arg, metavar="NAME", help="run name (W&B, reports); default: the log dir's parent")
    p.add_argument("--wandb", choices=("disabled", "offline", "online"), help="W&B mode (default offline)")
    p.add_argument("--config", type=nonempty_arg, metavar="FILE", help="daemon YAML config; flags override it")
    p.add_argument("--world-size", type=int, metavar="N", help="ranks to wait for per step (default: from hellos); "
                   "a node daemon: its ranks, a head: its nodes, a group head: the nodes of its group")
    p.add_argument("--per-rank", action="store_true", default=None, help="also write each rank's own records")
    p.add_argument("--quiet", action="store_true", help="log warnings and errors only")
    p.add_argument("--watch-pid", type=int, metavar="PID", help="drain and exit once process PID has exited "
                   "(a daemon started for one script: telemetry.wandb.init and the integrations start it so)")
    p.add_argument("--remove-runtime-dir", action="store_true",
                   help="remove $TELEMETRY_RUNTIME_DIR (its sockets' directory, made for this run alone) when it "
                        "exits after its drain: `telemetry run` passes it, so that the directory goes also when "
                        "`telemetry run` itself was killed")
    m = p.add_argument_group("multi-node (docs/multinode.md)")
    m.add_argument("--remote-ingest", type=endpoint_arg, metavar="EP", help="head: also accept node daemons on this TCP "
                   "endpoint (CURVE required beyond loopback: security section of --config)")
    m.add_argument("--forward", type=endpoint_arg, metavar="EP", help="node: forward this node's aggregated records to the "
                   "head daemon's remote ingest (tcp://HEAD:PORT)")
    m.add_argument("--node-rank", type=int, metavar="N", help="node: this node's rank (with --forward); a group head "
                   "(--remote-ingest and --forward): its group's index")
    m.add_argument("--num-nodes", type=int, metavar="N", help="node: number of nodes (with --forward); a group head: "
                   "the number of groups")


def run(args: argparse.Namespace) -> int:
    import logging

    from telemetry.daemon.config import ConfigError, load
    from telemetry.daemon.core import Daemon
    from telemetry.daemon import process
    from telemetry.daemon.process import setup_logging
    from telemetry.daemon.sinks.base import StartupError
    from telemetry.shared.endpoints import EndpointError
    from telemetry.shared import files, run_lock
    from telemetry.shared.run_lock import RunDirInUse
    from telemetry.shared.procs import alive

    # Before anything is made: a process that is not running would only start a daemon that
    # drains at once (a typo'd or stale pid), exit 0, having watched nothing.
    if args.watch_pid is not None and not 0 < args.watch_pid <= MAX_PID:
        print(f"telemetry daemon: --watch-pid must be a process id (1..{MAX_PID}), got {args.watch_pid}",
              file=sys.stderr)
        return 2
    if args.watch_pid is not None and not alive(args.watch_pid):
        print(f"telemetry daemon: --watch-pid {args.watch_pid}: no such process runs on this host (it has "
              "exited, or the pid is wrong)", file=sys.stderr)
        return 2

    overrides = {
        "ingest": args.ingest, "pub": args.pub, "control": args.control, "log_dir": args.log_dir,
        "run_name": args.run_name, "wandb.mode": args.wandb, "aggregator.world_size": args.world_size,
        "aggregator.per_rank": args.per_rank,
        "remote_ingest": args.remote_ingest, "forward.endpoint": args.forward,
        "forward.node_rank": args.node_rank, "forward.num_nodes": args.num_nodes,
    }
    try:
        cfg = load(args.config, overrides)
    except ConfigError as exc:
        print(f"telemetry daemon: bad config: {exc}", file=sys.stderr)
        return 2
    # Before anything is written: every file of the run, W&B's and TensorBoard's included, is
    # born 0600 / 0700 (0640 / 0750 with files.group_readable).
    files.apply(cfg.files.group_readable)
    # The run directory's lock before anything is written or chmod-ed there (daemon.log, the
    # probe below): a daemon refused a live run's directory leaves it as it found it.
    try:
        run_lock_fd = run_lock.hold(Path(cfg.log_dir))
    except RunDirInUse as exc:
        print(f"telemetry daemon: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"telemetry daemon: log dir {cfg.log_dir}: cannot create or write it ({exc.strerror or exc})",
              file=sys.stderr)
        return 2
    why = writable_dir_problem(cfg.log_dir)   # before any socket or thread: one line, exit 2
    if why:
        print(f"telemetry daemon: log dir {why}", file=sys.stderr)
        return 2
    remove_runtime_dir = None
    if args.remove_runtime_dir:
        from telemetry.shared.endpoints import ENV_RUNTIME_DIR

        if not os.environ.get(ENV_RUNTIME_DIR):
            print(f"telemetry daemon: --remove-runtime-dir needs ${ENV_RUNTIME_DIR} (the directory to remove)",
                  file=sys.stderr)
            return 2
        remove_runtime_dir = Path(os.path.abspath(os.environ[ENV_RUNTIME_DIR]))
    # The budget is the whole process's: its own baseline (measured now that the daemon's
    # modules are imported, plus what set-up and its lazily imported sinks add) must leave room
    # for its work and its buffers, or the budget cannot be kept.
    from telemetry.daemon import memory

    with_wandb = cfg.wandb.enabled and cfg.wandb.mode != "disabled"
    baseline = memory.baseline_mb(wandb=with_wandb, tensorboard=cfg.tensorboard.enabled)
    links = cfg.head_links()
    least = memory.smallest_mb(baseline, links)
    if cfg.memory_mb < least:
        nodes = f", its {links:,} node links {memory.links_mb(links):.0f} MB" if links else ""
        print(f"telemetry daemon: memory_mb {cfg.memory_mb:g} cannot be kept: the smallest that works here is "
              f"{least} (the process itself takes {baseline:.0f} MB{' with W&B' if with_wandb else ''}, "
              f"{memory.WORKING_MB} MB more while it works{nodes}, and its buffers at least "
              f"{memory.MIN_BUFFERS_MB:g} MB)", file=sys.stderr)
        return 2
    daemon = Daemon(cfg, memory.Budget(cfg.memory_mb, baseline, links))
    if args.watch_pid is not None:
        daemon.watched = process.Watched(args.watch_pid)
    daemon.remove_runtime_dir = remove_runtime_dir
    daemon.run_lock_fd = run_lock_fd
    try:
        setup_logging(Path(cfg.log_dir), logging.WARNING if args.quiet else logging.INFO)
        daemon.start()
    except ConfigError as exc:    # a custom sink that cannot be built
        print(f"telemetry daemon: bad config: {exc}", file=sys.stderr)
        return 2
    except (EndpointError, StartupError, RunDirInUse) as exc:
        print(f"telemetry daemon: {exc}", file=sys.stderr)
        return 2
    rc = daemon.run()
    if daemon.unfinished:
        # A sink thread is stuck (a hung W&B finish, a dead NFS mount): interpreter exit would
        # wait on it or on wandb's own atexit hooks. Everything that could be written is.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc
