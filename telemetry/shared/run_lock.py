"""One live daemon per run directory.

A run directory's metrics.jsonl, sources.json and daemon.log are one run's: two daemons writing
them at once interleave two runs in one file (and each "continues" the other's ledger). So a
daemon holds LOCK_FILE in its log directory locked (flock, exclusive) from before it writes
anything there until it has written its last byte; a second daemon, or a second `telemetry run`,
on the directory meanwhile is refused. The lock goes with the process however it ends (a
SIGKILL too), so a new run on the directory after the first has ended continues it as before
(continuity.py). The file is left in place: removing a lock file while another process may be
opening it would let two holders have two files.

`telemetry run` takes the lock itself, before it writes daemon.out, and hands the same open
file to its daemon (ENV_FD names the inherited descriptor): the daemon holds it from then on,
also when the run's process is gone, and two runs started at once cannot both get as far as a
daemon.
"""
from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from telemetry.shared import files

LOCK_FILE = "run.lock"
ENV_FD = "TELEMETRY_RUN_LOCK_FD"


class RunDirInUse(Exception):
    """The run directory is another live daemon's (or it cannot be locked): one line."""


def hold(log_dir: Path) -> int:
    """Lock `log_dir`/run.lock for this process; the descriptor to keep open (closing it, or the
    process's end, frees the directory). RunDirInUse when a live daemon or run holds it."""
    path = Path(log_dir) / LOCK_FILE
    fd = _inherited(path)
    if fd is None:
        try:
            fd = files.open_fd(path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise RunDirInUse(f"cannot lock {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunDirInUse(f"{log_dir} is the run directory of a live telemetry daemon (pid {holder}); one run "
                          f"at a time writes there: wait for it to end, or give this run another directory") from None
    except OSError as exc:
        os.close(fd)
        raise RunDirInUse(f"cannot lock {path}: {exc.strerror or exc}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _inherited(path: Path) -> int | None:
    """The descriptor a parent handed over for this very file ($TELEMETRY_RUN_LOCK_FD), or None.
    A number that names anything else (another file, a closed descriptor) is ignored."""
    text = os.environ.pop(ENV_FD, "")
    if not text.isdigit():
        return None
    fd = int(text)
    try:
        st, want = os.fstat(fd), os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (want.st_dev, want.st_ino):
        return None
    os.set_inheritable(fd, False)
    return fd
