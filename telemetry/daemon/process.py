"""What the daemon sets up in its process, beside its sockets: the descriptor limit, the cyclic
collector, logging, the start's warning of sockets open to every local user, and whether the
process it watches (--watch-pid) still runs.
"""
from __future__ import annotations

import logging
import os
import resource
import sys
from pathlib import Path

from telemetry.shared import files
from telemetry.shared.procs import alive
from telemetry.daemon.sinks.base import StartupError

log = logging.getLogger("telemetry.daemon")

# Allocations between young-generation collections (CPython's default is 700); see tune_gc.
GC_GEN0_THRESHOLD = 50_000

# Descriptors the daemon needs besides its ingest connections: files, sinks, pollers, sockets.
FD_RESERVE = 256


class Watched:
    """The process --watch-pid names: whether it still runs, and once it has ended, how.

    A pidfd is taken at once, while the process runs: through it the kernel (Linux >= 6.15)
    keeps the wait status after the process's parent reaped it, which is how a daemon whose
    launcher (`telemetry run`) was killed learns what a shell saw (137 for a SIGKILL): the run's
    exit code, with no drain request to say it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def alive(self) -> bool:
        return alive(self.pid)

    def ended(self) -> tuple[int | None, str]:
        """(its exit code as a shell reports it: 128+N when signal N killed it, how it ended) once
        it has ended; (None, "") while it runs or where the kernel keeps no status (before 6.15,
        once reaped)."""
        from telemetry.daemon.forensics.collect import describe_status, pidfd_exit_status

        status = pidfd_exit_status(self._pidfd) if self._pidfd is not None else None
        if status is None:
            status = _zombie_status(self.pid)
        if status is None:
            return None, ""
        code, how = describe_status(status)
        return (128 - code if code < 0 else code), how

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def _zombie_status(pid: int) -> int | None:
    """The wait status of an exited process its parent has not reaped yet (/proc/PID/stat field 52)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[-1].split()
        return int(fields[49]) if fields and fields[0] == b"Z" else None
    except (OSError, IndexError, ValueError):
        return None


def raise_fd_limit(max_connections: int) -> tuple[int, int]:
    """Raise the soft descriptor limit to the hard one (libzmq aborts when accept() runs out of
    descriptors); returns the soft limit now and the connections that fit in it: max_connections,
    or fewer (with a warning) when the hard limit leaves no room for them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard if hard != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %r", soft, want, exc)
    room = (soft if soft != resource.RLIM_INFINITY else 1 << 20) - FD_RESERVE
    if max_connections > room:
        log.warning("max_connections %d does not fit the descriptor limit %d: %d connections at most",
                    max_connections, soft, max(1, room))
        max_connections = max(1, room)
    return soft, max_connections


def tune_gc() -> None:
    """Records are acyclic dicts freed by reference counting; the cyclic collector only costs.

    With the default thresholds it runs every 700 allocations and, under load, its older
    generations rescan every record waiting in the sink queues (a measurable cost per record of
    ingest: benchmarks/RESULTS.md, Daemon ingest). Everything built at start-up (imports, sockets,
    sinks) is frozen out of its reach, and collections are made rarer; they still run, so a cycle
    is still freed.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 50, 100)


# What another local user can do with a socket of ours that they can connect to.
_OPEN_TO = {"ingest": "send it records (forged steps, events, hellos)", "remote_ingest": "send it records",
            "pub": "read every record from it", "control": "connect to it (status and drain need its token)"}


def warn_open_endpoints(eps: dict[str, str], security) -> None:
    """One warning line, at start, naming each socket bound to loopback TCP without CURVE: every
    local user can connect to those. ipc sockets in the private (0700) runtime directory are the
    owner's alone and need no word; beyond loopback the daemon refuses to start without CURVE."""
    from telemetry.shared.security.curve import needs_curve

    open_eps = [f"{name} {ep} (any local user can {_OPEN_TO.get(name, 'connect to it')})"
                for name, ep in eps.items()
                if ep.startswith("tcp://") and not (security.enabled and needs_curve(ep, security))]
    if open_eps:
        log.warning("open to every local user (loopback TCP without CURVE): %s. To close them: ipc "
                    "endpoints (the default, in a private 0700 directory) or CURVE on loopback "
                    "(security.curve_loopback; README \"Trust model\")", "; ".join(open_eps))


def setup_logging(log_dir: Path, level: int = logging.INFO) -> None:
    try:
        files.make_dir(log_dir, own=True)
        # Made (or an older one brought to) the run-file mode first: FileHandler keeps what it finds.
        os.close(files.open_fd(log_dir / "daemon.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT))
        handlers = (logging.StreamHandler(sys.stderr), logging.FileHandler(log_dir / "daemon.log"))
    except OSError as exc:
        raise StartupError(f"cannot use {log_dir} as the log directory: {exc.strerror or exc}") from None
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger("telemetry")
    root.setLevel(level)
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
