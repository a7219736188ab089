"""torchrun or the DeepSpeed launcher, exiting with the first failing rank's own exit code.

    python -m trainer.launch --standalone --nproc_per_node 2 -m trainer.train --config ...
    python -m trainer.launch --deepspeed --num_nodes 1 --num_gpus 2 --module trainer.train --config ...

The trainer's codes mean something (2 a config error, 3 nonfinite_action=stop, 128+N ended by
signal N); the launchers lose them:
- torchrun turns any failed worker into its own exit 1, and writes the rank's code only into its
  report. This runs torchrun's own `run` and exits with the code of the failure torchrun records
  first (ChildFailedError.get_first_failure: the earliest timestamp, in whole seconds, the lowest
  rank on a tie). torchrun's report is printed as before.
- The DeepSpeed launcher (`deepspeed`, deepspeed.launcher.runner) starts a node launcher
  (deepspeed.launcher.launch) that polls its ranks once a second and, at the first failed one it
  sees, ends the others and does sys.exit(that rank's returncode): minus N for signal N, so the
  shell sees 256-N (247 for SIGKILL), which cannot be told from a rank's own exit 247. With
  --deepspeed this runs DeepSpeed's runner here, with its node launcher run as
  `python -m trainer.launch --deepspeed-node` (DeepSpeed's own launch.main, in that process), which
  takes the rank's returncode from that sys.exit as it is. "First" is DeepSpeed's: the first
  failed rank its poll finds. The runner passes a node launcher's positive code on, and exits 0
  when the node launcher itself was killed: that becomes 128+N here too.
Either way a rank killed by signal N exits 128+N, as a shell reports it.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

from telemetry.shared.signals import at_foreground_terminal

DS_NODE_MODULE = "deepspeed.launcher.launch"


def shell_code(exitcode: int) -> int:
    """A process's returncode as Python reports it (minus N: killed by signal N) as a shell's."""
    return 128 - exitcode if exitcode < 0 else exitcode


def _report(rank: Any, exitcode: int, code: int) -> None:
    print(f"[trainer.launch] rank {rank} failed first (exit code {exitcode}): exiting {code}",
          file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--deepspeed"]:
        return deepspeed_main(argv[1:])
    if argv[:1] == ["--deepspeed-node"]:
        return deepspeed_node_main(argv[1:])
    return torchrun_main(argv)


def torchrun_main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from torch.distributed.run import parse_args, run

    @record   # what torchrun's main does: its error handler, for the agent's own failures
    def launch() -> int:
        try:
            run(parse_args(argv))
        except ChildFailedError as exc:
            print(exc, file=sys.stderr)         # torchrun's report: each failed rank, its code
            rank, failure = exc.get_first_failure()
            code = shell_code(failure.exitcode) or 1
            _report(rank, failure.exitcode, code)
            return code
        except SignalException as exc:
            # SIGTERM, SIGINT, SIGHUP or SIGQUIT to the agent: it has passed the signal on to its
            # ranks and stopped them; torchrun would end in this exception's traceback and exit 1.
            # A launch stopped by signal N exits 128+N, as a shell reports a process it killed.
            code = 128 + int(exc.sigval)
            print(f"[trainer.launch] stopped by {signal.Signals(exc.sigval).name}: exiting {code}",
                  file=sys.stderr, flush=True)
            return code
        return 0

    return launch()


class _Subprocess:
    """The `subprocess` module as one DeepSpeed launcher module sees it: the same, except that
    Popen goes through `popen(cmd, *args, **kwargs)`."""

    def __init__(self, popen: Any) -> None:
        self.Popen = popen

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)   # sys.exit("message"), as the interpreter would print it
    return 1


def deepspeed_main(argv: list[str]) -> int:
    """DeepSpeed's runner (what the `deepspeed` command runs) with its node launcher swapped for
    `trainer.launch --deepspeed-node`; returns the first failing rank's shell code."""
    from deepspeed.launcher import runner

    nodes: list[subprocess.Popen] = []
    starting: list[int] = []        # signals that came while a node launcher was being started

    def popen(cmd: Any, *args: Any, **kwargs: Any) -> subprocess.Popen:
        cmd = list(cmd)
        for i in range(len(cmd) - 1):
            if cmd[i] == "-m" and cmd[i + 1] == DS_NODE_MODULE:   # the local node launcher
                cmd[i:i + 2] = ["-m", "trainer.launch", "--deepspeed-node"]
                starting.append(0)
                try:
                    proc = subprocess.Popen(cmd, *args, **kwargs)
                    nodes.append(proc)
                finally:
                    came = starting[1:]
                    starting.clear()
                for signum in came[:1]:     # passed on now that it exists (it never had it)
                    proc.send_signal(signum)
                return proc
        return subprocess.Popen(cmd, *args, **kwargs)   # anything else (pdsh, ssh) as it was

    runner.subprocess = _Subprocess(popen)
    forwarded: list[int] = []

    def forward(signum, _frame):
        # DeepSpeed's runner passes nothing on to a local node launcher: killed by SIGTERM, it left
        # the node launcher and its ranks training, unseen. Its node launcher ends its ranks on
        # either signal; a Ctrl-C at a terminal reached it already (the whole foreground group).
        forwarded.append(signum)
        if not nodes:
            if starting:    # inside popen, the node launcher forked or not: popen passes it on
                starting.append(signum)
                return
            raise SystemExit(128 + signum)      # before the node launcher: nothing to end but this
        if signum == signal.SIGINT and at_foreground_terminal():
            return
        for proc in nodes:
            if proc.poll() is None:
                proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        runner.main(argv)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if forwarded and code != 0:      # stopped by the signal: the shell's code for it, as for a rank
        return 128 + forwarded[0]
    if code == 0 and nodes and nodes[-1].returncode:   # the runner exits 0 for a killed node launcher
        code = shell_code(nodes[-1].returncode)
        print(f"[trainer.launch] the node launcher was ended by signal {-nodes[-1].returncode}: "
              f"exiting {code}", file=sys.stderr, flush=True)
    return code


def deepspeed_node_main(argv: list[str]) -> int:
    """DeepSpeed's node launcher, run in this process: its sys.exit(code) of the first failed rank
    it finds becomes that rank's shell code (128+N for signal N)."""
    from deepspeed.launcher import launch

    ranks: list[tuple[str, subprocess.Popen]] = []

    def popen(cmd: Any, *args: Any, **kwargs: Any) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, *args, **kwargs)
        env = kwargs.get("env") or {}
        ranks.append((env.get("RANK", "?"), proc))   # the launcher reuses one env dict: read it now
        return proc

    launch.subprocess = _Subprocess(popen)
    sys.argv = [launch.__file__, *argv]   # it parses sys.argv
    try:
        launch.main()
        return 0
    except SystemExit as exc:
        exitcode = _exit_code(exc)
    if exitcode == 0:
        return 0
    code = shell_code(exitcode)
    # The one rank whose failure it saw: it exits at the first non-zero returncode its poll finds.
    failed = [rank for rank, proc in ranks if proc.returncode == exitcode]
    if len(failed) == 1:
        _report(failed[0], exitcode, code)
    else:   # the launcher itself was told to stop (SIGINT/SIGTERM), or the rank is ambiguous
        print(f"[trainer.launch] the deepspeed node launcher exited {exitcode}: exiting {code}",
              file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
