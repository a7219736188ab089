"""Run any training script under the sidecar: start a daemon for it, point its ranks at it, launch
it (one process, or torchrun with --nproc N), stream the daemon's log, drain, print the summary,
and exit with the script's own exit code (128+N when a rank was killed by signal N).

    telemetry run -- train.py --batch_size 12            (python train.py ...)
    telemetry run --nproc 2 -- train.py                   (torchrun --standalone --nproc-per-node 2)
    telemetry run --nproc 2 -- -m mypkg.train --lr 3e-4  (a module, as python -m)
    telemetry run --as-wandb -- train.py                  (its own `import wandb`, unchanged)
    telemetry run --nproc 2 --launcher deepspeed -- -m trainer.train --config c.yaml
    telemetry run --attach dashboard -- train.py          (the live dashboard beside it)

`launch/run.sh` is this command with our trainer as the script.

The script logs as it already does: `import telemetry.wandb as wandb`, an integration (the HF
callback, the Lightning logger, the Accelerate tracker) or a TelemetryClient; each finds this
run's daemon through $TELEMETRY_RUNTIME_DIR (a private directory for the run's sockets). The run
goes to --run-dir (default ./telemetry/<run-id>/): metrics.jsonl, daemon.log, drain.json.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from telemetry.shared.ourpython import module_cmd
from telemetry.shared.signals import at_foreground_terminal, has_controlling_terminal

MAX_NPROC = 1024
# Beyond the daemon's own drain deadline, how long `telemetry run` waits for its final counters and exit.
DRAIN_MARGIN_S = 30.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    from telemetry.shared.config import nonempty_arg, out_dir_arg

    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="processes (ranks) on this node: 1 runs the script directly, more run it under "
                        f"torchrun --standalone (1..{MAX_NPROC}; default 1)")
    p.add_argument("--world-size", type=int, metavar="N",
                   help="ranks the daemon waits for at each step (default: what the ranks' hellos say: a W&B "
                        "script that logs on rank 0 alone promises only rank 0)")
    p.add_argument("--run-dir", type=out_dir_arg, metavar="DIR", help="where the run goes (default ./telemetry/<run-id>)")
    p.add_argument("--run-name", type=nonempty_arg, metavar="NAME", help="the run's name (W&B, reports; default its id)")
    p.add_argument("--wandb", choices=("disabled", "offline", "online"),
                   help="the daemon's W&B mode (default: $WANDB_MODE, else offline)")
    p.add_argument("--daemon-config", type=nonempty_arg, metavar="FILE", help="the daemon's YAML config (README, Daemon config)")
    p.add_argument("--launcher", choices=("torchrun", "deepspeed"), default="torchrun",
                   help="how more than one rank is launched (default torchrun; deepspeed: DeepSpeed's launcher, "
                        "always, also for one rank); either way the exit code is the first failed rank's")
    p.add_argument("--attach", choices=("tail", "dashboard"),
                   help="beside the run: tail (a tmux pane inside tmux, else RUN_DIR/tail.log) or dashboard "
                        "(http://127.0.0.1:$TELEMETRY_DASHBOARD_PORT, default 8765; it stays up after the run "
                        "until Enter when stdin is a terminal)")
    p.add_argument("--quiet", action="store_true", help="do not stream the daemon's log")
    p.add_argument("--as-wandb", action="store_true",
                   help="the script's own `import wandb` (and transformers' report_to=\"wandb\", Lightning's "
                        "WandbLogger, Accelerate's log_with=\"wandb\") logs through the sidecar: zero changed lines")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- SCRIPT [ARGS]",
                   help="the script and its arguments (or -m MODULE and its arguments)")


def _fail(msg: str) -> int:
    print(f"telemetry run: {msg}", file=sys.stderr)
    return 2


def _target(command: list[str]) -> tuple[list[str] | None, str]:
    """The program to launch (script or -m module, and its arguments), or None and why not."""
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        return None, "give the script to run after --: telemetry run [options] -- SCRIPT [ARGS]"
    if command[0] == "-m":
        if len(command) < 2 or not command[1] or command[1].startswith("-"):
            return None, "-m needs a module name: telemetry run -- -m MODULE [ARGS]"
        return command, ""
    script = Path(command[0])
    if not script.is_file():
        return None, f"{command[0]}: no such script" if not script.exists() else f"{command[0]}: not a file"
    return command, ""


def _daemon_config(path: str | None) -> tuple[str | None, float, str]:
    """(the wandb.mode the daemon config file sets, or None; its drain_timeout_s; why the file is
    refused, or ''), checked as the daemon checks it, before anything of the run is made or
    started. No file: the defaults."""
    from telemetry.daemon.config import load
    from telemetry.shared.config import ConfigError, ConfigFileError, read_yaml

    if path is None:
        return None, load(None, {}).drain_timeout_s, ""
    try:
        cfg = load(path, {})
        wandb = read_yaml(path).get("wandb")
    except ConfigFileError as exc:     # said as the daemon and `metrics --config` say it: not found, a directory
        return None, 0.0, exc.why
    except ConfigError as exc:
        return None, 0.0, f"bad config: {exc}"
    # The run's daemon listens where the run's script is pointed (the run's private socket
    # directory): an endpoint of the file's would be the daemon's alone, and every record the
    # script sent would go where no daemon listens, the run's summary saying none was lost.
    own = [f"{name}: {getattr(cfg, name)}" for name in ("ingest", "pub", "control") if getattr(cfg, name)]
    if own:
        return None, 0.0, (f"sets {', '.join(own)}: telemetry run gives its daemon the run's own endpoints and "
                           f"points the script at them; remove {'it' if len(own) == 1 else 'them'}, or start the "
                           f"daemon yourself (telemetry daemon --config FILE) and set the script's "
                           f"TELEMETRY_ENDPOINT")
    return (wandb.get("mode") if isinstance(wandb, dict) else None), cfg.drain_timeout_s, ""


def _drain_wait_s(drain_timeout_s: float, mode: str) -> float:
    """How long to wait for the daemon's drain before killing it: its own deadline, the time its
    drain may add for W&B's start on a loaded host (sinks/wandb_sink.py), and the final
    counters' margin."""
    from telemetry.daemon.sinks.wandb_sink import PHASE_ALLOWANCE_S

    return drain_timeout_s + (PHASE_ALLOWANCE_S if mode != "disabled" else 0.0) + DRAIN_MARGIN_S


def run(args: argparse.Namespace) -> int:
    rc = _run(args)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        # The terminal is gone (SIGHUP): what is left to write goes nowhere, and the exit code
        # stays the script's (a failed flush at exit would make it 120).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    return rc


def _run(args: argparse.Namespace) -> int:
    from telemetry.client import autostart
    from telemetry.integrations.wandb_run import ENV_RUN_ID
    from telemetry.integrations.wandb_settings import sink_mode
    from telemetry.shared import endpoints, files, run_lock
    from telemetry.tools import other_runs

    target, why = _target(list(args.command))
    if target is None:
        return _fail(why)
    if not 1 <= args.nproc <= MAX_NPROC:
        return _fail(f"--nproc must be 1..{MAX_NPROC}, got {args.nproc}")
    if args.world_size is not None and not 1 <= args.world_size <= 65536:
        return _fail(f"--world-size must be 1..65536, got {args.world_size}")
    file_mode, drain_timeout_s, why = _daemon_config(args.daemon_config)
    if why:
        return _fail(f"--daemon-config {args.daemon_config}: {why}")
    port = os.environ.get("TELEMETRY_DASHBOARD_PORT", "8765")
    if args.attach == "dashboard" and not (port.isdigit() and int(port) <= 65535):
        return _fail(f"TELEMETRY_DASHBOARD_PORT must be a port number, got {port[:40]!r}")
    run_id = autostart.new_run_id()
    name = args.run_name or run_id
    log_dir = Path(args.run_dir or Path("telemetry") / run_id).absolute()
    try:
        # Before anything is written (or chmod-ed) there; the daemon takes this same lock over
        # (run_lock.py). It makes the directory, or checks an existing one is ours.
        lock_fd = run_lock.hold(log_dir)
    except run_lock.RunDirInUse as exc:
        return _fail(f"{'--run-dir' if args.run_dir else 'run directory'} {exc}")
    except OSError as exc:
        return _fail(f"{'--run-dir' if args.run_dir else 'run directory'} {log_dir}: cannot make it "
                     f"({exc.strerror or exc})")
    # The run's private socket directory: $TELEMETRY_RUNTIME_DIR when the caller chose one.
    try:
        runtime, made_runtime = _runtime_dir(run_id)     # what this run made: removed at its end
    except endpoints.EndpointError as exc:
        return _fail(f"runtime directory: {exc}")
    _forget_claim(runtime)      # an earlier launch's, in a runtime directory the caller reuses
    env = {k: v for k, v in os.environ.items()
           if k not in (endpoints.ENV_INGEST, endpoints.ENV_PUB, endpoints.ENV_CONTROL)}
    # The ranks' runs of this id find this run's daemon in `runtime`. A run the script makes with
    # another id (k-fold's next fold, a sweep's trials, forked children) is a run of its own: its
    # own daemon (autostart), its directory beside this one ($TELEMETRY_DIR unless given).
    env.update({endpoints.ENV_RUNTIME_DIR: str(runtime), endpoints.ENV_RUN_NAME: name, ENV_RUN_ID: run_id})
    env.setdefault(autostart.ENV_DIR, str(log_dir.parent))
    if args.as_wandb:
        # `import wandb` in the script finds telemetry's (integrations/as_wandb/wandb); the daemon,
        # started with the environment before this, keeps the real W&B for its sink.
        shim = str(Path(__file__).resolve().parent.parent / "integrations" / "as_wandb")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (shim, env.get("PYTHONPATH", "")) if p)
    # W&B's mode is the daemon's (its W&B sink); the ranks log to the daemon whatever it is, so
    # $WANDB_MODE=disabled does not turn the script's telemetry.wandb into a stand-in. Only an
    # explicit --wandb overrides the daemon config's wandb.mode (docs/config.md).
    env_mode = env.pop("WANDB_MODE", None)
    # W&B's other names for its modes ("shared", "run", "dryrun") as W&B reads $WANDB_MODE.
    mode = sink_mode(args.wandb or file_mode or env_mode or "offline")
    if mode not in ("disabled", "offline", "online"):
        mode = "offline"
    env[autostart.ENV_WANDB_MODE] = mode       # the daemons of the script's other runs: the same mode
    drain_wait_s = _drain_wait_s(drain_timeout_s, mode)
    if mode != "disabled":
        env["WANDB_MODE"] = mode               # what the script's W&B code reads (transformers says "offline mode")
    if args.daemon_config:                     # ... and the same config
        env[autostart.ENV_DAEMON_CONFIG] = str(Path(args.daemon_config).absolute())
    # --watch-pid: a `telemetry run` killed outright (SIGKILL) still leaves a drained run behind.
    cmd = [*module_cmd("telemetry"), "daemon", "--log-dir", str(log_dir), "--run-name", name,
           "--wandb", mode, "--watch-pid", str(os.getpid())]
    if made_runtime:
        # The runtime directory is this run's alone: whichever daemon ends the run removes it,
        # also when this process is gone (SIGKILLed: the daemon outlives it and drains).
        cmd.append("--remove-runtime-dir")
    if args.world_size is not None:
        cmd += ["--world-size", str(args.world_size)]
    if args.daemon_config:
        cmd += ["--config", args.daemon_config]
    out_path = log_dir / "daemon.out"
    daemon_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    if os.environ.get("PYTHONPATH"):
        daemon_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    daemon_env[run_lock.ENV_FD] = str(lock_fd)
    attached: list[subprocess.Popen] = []
    try:
        out = files.open_append(out_path)
    except OSError as exc:      # a symlink or another user's file at its name: refused, not written
        _forget_runtime(made_runtime)
        return _fail(f"--run-dir {log_dir}: cannot write {out_path.name} ({exc.strerror or exc})")
    signals = _Signals()       # from here on a signal never leaves the daemon undrained
    keeper = None
    stop_stream = threading.Event()
    streamer = None
    left_draining = False      # the daemon drains on by itself (a second signal stopped the wait)
    with out:
        out_start = out.seek(0, os.SEEK_END)     # what an earlier run of the directory wrote there
        daemon = subprocess.Popen(cmd, env=daemon_env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True, pass_fds=(lock_fd,))
    try:
        signals.arm()        # a signal that came while the daemon's process was made: now
        why = autostart._wait_ready(daemon, out_path, start=out_start)
        if why:
            print(f"telemetry run: the daemon did not start: {why}", file=sys.stderr)
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
            # Its exit 2 is a refusal of what it was given (--daemon-config, the run directory):
            # bad input to this command too.
            return 2 if daemon.poll() == 2 else 1
        print(f"telemetry run: run {name}: daemon pid {daemon.pid}, writing to {log_dir}; watch it with "
              f"`telemetry tail --run-dir {log_dir}` (it follows the run across relaunches; this launch's "
              f"sockets alone: `TELEMETRY_RUNTIME_DIR={runtime} telemetry tail`)", file=sys.stderr, flush=True)
        if not args.quiet:
            streamer = threading.Thread(target=_stream, args=(out_path, stop_stream, out_start), daemon=True)
            streamer.start()
        if args.attach:
            attached = _attach(args.attach, log_dir, runtime, env, port)
        if mode != "disabled":
            threading.Thread(target=_watch_wandb_run, args=(runtime, log_dir, stop_stream),
                             name="telemetry-run-wandb-watch", daemon=True).start()

        def successor() -> subprocess.Popen:
            with files.open_append(out_path) as out:
                return subprocess.Popen(cmd, env=daemon_env, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(lock_fd,))

        keeper = _DaemonKeeper(daemon, successor, out_path)
        rc = _launch(target, args.nproc, env, args.launcher, signals)
        exited_at = time.time()
        daemon = keeper.stop()
        try:
            # First: their socket directories are in this run's, which its daemon removes at its drain.
            other_runs.wait(runtime, drain_wait_s, _say)
        except _StopWaiting:
            _say("telemetry run: not waiting for the script's other runs: each finishes by itself")
        _drain(daemon, runtime, log_dir, rc, exited_at, drain_wait_s)
        # What the daemon said while it drained (clients without a bye, records counted lost)
        # is on the terminal before the summary: the stream stops once it has read to the end
        # of what the exited daemon wrote.
        stop_stream.set()
        if streamer is not None:
            streamer.join(5)
        signals.phase = _Signals.DONE
        _summary(log_dir, rc)
        keep = [p for p in attached if args.attach == "dashboard"] if args.attach else []
        if keep and sys.stdin.isatty():
            # The page is most useful right after the run (it shows the run as ended): kept up
            # until the user is done with it.
            print(f"telemetry run: the dashboard stays up: {_dashboard_url(log_dir)}  (Enter stops it)", flush=True)
            try:
                sys.stdin.readline()
            except (OSError, KeyboardInterrupt, _StopWaiting):
                pass
        return rc
    except _Interrupted as exc:
        # Before the script started: nothing of it ran. The daemon drains below, once it is
        # ready (a daemon SIGTERMed while it starts dies undrained, its W&B run unfinished).
        _say(f"telemetry run: {signal.Signals(exc.signum).name} before the script started: it is not run; "
             f"the daemon drains")
        try:
            autostart._wait_ready(daemon, out_path, start=out_start)
        except _StopWaiting:
            pass
        return 128 + exc.signum
    except _StopWaiting:
        # A second signal during the drain: the wait stops, the drain does not. The daemon
        # (its own session) finishes it, writes drain.json and removes the runtime directory.
        if keeper is not None:
            daemon = keeper.daemon
        left_draining = daemon.poll() is None
        if left_draining:
            _say(f"telemetry run: not waiting for the drain: the daemon (pid {daemon.pid}) finishes it by itself; "
                 f"its final counters go to {log_dir / 'drain.json'} (`telemetry report {log_dir}` then)")
        return signals.script_rc
    finally:
        stop_stream.set()
        for p in attached:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        if keeper is not None:
            keeper.stop(wait=False)
            daemon = keeper.daemon
        if daemon.poll() is None and not left_draining:
            # Not drained yet (a signal before the script started, an error of ours): SIGTERM
            # drains it as a drain request would, without the script's exit code.
            signals.phase = _Signals.DRAINING
            try:
                daemon.send_signal(signal.SIGTERM)
                _wait_daemon(daemon, drain_wait_s)
            except _StopWaiting:
                left_draining = True
                _say(f"telemetry run: not waiting for the drain: the daemon (pid {daemon.pid}) finishes it by itself")
        signals.restore()
        _forget_claim(runtime)
        if daemon.poll() is not None:       # else the draining daemon removes it when it is done
            _forget_runtime(made_runtime)


def _forget_runtime(made_runtime: tuple[Path, ...]) -> None:
    """Remove the runtime directory this launch made, and a parent made for it when nothing
    else went there."""
    if made_runtime:
        shutil.rmtree(made_runtime[0], ignore_errors=True)
        try:
            for parent in made_runtime[1:]:
                os.rmdir(parent)
        except OSError:
            pass


class _DaemonKeeper:
    """While the script runs, a daemon that dies (killed, crashed: anything but a stop it was
    asked for, which writes its drain.json, or a refusal, exit 2) is followed by a successor on
    the same run directory and
    sockets, at most MAX_RESTARTS times: the ranks' clients reconnect by themselves, and the
    successor takes the run over from its files (checkpoint, sources.json) and the clients' seq
    pages, so what the dead one never wrote is counted lost, exactly. Without it the ranks sent
    into nothing for the rest of the run, counted by no one, and the launcher waited a minute
    for a drain nobody could answer."""

    MAX_RESTARTS = 3

    def __init__(self, daemon: subprocess.Popen, start: Callable[[], subprocess.Popen], out_path: Path) -> None:
        self.daemon, self._start, self._out_path = daemon, start, out_path
        self.restarts = 0
        self._done = False     # nothing more to watch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="telemetry-run-daemon-keeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5) and self._check():
            pass

    def _stopped_as_asked(self) -> bool:
        """Whether the daemon that exited drained first (a `telemetry drain`, SIGTERM): its
        drain.json is its own. A drain whose JSONL was unfinished exits 1, and is no crash."""
        import json

        try:
            return json.loads((self._out_path.parent / "drain.json").read_text()).get("pid") == self.daemon.pid
        except (OSError, ValueError, AttributeError):
            return False

    def _check(self) -> bool:
        """One look at the daemon; a successor for a dead one. False once there is nothing more
        to watch (stopped as asked, refused, no successor possible)."""
        from telemetry.client import autostart

        if self._done:
            return False
        rc = self.daemon.poll()
        if rc is None:
            return True
        self._done = True      # unless a successor starts, below
        if rc in (0, 2) or self._stopped_as_asked():    # as asked, or it refused its input
            return False
        how = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        if self.restarts >= self.MAX_RESTARTS:
            print(f"telemetry run: the daemon (pid {self.daemon.pid}) {how}; no more successors "
                  f"({self.restarts} started): the rest of the run is not kept", file=sys.stderr, flush=True)
            return False
        self.restarts += 1
        start = self._out_path.stat().st_size if self._out_path.exists() else 0
        print(f"telemetry run: the daemon (pid {self.daemon.pid}) {how} during the run; starting a successor "
              f"on the same run directory (what it had not written is counted lost)", file=sys.stderr, flush=True)
        try:
            daemon = self._start()
        except OSError as exc:
            print(f"telemetry run: no successor ({exc}): the rest of the run is not kept", file=sys.stderr)
            return False
        why = autostart._wait_ready(daemon, self._out_path, start=start)
        self.daemon = daemon
        if why:
            print(f"telemetry run: the successor did not start: {why}", file=sys.stderr, flush=True)
            return False
        print(f"telemetry run: the successor, pid {daemon.pid}, is ready", file=sys.stderr, flush=True)
        self._done = False
        return True

    def stop(self, wait: bool = True) -> subprocess.Popen:
        """Stop watching (the script ended); the daemon now serving the run: a daemon found dead
        at this last look gets its successor too, which drains the run and counts what the dead
        one never wrote. wait=False: stop watching, no last look (the launch is being abandoned)."""
        self._stop.set()
        if not wait:
            return self.daemon
        self._thread.join(120)
        if not self._thread.is_alive():
            self._check()
        return self.daemon


def _forget_claim(runtime: Path) -> None:
    """Remove the claim of this launch's run (telemetry.wandb._launch_takes) from `runtime`."""
    from telemetry.shared.endpoints import LAUNCH_CLAIM_FILE

    try:
        os.unlink(runtime / LAUNCH_CLAIM_FILE)
    except OSError:
        pass


def _runtime_dir(run_id: str) -> tuple[Path, tuple[Path, ...]]:
    """(the run's private socket directory, the directories this run made for it: itself, then a
    missing parent of $TELEMETRY_RUNTIME_DIR; none where it was there already). Default: run-<id> in the
    user's private directory (userdir.py); where there is none (another user took its name in
    /tmp and there is no home to fall back to), or its socket paths would be too long, a fresh
    directory of a name nobody can guess (mkdtemp, 0700): every process of the run is told
    where it is ($TELEMETRY_RUNTIME_DIR)."""
    import tempfile

    from telemetry.shared import endpoints
    from telemetry.shared.userdir import user_dir

    given = os.environ.get(endpoints.ENV_RUNTIME_DIR)
    if given:
        runtime = Path(os.path.abspath(given))
        # A missing parent is made (and ours, 0700); one already there is only checked, never
        # chmod-ed: $TELEMETRY_RUNTIME_DIR=/tmp/x must not make /tmp private when we run as root.
        chain = (runtime,) if os.path.lexists(runtime.parent) else (runtime.parent, runtime)
        made = tuple(d for d in reversed(chain) if not os.path.lexists(d))
        endpoints.private_dirs(*chain, named=True)
        return runtime, made
    try:
        runtime = user_dir(create=True) / f"run-{run_id}"
        # A unix socket's path holds 107 bytes (endpoints.normalize): a long home is no place for one.
        if len(f"{runtime}/control.sock") <= 107:
            made = () if os.path.lexists(runtime) else (runtime,)   # one already there is not ours to remove
            return endpoints.private_dirs(runtime), made
    except endpoints.EndpointError:
        pass
    runtime = Path(tempfile.mkdtemp(prefix=f"telemetry-run-{run_id}-"))
    return runtime, (runtime,)


class _Interrupted(BaseException):
    """A signal before the script started: it is not run. (Not an Exception: no `except
    Exception` on the way swallows it.)"""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _StopWaiting(BaseException):
    """Another signal while the daemon drains, or one at the summary or the kept-up dashboard:
    stop waiting. The daemon is not stopped: it drains on by itself."""


class _Signals:
    """What SIGINT, SIGTERM and SIGHUP (the terminal closed) do to `telemetry run`, by phase.

    STARTING (the daemon starting, the script not yet run): the first stops the launch
    (_Interrupted); the daemon is drained, the exit code is 128+N.
    SCRIPT: each is passed on to the script (forward), once: not a Ctrl-C the terminal sent to
    our whole foreground group, nor a hangup when the script shares our group (with a terminal:
    the terminal's hangup reached the group).
    DRAINING (the script has ended): the first is said and the drain goes on: the Ctrl-C or
    the scheduler's SIGTERM that ended the script often comes again, and the run's drain.json,
    script_exit event and W&B exit record are all written in the drain (goodput.json by the
    summary after it). The next raises _StopWaiting: the wait ends, never the daemon's drain.
    DONE (the summary, the dashboard kept up): each raises _StopWaiting.
    """

    STARTING, SCRIPT, DRAINING, DONE = "starting", "script", "draining", "done"
    HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.phase = self.STARTING
        self.script: subprocess.Popen | None = None
        self.script_rc = 0                # the script's exit code, once it ended
        self.shares_group = True          # the script is in our process group (a terminal's job control)
        self.pending: list[int] = []      # signals that came before the script's process existed
        self.num_draining = 0
        self._armed = False               # STARTING: raise only once the daemon's Popen is ours
        self._early: int | None = None    # a signal before that
        self._old = {s: signal.signal(s, self._handle) for s in self.HANDLED}

    def arm(self) -> None:
        """From now on a signal while STARTING raises _Interrupted (one that came before, now)."""
        self._armed = True
        if self._early is not None and self.phase == self.STARTING:
            self.phase = self.DRAINING
            raise _Interrupted(self._early)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum: int, _frame) -> None:
        if self.phase == self.STARTING:
            if not self._armed:       # inside the daemon's Popen: raising would lose its handle
                self._early = self._early or signum
                return
            self.phase = self.DRAINING
            raise _Interrupted(signum)
        if self.phase == self.SCRIPT:
            self.forward(signum)
            return
        if self.phase == self.DRAINING and self.num_draining == 0:
            self.num_draining += 1
            again = "Ctrl-C again" if signum == signal.SIGINT else f"another {signal.Signals(signum).name}"
            _say(f"telemetry run: {signal.Signals(signum).name} while the daemon drains: the drain goes on "
                 f"(the run's final counters and its exit are written in it); {again} stops the waiting, "
                 f"not the drain")
            return
        raise _StopWaiting()

    def forward(self, signum: int) -> None:
        """Pass `signum` on to the script, unless its process group had it already."""
        proc = self.script
        if proc is None:
            self.pending.append(signum)
            return
        if proc.poll() is not None:
            return
        if signum == signal.SIGINT and at_foreground_terminal():
            return          # at a terminal's foreground a Ctrl-C is the terminal's, to the whole group
        if signum == signal.SIGHUP and self.shares_group:
            return          # the terminal's hangup, to its foreground group (the shell's, to the job)
        proc.send_signal(signum)


def _say(msg: str) -> None:
    """One line on stderr; nothing when it cannot be written (the terminal closed: SIGHUP)."""
    try:
        print(msg, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _wait_daemon(daemon: subprocess.Popen, timeout_s: float) -> None:
    """Wait for the daemon to exit (its drain is bounded: _drain_wait_s); killed after
    `timeout_s`, and said."""
    try:
        daemon.wait(timeout_s)
    except subprocess.TimeoutExpired:
        _say(f"telemetry run: the daemon (pid {daemon.pid}) did not exit within {timeout_s:g} s; killed "
             f"(its drain.json is not written; a next daemon on the run directory counts what it held as lost)")
        daemon.kill()
        daemon.wait()


def _launch(target: list[str], nproc: int, env: dict, launcher: str, signals: _Signals) -> int:
    """The script's exit code as a shell reports it; SIGINT, SIGTERM and SIGHUP are passed on to
    it (`signals`, which moves on to DRAINING once it has ended).
    Under a launcher, trainer.launch runs it and exits with the code of the rank that failed
    first (torchrun exits 1 for any failed rank; DeepSpeed's 256-N for a rank killed by N)."""
    module = target[0] == "-m"
    if launcher == "deepspeed":
        cmd = [*module_cmd("trainer.launch"), "--deepspeed", "--num_nodes", "1", "--num_gpus", str(nproc),
               *(["--module", *target[1:]] if module else target)]
    elif nproc == 1:
        cmd = [sys.executable, *target]
    else:
        cmd = [*module_cmd("trainer.launch"), "--standalone", "--nproc_per_node", str(nproc),
               *(["-m", *target[1:]] if module else target)]
    if not has_controlling_terminal() and sys.platform.startswith("linux"):
        # A signal to the launcher's whole process group (`timeout`, `kill -TERM -PGID`, a
        # scheduler's group kill) reached the script twice: directly, and passed on by us (a
        # preemption handler ran twice; a second SIGINT broke the script's clean-up). In a group
        # of its own it gets what we pass on, once; it still ends with us, as a group SIGKILL
        # would have ended it (PR_SET_PDEATHSIG): SIGKILL for the script itself, SIGTERM for
        # torchrun's agent or DeepSpeed's runner (trainer.launch), which end their ranks on it
        # (its ranks are in sessions of their own: a SIGKILLed agent would leave them running).
        # With a terminal it stays in our group, under the terminal's job control (Ctrl-C,
        # Ctrl-Z, fg, a background read's SIGTTIN), as before.
        death = signal.SIGKILL if nproc == 1 and launcher != "deepspeed" else signal.SIGTERM
        cmd = [sys.executable, "-I", "-S", "-c", _OWN_GROUP, str(os.getpid()), str(int(death)), *cmd]
        signals.shares_group = False
    signals.phase = _Signals.SCRIPT
    signals.script = proc = subprocess.Popen(cmd, env=env)
    for signum in signals.pending:     # came while it was being started: it had none of them
        proc.send_signal(signum)
    rc = proc.wait()
    signals.script_rc = rc = 128 - rc if rc < 0 else rc
    signals.phase = _Signals.DRAINING
    return rc


# Execs a command (argv[3:]: the script's, an attached view's) in a process group of its own, to
# get signal argv[2] when the launcher (argv[1], its parent) dies: what a signal to the launcher's
# group did before.
_OWN_GROUP = """import os, sys
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[2]))   # PR_SET_PDEATHSIG
except (ImportError, OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    os._exit(128 + int(sys.argv[2]))                # the launcher is already gone
os.setpgid(0, 0)
try:
    os.execv(sys.argv[3], sys.argv[3:])
except OSError as exc:
    print(f"telemetry run: cannot run {sys.argv[3]}: {exc.strerror}", file=sys.stderr)
    os._exit(127)
"""


def _ends_with_us(cmd: list[str]) -> list[str]:
    """`cmd` run so that it gets SIGTERM when this process dies, however (a `kill -9` too): an
    attached view left behind would hold its port and its run directory's files. In a process
    group of its own (_OWN_GROUP): the Ctrl-C meant for the script does not close the dashboard
    that stays up after the run."""
    if not sys.platform.startswith("linux"):
        return cmd
    return [sys.executable, "-I", "-S", "-c", _OWN_GROUP, str(os.getpid()), str(int(signal.SIGTERM)), *cmd]


def _attach(what: str, log_dir: Path, runtime: Path, env: dict, port: str) -> list[subprocess.Popen]:
    """Start the live view beside the run; the processes to stop with it. A view that does not
    start is said and the run goes on."""
    env = {**env, "TELEMETRY_RUNTIME_DIR": str(runtime)}
    if what == "tail":
        if os.environ.get("TMUX") and shutil.which("tmux"):
            tail = shlex.join([*module_cmd("telemetry"), "tail"])
            subprocess.run(["tmux", "split-window", "-h", f"TELEMETRY_RUNTIME_DIR={shlex.quote(str(runtime))} {tail}; "
                                                          "read -r"], env=env)
            return []
        with open(log_dir / "tail.log", "ab") as out:
            p = subprocess.Popen(_ends_with_us([*module_cmd("telemetry"), "tail", "--plain"]), env=env, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        print(f"telemetry run: live view: tail -f {log_dir / 'tail.log'}  (or: telemetry tail "
              f"--run-dir {log_dir})", flush=True)
        return [p]
    log_path = log_dir / "dashboard.log"
    with open(log_path, "ab") as out:
        p = subprocess.Popen(_ends_with_us([*module_cmd("telemetry"), "dashboard", str(log_dir), "--port", port]),
                             env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30      # the history is read before it serves: its line, 30 s at most
    while time.monotonic() < deadline and p.poll() is None and not _dashboard_url(log_dir):
        time.sleep(0.1)
    url = _dashboard_url(log_dir)
    if url:
        print(f"telemetry run: dashboard: {url}  (log: {log_path})", flush=True)
        return [p]
    print("telemetry run: warning: the dashboard did not start (training goes on):", file=sys.stderr)
    print("".join(f"[dashboard] {ln}\n" for ln in _tail(log_path).splitlines()), file=sys.stderr, end="")
    if p.poll() is None:
        p.kill()
    return []


def _dashboard_url(log_dir: Path) -> str:
    import re

    try:
        m = re.search(r"serving (http://\S+)", (log_dir / "dashboard.log").read_text(errors="replace"))
    except OSError:
        return ""
    return m.group(1) if m else ""


def _tail(path: Path, max_bytes: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _stream(path: Path, stop: threading.Event, start: int = 0) -> None:
    """The daemon's output from `start` (what this launch's daemon wrote), as it grows, on
    stderr (prefixed), until `stop` and caught up."""
    pos = start
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
        except OSError:
            chunk = b""
        if chunk:
            end = chunk.rfind(b"\n") + 1
            if not end and stop.is_set():       # a last line without its newline: shown as it is
                end = len(chunk)
            if end:
                try:
                    for line in chunk[:end].decode(errors="replace").splitlines():
                        print(f"[telemetry] {line}", file=sys.stderr, flush=True)
                except (OSError, ValueError):     # the terminal closed (SIGHUP): the log is in daemon.out
                    return
                pos += end
        elif stop.is_set():
            return
        time.sleep(0.2)


# How often the launcher asks the daemon whether its W&B run is made, until it is or it failed.
WANDB_WATCH_S = 2.0


def _watch_wandb_run(runtime: Path, log_dir: Path, stop: threading.Event) -> None:
    """Say on stderr, once, as soon as the daemon's W&B sink could not make the W&B run (W&B
    refused its init: a project name, no credentials online, ...), also with --quiet: the run
    would otherwise be missing from W&B with nothing said until the summary. Asks the daemon's
    `status` every WANDB_WATCH_S until the run is made, fails, or the run ends."""
    from telemetry.shared import control

    while not stop.wait(WANDB_WATCH_S):
        try:
            sinks = control.request(f"ipc://{runtime}/control.sock", "status", timeout_s=2.0).get("sinks")
        except Exception:
            continue                       # a daemon starting over (its successor): asked again
        w = sinks.get("wandb") if isinstance(sinks, dict) else None
        if not isinstance(w, dict) or w.get("opened"):
            return                         # no W&B sink, or its run is made
        if w.get("open_error"):
            print(f"telemetry run: the W&B run was not made: {str(w['open_error'])[:300]}; the run's metrics are kept "
                  f"in {log_dir} (metrics.jsonl), not in W&B", file=sys.stderr, flush=True)
            return


def _drain(daemon: subprocess.Popen, runtime: Path, log_dir: Path, rc: int, exited_at: float,
           wait_s: float) -> None:
    """Ask the daemon to drain (it waits for the ranks' byes; it writes drain.json) and wait for
    it. The script's exit code goes with the request: the W&B run ends with it when the script
    could not say it (killed by a signal: no exit hook ran); and when it exited (unix time): the
    goodput ledger ends a failed launch there, not at the drain."""
    from telemetry.shared import control

    if daemon.poll() is not None:      # already gone (drained as asked, or no successor): nobody to ask
        _say_gone(daemon, log_dir, rc)
        return
    try:
        # A daemon that exits before it answers (an outside `telemetry drain` under way, a
        # crash) ends the wait at once, not at the timeout.
        reply = control.request(f"ipc://{runtime}/control.sock", "drain", timeout_s=wait_s,
                                exit_code=min(max(rc, 0), 255), extra={"exited_at": exited_at},
                                give_up=lambda: daemon.poll() is not None)
        if isinstance(reply, dict) and reply.get("drain_under_way"):
            _say_gone(daemon, log_dir, rc)      # an outside drain's counters: without the exit code
    except control.GaveUp:
        _say_gone(daemon, log_dir, rc)
        return
    except Exception as exc:       # no answer: SIGTERM drains too
        _say(f"telemetry run: no answer to the drain request ({exc}); stopping the daemon")
        daemon.send_signal(signal.SIGTERM)
    _wait_daemon(daemon, wait_s)


def _say_gone(daemon: subprocess.Popen, log_dir: Path, rc: int) -> None:
    """Say that the daemon had ended before the script's end reached it: drained already (an
    outside `telemetry drain`, a SIGTERM of its own) or gone without a drain (when no successor
    could start, which the keeper said). Either way its drain.json, script_exit event and W&B
    exit record lack the script's exit code."""
    import json

    try:
        final = json.loads((log_dir / "drain.json").read_text())
    except (OSError, ValueError):
        final = None
    if isinstance(final, dict) and final.get("pid") == daemon.pid:
        how = f"had drained already ({final.get('stop_reason', 'reason unknown')})"
    else:
        how = f"had exited (code {daemon.returncode}) without a drain"
    _say(f"telemetry run: the daemon (pid {daemon.pid}) {how} when the script ended: the run's records "
         f"are as it wrote them, without the script's exit code {rc}")


def _summary(log_dir: Path, rc: int) -> None:
    from telemetry.consumers.summary import main as summary_main

    args = [str(log_dir), "--trainer-rc", str(rc)]
    if (log_dir / "drain.json").is_file():
        args += ["--drain-json", str(log_dir / "drain.json")]
    try:
        summary_main(args)
    except SystemExit:
        pass
    except Exception as exc:       # a summary that cannot be made never hides the exit code
        _say(f"telemetry run: no summary ({exc})")
