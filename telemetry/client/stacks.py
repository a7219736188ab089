"""Python stacks on request: the daemon sends a signal, faulthandler writes every thread's stack.

When no step completes for a while (a hang), the daemon wants to know where each rank is. The
client registers, once at start, `faulthandler.register(signal, file, all_threads=True)`: the
dump is written by faulthandler's C signal handler, so it works while the main thread is blocked
inside a collective (gloo, NCCL) and costs nothing until the signal comes; tm.log() never sees it.
The hello says which signal and file (`stacks_signal`, `stacks_file`), or why there are none
(`stacks_unavailable`), for people to read: the daemon takes neither from the wire. It finds the
file among this process's open descriptors and reads the signal from the file's first line
(telemetry/shared/stacks_file.py), and sends it only if /proc says this process catches it
(telemetry/daemon/forensics/verify.py): the default action of the signal would end the process.

    $TELEMETRY_STACKS_SIGNAL   the signal: a name ("SIGRTMIN+3", the default; "SIGUSR2") or a
                               number; "off" registers nothing (the file is made all the same: the
                               daemon recognises the rank by it). Only SIGUSR1, SIGUSR2 and
                               SIGRTMIN..SIGRTMAX are used. Not SIGUSR1 by default: Lightning's
                               SLURM requeue uses it; c10's fatal-signal handler uses SIGUSR2.
    $TELEMETRY_STACKS_DIR      the directory of the file; default: the ingest socket's directory
                               for ipc (the run's private runtime directory), else `stacks` in
                               the user's private directory (telemetry/shared/userdir.py, which no
                               other user can take first), created 0700.

The directory is used only if it is a real directory (not a symlink), owned by this uid, that no
other user can write; the file is created in it 0600 with O_NOFOLLOW|O_NONBLOCK (a symlink or a
FIFO put there is refused, never followed or waited on) and checked to be a regular file of ours. On any doubt, stacks are
off and the hello says why; TelemetryClient() neither blocks nor raises for it.

A signal that already has a handler in this process is left alone (nothing registered).

When the interpreter exits, the file is removed and the signal is set to be ignored (an atexit
hook, which runs before the interpreter's finalization): finalization unregisters faulthandler's
handler and restores the default action, and a daemon that had not yet seen this rank's bye (a rank ending as another one
exits) would otherwise end the process it meant to ask for its stacks. Not at close(): an ignored
signal is inherited across exec, and the processes a closed client's process starts later (the
ranks of a launcher that logged, say) could then register nothing.
"""
from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import stat
from typing import IO

from telemetry.shared import stacks_file

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


class UnsafeStacksDir(OSError):
    """The stacks directory is not a real directory of ours that no one else can write."""


def _stacks_dir(endpoint: str) -> tuple[str, bool]:
    """(the directory, whether it is ours to create and make private)."""
    given = os.environ.get(ENV_DIR)
    if given:
        return given, False
    if endpoint.startswith("ipc://"):
        return os.path.dirname(endpoint[len("ipc://"):]) or ".", False
    from telemetry.shared.userdir import user_dir

    # Not a fixed name in the temporary directory: another user could make it first.
    return str(user_dir(create=True) / "stacks"), True


def _open_dir(path: str, ours: bool) -> int:
    """A descriptor of `path`, checked: a real directory (not a symlink, FIFO or file) owned by
    our uid that no other user can write; the file is then created relative to it, so what was
    checked is what is used. `ours` (the default, in the user's private directory): created 0700,
    and made 0700 if it is ours and looser. Never blocks (O_NONBLOCK: a FIFO is refused, not
    opened); raises OSError (UnsafeStacksDir) on any doubt."""
    if ours:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeStacksDir(f"{path} is not a directory")
        if st.st_uid != os.geteuid():
            raise UnsafeStacksDir(f"{path} belongs to uid {st.st_uid}, not to this process's uid {os.geteuid()}")
        if ours and st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
        elif st.st_mode & 0o022:
            raise UnsafeStacksDir(f"{path} can be written by other users (mode {stat.S_IMODE(st.st_mode):o})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_file(dir_fd: int, name: str) -> int:
    """Our stacks file in the checked directory: created 0600, never through a symlink, never
    blocking on a FIFO; refused unless it is a regular file of ours with one name."""
    fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            raise UnsafeStacksDir(f"{name} is not a regular file of ours")
        os.ftruncate(fd, 0)          # left by an earlier process that had this pid
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def register(endpoint: str, rank: int) -> tuple[dict, IO | None]:
    """Open the stacks file and register the stack dump; returns (hello fields, the open file
    to keep alive). Never raises, never blocks: stacks are optional, and on any doubt (a
    directory that is not ours, a taken signal) they are off, with the reason in the hello's
    `stacks_unavailable`. The file is opened even when no signal is registered (its first line
    then says signal=0): it is how the daemon recognises this process as a rank of its run."""
    text = os.environ.get(ENV_SIGNAL, DEFAULT_SIGNAL)
    sig = parse_signal(text)
    why = ""
    if sig is None:
        why = f"off (${ENV_SIGNAL}={text!r})" if text.strip().upper() in ("", "OFF", "0", "NONE") \
            else f"${ENV_SIGNAL}={text!r}: not a signal"
    elif sig not in stacks_file.SAFE_SIGNALS:
        why, sig = f"signal {sig} is not one the daemon sends (SIGUSR1, SIGUSR2, SIGRTMIN..SIGRTMAX)", None
    try:
        if sig is not None and signal.getsignal(sig) not in (signal.SIG_DFL, None):
            why, sig = f"signal {sig} already has a handler", None
        path, ours = _stacks_dir(endpoint)
        name = stacks_file.file_name(rank, os.getpid())
        file_path = os.path.join(os.path.abspath(path), name)
        dir_fd = _open_dir(path, ours)
        try:
            fd = _open_file(dir_fd, name)
        finally:
            os.close(dir_fd)
        f = os.fdopen(fd, "a", encoding="utf-8")
        f.write(stacks_file.header(rank, os.getpid(), sig).decode("ascii"))
        f.flush()
        st = os.fstat(fd)
        if sig is not None:
            # Append mode: the daemon reads what a dump added past the size it saw before the signal.
            faulthandler.register(sig, file=f, all_threads=True, chain=False)
        atexit.register(_at_exit, sig, file_path, (st.st_dev, st.st_ino), os.getpid())
    except (OSError, ValueError, RuntimeError) as exc:
        return {"stacks_unavailable": f"{why + '; ' if why else ''}{exc}"}, None
    if sig is None:
        return {"stacks_unavailable": why}, f
    return {"stacks_signal": sig, "stacks_file": file_path}, f


def _at_exit(sig: int | None, path: str, ident: tuple[int, int], pid: int) -> None:
    """atexit: from now on the stacks signal does nothing (see the module's docstring), and the
    file goes: a process that has exited has no stacks to give, and one file a process would
    otherwise be left behind for each process that ever logged (the user's `stacks/` directory
    of a TCP client is never cleaned by a run). Only by the process that made it (a forked child
    runs its parent's atexit hooks too), and only while the name is still that file."""
    if sig is not None:
        try:
            faulthandler.unregister(sig)            # restores the action it found: the default
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError, RuntimeError):  # not the main thread, or already finalizing
            pass
    if os.getpid() != pid:
        return
    try:
        st = os.stat(path, follow_symlinks=False)
        if (st.st_dev, st.st_ino) == ident:
            os.unlink(path)
    except OSError:
        pass
