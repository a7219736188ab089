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
    process's end, frees the directory). RunDirInUse when a live daemon or run holds it, or when
    run.lock is not this user's own file.

    Made (with its missing parents) when missing; an existing directory is only checked (another
    user's is refused: OSError, as files.make_dir says) until the lock is ours: a refused
    process leaves the directory as it found it (its mode too: a team's setgid 2770 directory
    stays open to the team), having made at most run.lock, with the run files' mode. Once the
    lock is ours, the directory and run.lock get the run-file modes."""
    log_dir = Path(log_dir)
    path = log_dir / LOCK_FILE
    fd = _inherited(path)
    if fd is None:
        files.make_dir(log_dir, own=True, keep_mode=True)
        try:
            fd = files.open_fd(path, os.O_RDWR | os.O_CREAT, keep_mode=True, any_owner=True)   # checked below
        except OSError as exc:
            raise RunDirInUse(f"cannot lock {path}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        # Another user's file: its text (a pid) is theirs to write, and a lock of theirs is not a
        # daemon of ours. Whoever could write the directory made it (a group-writable one).
        os.close(fd)
        raise RunDirInUse(f"{path} is another user's file (uid {st.st_uid}), not a lock of this user's telemetry: "
                          f"remove it, or give this run another directory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if stat.S_IMODE(st.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
            holder = f"its pid unknown: {LOCK_FILE} is writable by others"   # its text may be anyone's
        else:
            holder = "pid " + (_printable(os.pread(fd, 32, 0).decode(errors="replace").strip()) or "?")
        os.close(fd)
        raise RunDirInUse(f"{log_dir} is the run directory of a live telemetry daemon ({holder}); one run "
                          f"at a time writes there: wait for it to end, or give this run another directory") from None
    except OSError as exc:
        os.close(fd)
        raise RunDirInUse(f"cannot lock {path}: {exc.strerror or exc}") from None
    try:
        files.make_dir(log_dir, own=True)       # the run-directory mode, now that the directory is this run's
    except OSError:
        os.close(fd)
        raise
    files.set_file_mode(fd, path)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


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
