"""Bad input on every command line: a few lines on stderr, exit 2, never a traceback.

The sweep walks telemetry/cli.py's COMMANDS, builds each subcommand's argparse parser and, for
every option (and positional) that takes a value, tries the bad values that fit its kind:
numbers (empty, -1, nan, inf, 10**30, text), endpoints, paths (empty, under a file, missing,
/proc), choices. It runs the subcommands in-process (telemetry.cli.main), with what would start
a long-lived thing (the daemon, a PUB subscriber) replaced by a stand-in that raises WouldStart:
reaching it means the bad value was accepted, which fails the case. An option the sweep does not
know the kind of fails the test, so a new flag cannot escape it.

Beside it: the bad inputs of the issue one by one (a real daemon for the refused token and the
port in use, config keys with .nan, --config /dev/zero), and launch/run.sh as a real process.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from daemon_util import ROOT
from telemetry import cli

# A case that has not returned by then is hung (a FIFO opened, a server started): it fails.
HANG_S = 60
MAX_STDERR_LINES = 3   # one line is the rule (telemetry.cli.Parser); a little room for a hint


class WouldStart(Exception):
    """The command accepted its arguments and went on to start (a daemon, a subscriber)."""


class _Hung(Exception):
    pass


# -- what each option takes ------------------------------------------------------------------
# Options whose kind the parser does not say (no type=, no choices, no EP metavar).
KINDS: dict[tuple[str, str], str] = {
    ("daemon", "--log-dir"): "out_dir", ("daemon", "--config"): "in_file", ("daemon", "--run-name"): "name",
    ("tail", "--filter"): "free", ("tail", "--run-dir"): "run_dir",
    ("report", "run_dir"): "run_dir", ("report", "--out"): "out_dir",
    ("goodput", "run_dir"): "run_dir", ("goodput", "--json"): "out_file", ("goodput", "--exclude"): "when",
    ("goodput", "--reason"): "name",
    ("dashboard", "run_dir"): "run_dir", ("dashboard", "--addr"): "address", ("dashboard", "--port"): "number",
    ("export-prometheus", "--addr"): "address", ("export-prometheus", "--port"): "number",
    ("export-prometheus", "--token-file"): "in_file", ("export-prometheus", "--memory-mb"): "number",
    ("export-prometheus", "--max-series"): "number",
    ("replay", "run_dir"): "run_dir", ("replay", "--project"): "wandb_id", ("replay", "--entity"): "wandb_id",
    ("replay", "--run-id"): "wandb_id", ("replay", "--run-name"): "wandb_name",
    ("mfu-check", "--config"): "in_file", ("mfu-check", "--hf-config"): "in_file",
    ("mfu-check", "--model-type"): "name",
    ("metrics", "--config"): "in_file",
    ("keygen", "--dir"): "out_dir", ("keygen", "--name"): "name", ("keygen", "--allow"): "out_dir",
    ("run", "--run-dir"): "out_dir", ("run", "--run-name"): "name", ("run", "--daemon-config"): "in_file",
    ("run", "command"): "script",
}
# The same by option name alone, for any command (the live consumers share these flags).
NAME_KINDS = {"--port": "number", "--addr": "address", "--token-file": "in_file", "--memory-mb": "number",
              "--max-series": "number", "--timeout": "number"}


def bad_values(kind: str, tmp: Path) -> dict[str, str]:
    a_file = tmp / "a-file"
    a_file.write_text("x\n")
    under_file = str(a_file / "x")
    fifo = tmp / "a-fifo"
    if tmp != Path("/tmp") and not fifo.exists():
        os.mkfifo(fifo)                  # read by nothing: opening it for reading would wait forever
    return {
        "number": {"empty": "", "negative": "-1", "nan": "nan", "inf": "inf", "huge": "1" + "0" * 30, "text": "abc"},
        "endpoint": {"empty": "", "text": "foo", "bad-port": "tcp://999.1.1.1:x", "bad-host": "tcp://999.1.1.1:5",
                     "port-range": "tcp://127.0.0.1:99999", "inproc": "inproc://x"},
        "choice": {"text": "no-such-choice"},
        # "-" is stdout on our command lines (an output FILE of "-": goodput --json -): never a
        # directory of that name made in the working directory.
        "out_dir": {"empty": "", "under-a-file": under_file, "proc": "/proc/telemetry-no/such", "stdout": "-"},
        "out_file": {"empty": "", "under-a-file": under_file, "proc": "/proc/telemetry-no/such", "a-dir": str(tmp)},
        "in_file": {"empty": "", "under-a-file": under_file, "missing": str(tmp / "missing.yaml"),
                    "a-dir": str(tmp), "dev-zero": "/dev/zero", "fifo": str(fifo)},
        "run_dir": {"empty": "", "under-a-file": under_file, "missing": str(tmp / "no-such-run")},
        "name": {"empty": ""},
        "address": {"empty": "", "bad-ip": "999.1.1.1", "text": "not a host!"},
        # W&B refused these after set-up, with a traceback (a run id with "/", one too long for
        # W&B's directory name), or took an empty one as the default.
        "wandb_id": {"empty": "", "slash": "a/b", "too-long": "a" * 5000, "control": "x\ny"},
        "wandb_name": {"empty": "", "too-long": "a" * 5000, "control": "x\x1b]0;t\x07"},
        "free": {},   # any text is a valid filter: nothing to refuse
        "when": {"empty": "", "text": "yesterday", "nan": "nan", "inf": "inf", "negative": "-1"},
        "script": {"empty": "", "missing": str(tmp / "no-such.py"), "a-dir": str(tmp), "fifo": str(fifo),
                   "module-without-name": "-m"},
        "unknown": {"unknown-kind": ""},
    }[kind]


def kind_of(cmd: str, action: argparse.Action) -> str:
    name = action.option_strings[0] if action.option_strings else action.dest
    if (cmd, name) in KINDS:
        return KINDS[(cmd, name)]
    if name in NAME_KINDS:
        return NAME_KINDS[name]
    if action.choices:
        return "choice"
    if action.metavar == "EP":
        return "endpoint"
    if getattr(action.type, "__name__", "") in ("int", "float"):
        return "number"
    return "unknown"


def subparser(cmd: str) -> argparse.ArgumentParser:
    p = cli.build_parser([cmd])
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[cmd]


def value_actions(cmd: str) -> list[argparse.Action]:
    return [a for a in subparser(cmd)._actions
            if not isinstance(a, (argparse._HelpAction, argparse._StoreTrueAction, argparse._StoreFalseAction,
                                  argparse._StoreConstAction, argparse._CountAction, argparse._VersionAction))]


# Arguments that make the rest of a command line valid, so only the swept value is bad.
def base_args(cmd: str, name: str, tmp: Path, run_dir: Path) -> list[str]:
    if cmd in ("status", "drain"):
        return [] if name == "--timeout" else ["--timeout", "0.2"]
    if cmd in ("report", "goodput"):
        return [] if name == "run_dir" else [str(run_dir)]
    if cmd == "replay":
        return [] if name == "run_dir" else [str(run_dir)]
    if cmd == "keygen":
        args = [] if name == "--dir" else ["--dir", str(tmp / "keys")]
        return args + ([] if name == "--name" else ["--name", "k"])
    return []


def _cases() -> list:
    cases = []
    for cmd in cli.COMMANDS:
        for action in value_actions(cmd):
            name = action.option_strings[0] if action.option_strings else action.dest
            kind = kind_of(cmd, action)
            for label in bad_values(kind, Path("/tmp")):   # labels only; values are made per test
                cases.append(pytest.param(cmd, name, kind, label, id=f"{cmd}-{name}-{label}"))
    return cases


@pytest.fixture
def in_process(tmp_path, monkeypatch):
    """telemetry.cli.main(argv) -> (exit code, stdout, stderr), with the daemon and the PUB
    subscriber replaced by stand-ins that raise WouldStart, in a private runtime dir."""
    import telemetry.consumers.subscribe as subscribe
    import telemetry.daemon.core as core

    class NoDaemon:
        def __init__(self, cfg):
            raise WouldStart(f"the daemon would start with {cfg!r:.200}")

    class NoSubscriber:
        def __init__(self, endpoint, *a, **kw):
            raise WouldStart(f"a subscriber would attach to {endpoint}")

    monkeypatch.setattr(core, "Daemon", NoDaemon)
    monkeypatch.setattr(subscribe, "Subscriber", NoSubscriber)
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("TELEMETRY_RUNTIME_DIR", str(runtime))
    for var in ("TELEMETRY_ENDPOINT", "TELEMETRY_PUB", "TELEMETRY_CONTROL", "TELEMETRY_CONTROL_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)

    def run(argv: list[str]) -> tuple[int | str, str, str]:
        out, err = io.StringIO(), io.StringIO()
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        umask = os.umask(0o022)
        os.umask(umask)
        from telemetry.shared import files

        modes = files._modes        # a command as private as a run it writes into (files.apply_like)
        tel_log = logging.getLogger("telemetry")
        log_handlers, log_level = list(tel_log.handlers), tel_log.level

        def hung(*_):
            raise _Hung()
        old_alarm = signal.signal(signal.SIGALRM, hung)
        signal.alarm(HANG_S)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc: int | str = cli.main(argv)
                except SystemExit as exc:
                    rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                    if isinstance(exc.code, str):
                        print(exc.code, file=sys.stderr)
                except WouldStart as exc:
                    rc = f"accepted: {exc}"
                except _Hung:
                    rc = f"hung for {HANG_S} s"
                except Exception:
                    import traceback

                    traceback.print_exc()
                    rc = "traceback"
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old_alarm)
            for s, h in handlers.items():
                signal.signal(s, h)
            os.umask(umask)
            files._modes = modes
            for h in tel_log.handlers[:]:
                if h not in log_handlers:
                    tel_log.removeHandler(h)
                    h.close()
            tel_log.setLevel(log_level)
        return rc, out.getvalue(), err.getvalue()

    return run


def small_run(tmp_path) -> Path:
    """A small finished run (five steps of train/loss) under tmp_path/run."""
    import json

    d = tmp_path / "run"
    (d / "telemetry").mkdir(parents=True)
    with open(d / "telemetry" / "metrics.jsonl", "w") as f:
        for s in range(1, 6):
            f.write(json.dumps({"kind": "metrics", "t": 1.7e9 + s, "step": s, "values": {"train/loss": 2.0 / s}}) + "\n")
    return d


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A small finished run: what report and replay read when the swept option is another one."""
    return small_run(tmp_path)


def assert_refused(rc, out: str, err: str, what: str) -> None:
    assert "Traceback" not in out + err, f"{what}: a traceback\n{err[-3000:]}"
    assert rc == 2, f"{what}: exit {rc!r}, expected 2 (refused)\nstdout: {out[-1500:]}\nstderr: {err[-1500:]}"
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= MAX_STDERR_LINES, f"{what}: {len(lines)} lines on stderr:\n{err[-3000:]}"


@pytest.mark.parametrize("cmd, name, kind, label", _cases())
def test_every_flag_refuses_bad_values(in_process, tmp_path, run_dir, cmd, name, kind, label):
    assert kind != "unknown", (f"telemetry {cmd} {name}: the sweep does not know what this option takes; "
                               f"add it to KINDS in {__file__}")
    value = bad_values(kind, tmp_path)[label]
    args = base_args(cmd, name, tmp_path, run_dir)
    argv = [cmd, *args, value] if not name.startswith("-") else [cmd, *args, name, value]
    if cmd == "run" and name != "command":
        script = tmp_path / "train.py"
        script.write_text("")
        argv += ["--", str(script)]          # the script comes last: what follows it is its own
    rc, out, err = in_process(argv)
    assert_refused(rc, out, err, f"telemetry {' '.join(argv)}")


def test_the_sweep_covers_every_command():
    swept = {c.values[0] for c in _cases()}
    # keygen's and mfu-check's flags included; only commands without value flags could be absent.
    assert swept == set(cli.COMMANDS), set(cli.COMMANDS) - swept


# -- config numbers: every numeric key, at the root (telemetry.shared.config) --------------------
def _numeric_keys(cls, prefix: str = "") -> list[tuple[str, type]]:
    """(dotted key, int or float) of every numeric field of a config section tree."""
    import dataclasses
    import typing

    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint = hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        target = args[0] if len(args) == 1 and typing.get_origin(hint) is not None and len(typing.get_args(hint)) == 2 \
            else hint
        key = f"{prefix}{f.metadata.get('key', f.name)}"
        if target in (int, float):
            out.append((key, target))
        elif dataclasses.is_dataclass(target):
            out += _numeric_keys(target, key + ".")
    return out


def _daemon_numeric_keys() -> list[tuple[str, type]]:
    from telemetry.daemon.config import DaemonConfig

    # forward's keys need a forward section with an endpoint to reach its checks
    return _numeric_keys(DaemonConfig)


@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf", "1e400", str(10**30)])
def test_every_numeric_daemon_config_key_refuses_non_finite_and_huge(tmp_path, bad):
    """`step_timeout_s: .nan` never expired a step; every numeric key, not the one in the issue."""
    from telemetry.daemon.config import ConfigError, load

    keys = _daemon_numeric_keys()
    assert ("aggregator.step_timeout_s", float) in keys and ("jsonl.rotate_mb", float) in keys and len(keys) > 40
    accepted = []
    for key, typ in keys:
        path = tmp_path / "d.yaml"
        section, _, leaf = key.rpartition(".")
        text = f"{leaf}: {bad}\n"
        if section:
            for part in reversed(section.split(".")):
                text = f"{part}:\n" + "".join("  " + line + "\n" for line in text.splitlines())
        if key.startswith("forward."):
            text += "  endpoint: tcp://127.0.0.1:5555\n"
        path.write_text(text)
        try:
            load(path, {"log_dir": str(tmp_path / "t")})
        except ConfigError as exc:
            assert key.rsplit(".", 1)[-1] in str(exc) or key in str(exc), (key, str(exc))
            continue
        # A huge finite float is refused by ints (64 bits), seconds (a year) and each section's
        # own ranges; elsewhere (rotate_mb, max_per_second, peak_flops) it means "no limit".
        if bad != str(10**30) or typ is int or key.endswith("_s"):
            accepted.append(key)
    assert not accepted, f"config keys that took {bad}: {accepted}"


@pytest.mark.parametrize("yaml_text, fragment", [
    ("jsonl:\n  rotate_mb: -1\n", "rotate_mb"),
    ("rcvhwm: 1000000000000000000000000000000\n", "rcvhwm"),
    ("aggregator:\n  world_size: 1000000000\n", "world_size"),
    ("aggregator:\n  step_timeout_s: .nan\n", "step_timeout_s"),
    ("wandb:\n  finish_timeout_s: -5\n", "finish_timeout_s"),
    ("wandb:\n  project: a/b\n", "wandb.project"),          # W&B refused it in its thread, after ready
    ("wandb:\n  entity: ''\n", "wandb.entity"),
    ("ingest: tcp://127.0.0.1:7000\npub: tcp://127.0.0.1:7000\n", "is given for two sockets"),
    ("forward:\n  endpoint: tcp://127.0.0.1:7000\n  num_nodes: 1000000000\n", "num_nodes"),
    ("forward:\n  endpoint: tcp://127.0.0.1:7000\n  num_nodes: 65536\n  node_rank: 60000\n"
     "aggregator:\n  world_size: 64\n", "the largest rank"),
])
def test_daemon_config_ranges(in_process, tmp_path, yaml_text, fragment):
    cfg = tmp_path / "d.yaml"
    cfg.write_text(yaml_text)
    rc, out, err = in_process(["daemon", "--config", str(cfg), "--log-dir", str(tmp_path / "t")])
    assert_refused(rc, out, err, yaml_text)
    assert fragment in err


@pytest.mark.parametrize("args, fragment", [
    (["--forward", "tcp://127.0.0.1:7000", "--num-nodes", str(10**9)], "num_nodes"),
    (["--forward", "tcp://127.0.0.1:7000", "--num-nodes", "65536", "--node-rank", "60000", "--world-size", "64"],
     "the largest rank"),
], ids=["num-nodes-10^9", "node-ranks-beyond-MAX_RANK"])
def test_node_daemon_sizes_are_bounded(in_process, tmp_path, args, fragment):
    """Not in the issue's list: a node daemon's --num-nodes 10^9 was accepted (the head then
    ignored its hello's world size), and a node's rank slice could lie beyond any rank a record
    may carry."""
    rc, out, err = in_process(["daemon", "--log-dir", str(tmp_path / "t"), *args])
    assert_refused(rc, out, err, " ".join(args))
    assert fragment in err


def test_watch_pid_of_no_running_process_is_refused(in_process, tmp_path):
    """`--watch-pid 999999` (no such process) started a daemon that drained at once and exited 0,
    having watched nothing; refused now, before the log dir is made."""
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()                                  # reaped: its pid names no process
    rc, out, err = in_process(["daemon", "--log-dir", str(tmp_path / "t"), "--watch-pid", str(gone.pid)])
    assert_refused(rc, out, err, f"--watch-pid {gone.pid}")
    assert f"--watch-pid {gone.pid}: no such process" in err and not (tmp_path / "t").exists(), err

def _in_file_flags() -> list:
    return [pytest.param(cmd, a.option_strings[0], id=f"{cmd}-{a.option_strings[0]}") for cmd in cli.COMMANDS
            for a in value_actions(cmd) if a.option_strings and kind_of(cmd, a) == "in_file"]


@pytest.mark.parametrize("cmd, flag", _in_file_flags())
@pytest.mark.parametrize("what", ["missing", "a-dir"])
def test_a_file_to_read_is_said_as_what_it_is(in_process, tmp_path, run_dir, cmd, flag, what):
    """Every FILE a command reads (a config, a token): a path that is not there says so ("not
    found", "no such file"), a directory says it is one. `telemetry run --daemon-config
    /nonexistent` said "not a file", of a file that does not exist."""
    path = str(tmp_path / "nonexistent.yaml") if what == "missing" else str(tmp_path)
    argv = [cmd, *base_args(cmd, flag, tmp_path, run_dir), flag, path]
    if cmd == "run":
        script = tmp_path / "train.py"
        script.write_text("")
        argv += ["--", str(script)]
    rc, out, err = in_process(argv)
    assert_refused(rc, out, err, " ".join(argv))
    said = err.lower()
    if what == "missing":
        assert ("not found" in said or "no such file" in said) and "is a directory" not in said \
            and "not a file" not in said, err
    else:
        assert "is a directory" in said, err


def test_config_from_a_fifo_is_refused_without_waiting(in_process, tmp_path):
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    rc, out, err = in_process(["daemon", "--config", str(fifo)])
    assert_refused(rc, out, err, "--config FIFO")
    assert "not a regular file" in err


# -- an unknown flag: the subcommand's own one line, naming the flag and its --help --------------
@pytest.mark.parametrize("cmd", list(cli.COMMANDS))
def test_an_unknown_flag_is_the_subcommands_one_line(in_process, cmd):
    """argparse handed a subcommand's leftovers to `telemetry` itself, which pointed at
    `telemetry --help`; each subcommand now says it, naming its own --help."""
    rc, out, err = in_process([cmd, "--no-such-flag", "1"])
    assert_refused(rc, out, err, f"{cmd} --no-such-flag")
    assert len(err.strip().splitlines()) == 1, err
    assert "unknown option --no-such-flag" in err and f"telemetry {cmd} --help" in err, err


def test_a_misspelt_flag_is_named_not_taken_as_the_run_dir(in_process, tmp_path):
    (tmp_path / "runs").mkdir()
    rc, out, err = in_process(["dashboard", "--prot", "9000", "runs/"])
    assert_refused(rc, out, err, "dashboard --prot 9000 runs/")
    assert "unknown option --prot (did you mean --port?)" in err and "telemetry dashboard --help" in err, err
    assert "9000" not in err          # not read as RUN_DIR


def test_version_is_the_packages():
    from importlib import metadata

    import telemetry

    p = subprocess.run([sys.executable, "-m", "telemetry", "--version"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    try:
        expected = metadata.version(telemetry.DIST_NAME)
    except metadata.PackageNotFoundError:     # a source tree that is not installed
        expected = telemetry.__version__
    assert p.stdout.strip() == f"telemetry {expected}", p.stdout


# -- the control socket: a refused token is one line and exit 2, --json included --------------
@pytest.mark.parametrize("argv", [["status"], ["status", "--json"], ["drain"]], ids=" ".join)
def test_a_wrong_token_is_refused_in_one_line(make_daemon, argv):
    d = make_daemon()
    env = {**os.environ, "TELEMETRY_CONTROL_TOKEN": "not-the-token"}
    p = subprocess.run([sys.executable, "-m", "telemetry", *argv, "--control", d.control], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert_refused(p.returncode, p.stdout, p.stderr, " ".join(argv))
    assert "not authorised" in p.stderr and p.stdout == ""
    assert d.proc.poll() is None   # a refused drain drains nothing



@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_token_path_that_is_not_a_file_is_a_refused_token(make_daemon, kind):
    """A directory at the control token's path made `telemetry status` raise IsADirectoryError
    (a traceback), and a FIFO there made it wait for a writer for ever. Neither is a token: the
    request goes without one and is refused in one line, exit 2."""
    from telemetry.shared.control import token_path

    d = make_daemon()
    path = token_path(d.control)
    path.unlink()
    if kind == "directory":
        path.mkdir(mode=0o700)
    else:
        os.mkfifo(path, 0o600)
    env = {k: v for k, v in os.environ.items() if k != "TELEMETRY_CONTROL_TOKEN"}
    p = subprocess.run([sys.executable, "-m", "telemetry", "status", "--control", d.control], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert_refused(p.returncode, p.stdout, p.stderr, f"status with a {kind} at {path}")
    assert "not authorised" in p.stderr and p.stdout == "", p.stderr

# -- the daemon's sockets ------------------------------------------------------------------------
def test_daemon_with_a_port_in_use_or_one_port_twice(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        for ingest, pub in ((f"tcp://127.0.0.1:{port}", "tcp://127.0.0.1:0"),
                            ("tcp://127.0.0.1:0", f"tcp://127.0.0.1:{port}"),
                            (f"tcp://127.0.0.1:{port + 1}", f"tcp://127.0.0.1:{port + 1}")):
            p = subprocess.run([sys.executable, "-m", "telemetry", "daemon", "--wandb", "disabled",
                                "--log-dir", str(tmp_path / "t"), "--ingest", ingest, "--pub", pub,
                                "--control", "tcp://127.0.0.1:0"], cwd=ROOT, capture_output=True, text=True,
                               timeout=120)
            err = "\n".join(ln for ln in p.stderr.splitlines() if " INFO " not in ln)   # its start-up log lines
            assert_refused(p.returncode, p.stdout, err, f"daemon --ingest {ingest} --pub {pub}")
            assert "Address already in use" in err or "is given for two sockets" in err, err
    finally:
        taken.close()


# -- launch/run.sh: refused before any set-up (fast: no venv, no daemon, no allocation) --------
@pytest.mark.parametrize("args, fragment", [
    (["--nproc"], "--nproc needs a value"),
    (["--nproc", ""], "--nproc needs a value"),
    (["--nproc", "10^30"], "--nproc must be"),
    (["--nproc", "1" + "0" * 30], "--nproc must be"),
    (["--nproc", "abc"], "--nproc must be"),
    (["--nproc", "0"], "--nproc must be"),
    (["--nproc", "-1"], "--nproc must be"),
    (["--steps", "nan"], "--steps must be"),
    (["--steps"], "--steps needs a value"),
    (["--run-dir"], "--run-dir needs a value"),
    (["--run-dir", "/proc/telemetry-x"], "cannot create or write"),
    (["--run-dir", "UNDER_A_FILE"], "cannot create or write"),
    (["--config", "/nonexistent.yaml"], "config not found"),
    (["--wandb", "sometimes"], "--wandb takes"),
    (["--launcher", "mpirun"], "--launcher"),
    (["--attach", "htop"], "--attach takes"),
    (["--daemon-config", "/nonexistent.yaml"], "--daemon-config"),
    (["--no-such-flag"], "unknown argument"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_run_sh_refuses_bad_arguments_before_set_up(tmp_path, args, fragment):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    args = [str(a_file / "x") if a == "UNDER_A_FILE" else a for a in args]
    env = {**os.environ, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    p = subprocess.run([str(ROOT / "launch" / "run.sh"), *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert fragment in p.stderr and "unbound variable" not in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == "" or "usage" in p.stderr   # nothing set up, nothing started
    assert not list(tmp_path.glob("runs")) and not (ROOT / "runs" / "x").exists()
