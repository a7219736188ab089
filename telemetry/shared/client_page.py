"""A client's seq page: how many records a process made, readable after it died without a bye.

    <ipc socket's path>.clients/<src as 16 hex digits>     0600, in a 0700 directory
    six little-endian u64: MAGIC, pid, start time (clock ticks since boot), pid namespace
    (the inode of /proc/self/ns/pid), rank, next seq

A client's bye carries its final seq, so the daemon counts what never arrived of it exactly. A
process that ends without one (SIGKILL, the OOM killer, os._exit, a crash) leaves its last
records in its own queues, and the daemon, which saw only the seqs that arrived, cannot tell
how many there were. So a client on an ipc endpoint keeps its next seq in a shared file mapping
(one store a record, no system call): the kernel keeps what was stored when the process dies.

At its drain the daemon reads the page of each client without a bye whose process is gone (its
pid and start time, in the daemon's own pid namespace: a pid from another namespace names
another process here), or that closed (its bye sent, the page marked: MAGIC_CLOSED; a daemon
killed before it read the bye, or before its checkpoint held it, leaves it to its successor),
and takes the page's seq as that bye's: what the process made and never sent is counted lost. A client it never heard from (dead before its first record got through)
is counted the same way, every seq lost, when its page was made while the daemon ran (or the
daemon continues a predecessor's accounting on the run's log directory). A live client's page is
never believed until it closed (it still moves); a zombie's process is gone.

The client removes its page at close only when no daemon was ever there; the daemon, at its
drain, those it used, those of clients whose bye came, and those of processes gone that were
there before it started, when it continues no predecessor's accounting (another run's: said in
its log). Pages of
one socket are apart from another's (two daemons in one directory). A page is opened without
following links and believed only as a regular file of the daemon's uid, of its exact size, in a
directory only that user can enter (telemetry.shared.endpoints); its path comes from the src on
the wire or the directory's listing, never a path from the wire.
"""
from __future__ import annotations

import mmap
import os
import stat
import struct
from pathlib import Path
from typing import NamedTuple

from telemetry.shared.stacks_file import proc_start_time

MAGIC = int.from_bytes(b"tmseqpg2", "little")
# The magic of a page whose client has closed: its bye is sent, its seq final (ClientPage.close).
MAGIC_CLOSED = int.from_bytes(b"tmseqpgC", "little")
_LAYOUT = struct.Struct("<6Q")
SIZE = _LAYOUT.size
SEQ_INDEX = 5          # the next seq's u64 in the page
_HEX = frozenset("0123456789abcdef")
MAX_LISTED = 4096      # names looked at in one drain: a bound on its time


def page_dir(ingest_endpoint: str) -> Path | None:
    """The pages' directory of an ingest endpoint, beside its ipc socket (None: not ipc)."""
    if not ingest_endpoint.startswith("ipc://"):
        return None
    return Path(ingest_endpoint[len("ipc://"):] + ".clients")


def own_private_dir(directory: Path, uid: int) -> bool:
    """Make `directory` (0700) if it is not there; whether it is a directory of `uid` that no one
    else may enter (a link is not). OSError for what else the file system says."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(directory)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not stat.S_IMODE(st.st_mode) & 0o077


def page_path(directory: Path, src: int) -> Path:
    return directory / f"{src:016x}"


def pid_namespace(pid: int | str = "self") -> int:
    """The inode of the process's pid namespace (0: unknown): pids mean the same in two
    processes only when theirs are equal."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return 0


def private_seqs(next_seq: int = 0) -> memoryview:
    """A seq cell of the page's kind over this process's own memory (never seen by a daemon)."""
    seqs = memoryview(bytearray(8)).cast("Q")
    seqs[0] = next_seq
    return seqs


class ClientPage:
    """The client's side: `seqs[0]` is the next seq, stored into the shared mapping."""

    __slots__ = ("path", "_map", "seqs")

    def __init__(self, path: Path | None, mapping: mmap.mmap | None) -> None:
        self.path, self._map = path, mapping
        # With no page, the same kind of object over private memory: the hot path is one code.
        self.seqs = memoryview(mapping)[SEQ_INDEX * 8:SIZE].cast("Q") if mapping is not None else private_seqs()

    @classmethod
    def create(cls, ingest_endpoint: str, src: int, rank: int) -> "ClientPage":
        """This process's page for `src`; a page of private memory when the endpoint is not ipc
        or the file cannot be made (the client works as before, without it)."""
        directory = page_dir(ingest_endpoint)
        if directory is None:
            return cls(None, None)
        path = page_path(directory, src)
        try:
            if not own_private_dir(directory, os.getuid()):
                return cls(None, None)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return cls(None, None)
        try:
            os.write(fd, _LAYOUT.pack(MAGIC, os.getpid(), proc_start_time() or 0, pid_namespace(),
                                      min(rank, 1 << 62), 0))
            mapping = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError):
            _unlink(path)
            return cls(None, None)
        finally:
            os.close(fd)
        return cls(path, mapping)

    def mark_closed(self) -> None:
        """The client has closed: its bye took the last seq, so the page's seq is final, to be
        believed while the process still runs (a daemon that died before reading the bye, or
        before its checkpoint held it, leaves the client's tail to its successor's drain). What
        the client counts after (a log() after close: dropped, on its side alone) goes to private
        memory from here (`seqs`), never to the page: nor from a child forked later, which
        shares the mapping."""
        if self._map is not None:
            self._map[0:8] = MAGIC_CLOSED.to_bytes(8, "little")
            self.seqs = private_seqs(self.seqs[0])

    def remove(self) -> None:
        """The bye reached a daemon (or no daemon was ever there): the page is no longer needed.
        The mapping stays (the memoryview over it cannot be released while it is exported); it
        goes with the client."""
        if self.path is not None:
            _unlink(self.path)
            self.path = None


class PageInfo(NamedTuple):
    pid: int
    start_time: int
    pid_ns: int
    rank: int
    next_seq: int
    closed: bool = False      # the client closed (MAGIC_CLOSED): its seq is final


class PageDir:
    """The daemon's side: a socket's pages directory, opened once without following links (one
    that is a symlink, or not this user's alone, is not read at all), each page read and removed
    through it."""

    def __init__(self, directory: Path) -> None:
        self.fd: int | None = None
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            os.close(fd)
            return
        self.fd = fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "PageDir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, src: int) -> PageInfo | None:
        """The page of `src`, if it is one this daemon may believe (see the module's docstring)."""
        if self.fd is None:
            return None
        try:
            fd = os.open(f"{src:016x}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.fd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size != SIZE:
                return None
            data = os.read(fd, SIZE)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(data) != SIZE:
            return None
        magic, pid, start_time, pid_ns, rank, next_seq = _LAYOUT.unpack(data)
        if magic not in (MAGIC, MAGIC_CLOSED) or not 0 < pid < 1 << 31:
            return None
        return PageInfo(pid, start_time, pid_ns, rank, next_seq, magic == MAGIC_CLOSED)

    def listed(self) -> list[int]:
        """The srcs of the pages here (at most MAX_LISTED names looked at)."""
        if self.fd is None:
            return []
        try:
            with os.scandir(self.fd) as it:
                names = [e.name for _, e in zip(range(MAX_LISTED), it)]
        except OSError:
            return []
        return [int(n, 16) for n in names if len(n) == 16 and _HEX.issuperset(n)]

    def remove(self, src: int) -> bool:
        if self.fd is None:
            return False
        try:
            os.unlink(f"{src:016x}", dir_fd=self.fd)
            return True
        except OSError:
            return False


def final(info: PageInfo, own_ns: int) -> bool:
    """Whether the page's seq is its client's last: the client closed (in any pid namespace),
    or its process is gone (judged only in the reader's own: `own_ns`, pid_namespace())."""
    return info.closed or (same_namespace(info, own_ns) and process_gone(info))


def process_gone(info: PageInfo) -> bool:
    """The process that wrote the page has ended: its pid is gone, is another process now (its
    start time differs), or is a zombie (ended, not reaped yet). Only for a page of this pid
    namespace (same_namespace)."""
    try:
        with open(f"/proc/{info.pid}/stat", "rb") as f:
            st = f.read(4096)
        fields = st[st.rfind(b")") + 2:].split()       # from field 3, the state, on
        return fields[0] in (b"Z", b"X") or int(fields[19]) != info.start_time
    except (OSError, ValueError, IndexError):
        return True


def same_namespace(info: PageInfo, own_ns: int) -> bool:
    return own_ns != 0 and info.pid_ns == own_ns


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:      # gone already, or not ours to remove: nothing else to do
        return False
