"""Run files are the owner's alone unless configured: one place decides their modes.

The processes that write a run's files (the daemon; `telemetry report` and `replay`) call
`apply` once at start: it sets the process umask, so every file and directory they and the
libraries they drive (W&B, TensorBoard, matplotlib) create is born 0600 / 0700: metrics.jsonl
and its rotated pieces, daemon.log, sources.json, drain.json, wandb/, TensorBoard's event files, report/.
What may already exist (a restarted daemon's log dir, one that `launch/run.sh` made with
`mkdir -p`, a log written by an older version) is brought to the same modes when it is opened
(`open_fd`, `make_dir`), if it is ours. The daemon config's `files.group_readable: true` gives
0640 / 0750 instead, for a team that shares runs through a Unix group; never anything for others.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("telemetry.shared.files")


@dataclass(kw_only=True, slots=True)
class FilesConfig:
    """The daemon config's `files:` section."""

    group_readable: bool = False      # run files 0640 / directories 0750 instead of 0600 / 0700


@dataclass(frozen=True, slots=True)
class Modes:
    file: int
    dir: int
    umask: int


PRIVATE = Modes(file=0o600, dir=0o700, umask=0o077)
GROUP_READABLE = Modes(file=0o640, dir=0o750, umask=0o027)
_modes = PRIVATE      # what open_fd and make_dir give, also in a process that never called apply


def apply(group_readable: bool = False) -> Modes:
    """Choose this process's run-file modes and set its umask to match; returns them."""
    global _modes
    _modes = GROUP_READABLE if group_readable else PRIVATE
    os.umask(_modes.umask)
    return _modes


def apply_like(log_dir: str | os.PathLike) -> Modes:
    """For a process that writes into an existing run (report, replay): as private as the run,
    group-readable only if its log directory is."""
    return apply(modes_like(log_dir) is GROUP_READABLE)


def modes_like(log_dir: str | os.PathLike) -> Modes:
    """The modes of an existing run's files (group-readable only if its log directory is),
    without making them this process's (apply_like does)."""
    try:
        group = bool(os.stat(log_dir).st_mode & stat.S_IRGRP)
    except OSError:
        group = False
    return GROUP_READABLE if group else PRIVATE


class NotRegularFile(OSError):
    """A run file's path holds something else: a FIFO, a device, a socket, a directory."""


def _only_regular(fd: int, path) -> None:
    """Raise NotRegularFile unless `fd` is a regular file; then take O_NONBLOCK off again."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(errno.EINVAL, "not a regular file", os.fspath(path))
    os.set_blocking(fd, True)


def open_append(path: str | os.PathLike):
    """A run file (daemon.out) opened to append, binary, with the run-file mode whatever the
    umask (open_fd's checks: no symlink followed, nothing of another user's written to)."""
    return os.fdopen(open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")


def open_fd(path: str | os.PathLike, flags: int, keep_mode: bool = False, any_owner: bool = False) -> int:
    """os.open with the run-file mode; a file of ours that already existed gets that mode too
    (unless `keep_mode`: then see set_file_mode). Never follows a symlink at `path` (ELOOP) and
    never blocks: a FIFO, a device or anything else that is not a regular file is refused
    (NotRegularFile, or ENXIO for a FIFO without a reader), whoever put it there, before anything
    is written to it. Nor is a file another user owns opened to be written: one planted in a run
    directory before it was ours (hard-linked elsewhere, or its mode theirs to widen) would let
    them read the run (EPERM), unless `any_owner`: the caller checks the owner itself, before
    writing anything (the run lock, which names what it found)."""
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, _modes.file)
    except OSError as exc:
        if exc.errno == errno.ENXIO:         # a FIFO that nobody reads, a device without its driver
            raise NotRegularFile(errno.EINVAL, "not a regular file", os.fspath(path)) from None
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symlink (not followed)", os.fspath(path)) from None
        raise
    try:
        _only_regular(fd, path)
        if flags & (os.O_WRONLY | os.O_RDWR) and not any_owner:
            owner = os.fstat(fd).st_uid
            if owner != os.geteuid():
                raise OSError(errno.EPERM, f"it is owned by another user (uid {owner}), who could read what is "
                                           f"written to it; remove it or use a directory of your own", os.fspath(path))
        if not keep_mode:
            _set_mode(fd, path, _modes.file, stat.S_ISREG)
    except OSError:
        os.close(fd)
        raise
    return fd


def set_file_mode(fd: int, path: str | os.PathLike) -> None:
    """Give an open run file of ours the run-file mode (what open_fd does unless `keep_mode`)."""
    _set_mode(fd, path, _modes.file, stat.S_ISREG)


def open_regular(path: str | os.PathLike, nofollow: bool = False):
    """A run file opened for reading ("rb"), only if it is a regular file: opening a FIFO never
    waits for a writer, and a device (/dev/zero) is never read without end. Raises
    NotRegularFile (an OSError) otherwise. nofollow: a symlink at `path` is refused (ELOOP)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_NOFOLLOW if nofollow else 0))
    try:
        _only_regular(fd, path)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_small(path: str | os.PathLike, limit: int = 1 << 20) -> str:
    """A small run file's text (an id, a state mark); "" when it is missing, not a regular file
    (a FIFO there never blocks the reader, /dev/zero is never read without end), unreadable or
    larger than `limit` bytes."""
    try:
        with open_regular(path) as f:
            data = f.read(limit + 1)
    except OSError:
        return ""
    return "" if len(data) > limit else data.decode("utf-8", "replace")


def write_file(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically (a temporary beside it, then rename), run-file mode.
    A write that fails (the disk full) leaves `path` as it was and no temporary behind."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def make_dir(path: str | os.PathLike, own: bool = False, keep_mode: bool = False) -> Path:
    """Make a run directory (and its missing parents) with the run-directory mode; one of ours
    that already existed gets that mode too, unless `keep_mode` (checked only: a process that
    may yet be refused the directory changes nothing in it). A directory others may write to by
    design (sticky, like /tmp) or of another user is left as it is, unless `own`: then one that
    another user owns is refused (OSError), as the daemon's log directory is: its owner could
    delete, rename or swap the run's files (a symlink at wandb/ or a piece's name) under a daemon
    of ours."""
    path = Path(path)
    if own:
        _check_no_open_parent(path)      # before anything is made under such a parent
    # Missing parents as `mkdir -p` makes them (the umask's mode), but never writable by every
    # user: under umask 000 a parent made 0777 (./telemetry) was one the check above refuses,
    # and the run refused the directory it had just made itself.
    for parent in reversed([p for p in path.parents if not p.exists()]):
        try:
            parent.mkdir(mode=0o775)
        except FileExistsError:
            pass
    path.mkdir(exist_ok=True, mode=_modes.dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:             # one we may write to but not list: used as it is
        return path
    try:
        if own:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                raise OSError(errno.EPERM, f"it is owned by another user (uid {st.st_uid}), who could delete or "
                                           f"swap the run's files in it; use a directory of your own", os.fspath(path))
        if not keep_mode:
            _set_mode(fd, path, _modes.dir, stat.S_ISDIR)
    finally:
        os.close(fd)
    return path


def output_dir(path: str | os.PathLike) -> Path:
    """A directory a user named for a command's output files (`report --out DIR`; also the
    report's metrics/ and media/ inside it). Made when missing (the run-directory mode; missing
    parents as make_dir makes them); one that exists must be a real directory (no symlink
    followed) of ours that no other user can write, under no parent another user could swap it
    through (make_dir's rule for a log directory). OSError, naming why, otherwise: another user
    who can write it could put a symlink at a name the command writes (index.html to a file of
    ours), or swap the files after it. Files go in with create_output."""
    path = Path(path)
    _check_no_open_parent(path)
    for parent in reversed([p for p in path.parents if not p.exists()]):
        try:
            parent.mkdir(mode=0o775)
        except FileExistsError:
            pass
    try:
        path.mkdir(mode=_modes.dir)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OSError(exc.errno, "a symlink or not a directory (not followed)", os.fspath(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"it is owned by another user (uid {st.st_uid}), who could put a symlink at a "
                                       f"name written there or swap the files; use a directory of your own",
                          os.fspath(path))
        if st.st_mode & 0o022:
            raise OSError(errno.EPERM, f"it is writable by other users (mode {stat.S_IMODE(st.st_mode):o}), who could "
                                       f"put a symlink at a name written there or swap the files; `chmod go-w` it "
                                       f"or use a directory of your own", os.fspath(path))
    finally:
        os.close(fd)
    return path


def create_output(path: str | os.PathLike, mode: int | None = None) -> int:
    """A new file at `path` in an output directory (output_dir), opened to write with the
    run-file mode: what was there is unlinked first (a symlink is removed, never followed; a
    hard link's other names keep their content), then the name is created afresh (O_EXCL,
    O_NOFOLLOW). Nobody else can write that directory, so nothing can come between the two."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                   _modes.file if mode is None else mode)


def open_output_file(path: str | os.PathLike, mode: int | None = None) -> int:
    """A file a user named for a command's output (`goodput --json FILE`), opened to write
    without ever waiting (a FIFO nobody reads: ENXIO) and never through what another user could
    have put there. Its directory must be ours or root's and writable by no other user unless it
    is sticky (/tmp), under no parent another user could swap it through. A regular file there
    must be ours: it is replaced by a new one (create_output's way). A symlink is followed only
    when it is ours or root's (`/dev/stdout`), and a FIFO, a terminal or a device is written to
    only when it is ours or root's. OSError, naming why, otherwise."""
    path = os.fspath(path)
    me = os.geteuid()
    directory = os.path.dirname(os.path.abspath(path))
    st = os.stat(directory)
    if st.st_uid not in (me, 0):
        raise OSError(errno.EPERM, f"its directory is owned by another user (uid {st.st_uid}), who could put a "
                                   f"symlink at its name; use a directory of your own", path)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise OSError(errno.EPERM, f"its directory is writable by other users (mode {stat.S_IMODE(st.st_mode):o}), who "
                                   f"could put a symlink at its name; use a directory of your own", path)
    _check_no_open_parent(Path(directory))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if st is None or stat.S_ISREG(st.st_mode):
        if st is not None and st.st_uid != me:
            raise OSError(errno.EPERM, f"it is owned by another user (uid {st.st_uid}); remove it or name another "
                                       f"file", path)
        fd = create_output(path, mode)
    else:
        if st.st_uid not in (me, 0):
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file and"
            raise OSError(errno.EPERM, f"{what} owned by another user (uid {st.st_uid}): not followed or written "
                                       f"to", path)
        fd = os.open(path, flags if stat.S_ISLNK(st.st_mode) else flags | os.O_NOFOLLOW)
    try:
        target = os.fstat(fd)
        if stat.S_ISREG(target.st_mode) and target.st_uid != me:     # what a link of ours names
            raise OSError(errno.EPERM, f"it names a file owned by another user (uid {target.st_uid})", path)
        if stat.S_ISREG(target.st_mode):
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        raise
    return fd


def _check_no_open_parent(path: Path) -> None:
    """No directory above `path` is writable by every user without the sticky bit: anyone could
    rename the run's directory away and put a link of theirs at its name. Nor is one with the
    sticky bit (a /tmp of its own) owned by another user than root: its owner may rename what
    anyone made in it. (A group-writable one, a team's runs/, is the team's choice.)"""
    me = os.geteuid()
    for parent in Path(os.path.abspath(path)).parents:
        try:
            st = os.stat(parent)
        except OSError:
            continue
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise OSError(errno.EPERM, f"{parent} above it is writable by every user (without the sticky bit), who "
                                       f"could swap what is under it; use a directory of your own", os.fspath(path))
        if st.st_mode & stat.S_IWOTH and st.st_uid not in (0, me):
            raise OSError(errno.EPERM, f"{parent} above it is writable by every user and owned by another user "
                                       f"(uid {st.st_uid}), who could swap what is under it despite its sticky "
                                       f"bit; use a directory of your own", os.fspath(path))


def _set_mode(fd: int, path, mode: int, is_kind) -> None:
    st = os.fstat(fd)
    if not is_kind(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & stat.S_ISVTX:
        return
    if stat.S_IMODE(st.st_mode) & 0o777 != mode:
        try:
            os.fchmod(fd, (stat.S_IMODE(st.st_mode) & stat.S_ISGID) | mode)
        except OSError as exc:      # a file system without modes (vfat, some network mounts): said, not fatal
            log.warning("cannot set mode %o on %s (%s): it keeps %o", mode, path, exc.strerror or exc,
                        stat.S_IMODE(st.st_mode))
