"""Python stacks on request: the daemon sends a signal, faulthandler writes every thread's stack.

When no step completes for a while (a hang), the daemon wants to know where each rank is. The
client registers, once at start, `faulthandler.register(signal, file, all_threads=True)`: the
dump is written by faulthandler's C signal handler, so it works while the main thread is blocked
inside a collective (gloo, NCCL) and costs nothing until the signal comes; tm.log() never sees it.
The hello says which signal and file (`stacks_signal`, `stacks_file`); the daemon only ever sends
the signal to a rank whose hello says it is registered (the default action of the signal would
end the process).

    $TELEMETRY_STACKS_SIGNAL   the signal: a name ("SIGRTMIN+3", the default; "SIGUSR2") or a
                               number; "off" registers nothing. Not SIGUSR1 by default: Lightning's
                               SLURM requeue uses it; c10's fatal-signal handler uses SIGUSR2.
    $TELEMETRY_STACKS_DIR      the directory of the file; default: the ingest socket's directory
                               for ipc (the run's private runtime directory), else a private
                               directory under the temporary directory.

A signal that already has a handler in this process is left alone (nothing registered).

When the interpreter exits, the signal is set to be ignored (an atexit hook, which runs before
the interpreter's finalization): finalization unregisters faulthandler's handler and restores the
default action, and a daemon that had not yet seen this rank's bye (a rank ending as another one
exits) would otherwise end the process it meant to ask for its stacks. Not at close(): an ignored
signal is inherited across exec, and the processes a closed client's process starts later (the
ranks of a launcher that logged, say) could then register nothing.
"""
from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import tempfile
from typing import IO

ENV_SIGNAL = "TELEMETRY_STACKS_SIGNAL"
ENV_DIR = "TELEMETRY_STACKS_DIR"
DEFAULT_SIGNAL = "SIGRTMIN+3"


def parse_signal(text: str) -> int | None:
    """A signal number from "SIGRTMIN+3", "SIGUSR2", "USR2" or "45"; None for "off"/"" or unknown."""
    text = text.strip().upper()
    if text in ("", "OFF", "0", "NONE"):
        return None
    if text.isdigit():
        return int(text)
    if not text.startswith("SIG"):
        text = "SIG" + text
    base, _, offset = text.partition("+")
    num = getattr(signal, base, None)
    if num is None or (offset and not offset.isdigit()):
        return None
    return int(num) + (int(offset) if offset else 0)


def _stacks_dir(endpoint: str) -> str:
    given = os.environ.get(ENV_DIR)
    if given:
        return given
    if endpoint.startswith("ipc://"):
        return os.path.dirname(endpoint[len("ipc://"):]) or "."
    path = os.path.join(tempfile.gettempdir(), f"telemetry-stacks-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def register(endpoint: str, rank: int) -> tuple[dict, IO | None]:
    """Register the stack dump; returns (hello fields, the open file to keep alive). Never raises:
    stacks are optional (a read-only directory or a taken signal leaves them off)."""
    sig = parse_signal(os.environ.get(ENV_SIGNAL, DEFAULT_SIGNAL))
    if sig is None:
        return {}, None
    try:
        if signal.getsignal(sig) not in (signal.SIG_DFL, None):
            return {"stacks_unavailable": f"signal {sig} already has a handler"}, None
        path = os.path.join(_stacks_dir(endpoint), f"stacks-rank{rank}-pid{os.getpid()}.txt")
        # Append mode: the daemon reads what a dump added past the size it saw before the signal.
        f = open(path, "a", encoding="utf-8")
        os.chmod(path, 0o600)
        faulthandler.register(sig, file=f, all_threads=True, chain=False)
        atexit.register(_ignore_at_exit, sig)
    except (OSError, ValueError, RuntimeError) as exc:
        return {"stacks_unavailable": str(exc)}, None
    return {"stacks_signal": sig, "stacks_file": os.path.abspath(path)}, f


def _ignore_at_exit(sig: int) -> None:
    """atexit: from now on the stacks signal does nothing (see the module's docstring)."""
    try:
        faulthandler.unregister(sig)            # restores the action it found: the default
        signal.signal(sig, signal.SIG_IGN)
    except (ValueError, OSError, RuntimeError):  # not the main thread, or already finalizing
        pass
