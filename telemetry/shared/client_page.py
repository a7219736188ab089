"""A client's seq page: how many records a process made, readable after it died without a bye.

    <dir of the ipc ingest socket>/clients/<src as 16 hex digits>     0600, in a 0700 directory
    four little-endian u64: MAGIC, pid, start time (clock ticks since boot), next seq

A client's bye carries its final seq, so the daemon counts what never arrived of it exactly. A
process that ends without one (SIGKILL, the OOM killer, os._exit, a crash) leaves its last
records in its own queues, and the daemon, which saw only the seqs that arrived, cannot tell
how many there were. So a client on an ipc endpoint keeps its next seq in a shared file mapping
(one store a record, no system call): the kernel keeps what was stored when the process dies.
At its drain the daemon reads the page of each client still open without a bye whose process
(pid and start time) is gone, and takes the page's seq as that bye's: what the process made and
never sent is counted lost. A live client's page is never believed (it still moves).

The client removes its page at close; the daemon one it has used, and at the end of its drain
the pages of every process that is gone. The page is only ever opened without following links, and
believed only when it is a regular file of the daemon's own uid in the socket's directory (which
only that user can enter: telemetry.shared.endpoints); its path comes from the src on the wire,
never a path.
"""
from __future__ import annotations

import mmap
import os
import stat
import struct
from pathlib import Path
from typing import NamedTuple

from telemetry.shared.stacks_file import proc_start_time

DIR_NAME = "clients"
MAGIC = int.from_bytes(b"tmseqpg1", "little")
SIZE = 32
_LAYOUT = struct.Struct("<4Q")
SEQ_INDEX = 3          # the next seq's u64 in the page
_HEX = frozenset("0123456789abcdef")
MAX_SWEPT = 4096       # names looked at in one sweep: a bound on a drain's time


def page_dir(ingest_endpoint: str) -> Path | None:
    """The pages' directory for an ingest endpoint: beside its ipc socket (None: not ipc)."""
    if not ingest_endpoint.startswith("ipc://"):
        return None
    return Path(ingest_endpoint[len("ipc://"):]).parent / DIR_NAME


def page_path(directory: Path, src: int) -> Path:
    return directory / f"{src:016x}"


class ClientPage:
    """The client's side: `seqs[0]` is the next seq, stored into the shared mapping."""

    __slots__ = ("path", "_map", "seqs")

    def __init__(self, path: Path | None, mapping: mmap.mmap | None) -> None:
        self.path, self._map = path, mapping
        # With no page, the same kind of object over private memory: the hot path is one code.
        buf = memoryview(mapping)[SEQ_INDEX * 8:SIZE] if mapping is not None else memoryview(bytearray(8))
        self.seqs = buf.cast("Q")

    @classmethod
    def create(cls, ingest_endpoint: str, src: int) -> "ClientPage":
        """This process's page for `src`; a page of private memory when the endpoint is not ipc
        or the file cannot be made (the client works as before, without it)."""
        directory = page_dir(ingest_endpoint)
        if directory is None:
            return cls(None, None)
        path = page_path(directory, src)
        try:
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                pass
            st = os.lstat(directory)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
                return cls(None, None)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return cls(None, None)
        try:
            os.write(fd, _LAYOUT.pack(MAGIC, os.getpid(), proc_start_time() or 0, 0))
            mapping = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError):
            _unlink(path)
            return cls(None, None)
        finally:
            os.close(fd)
        return cls(path, mapping)

    def remove(self) -> None:
        """At close, the bye handed over: the page is no longer needed. The mapping stays (the
        memoryview over it cannot be released while it is exported); it goes with the client."""
        if self.path is not None:
            _unlink(self.path)
            self.path = None


class PageInfo(NamedTuple):
    pid: int
    start_time: int
    next_seq: int


def read_page(directory: Path, src: int) -> PageInfo | None:
    """The page of `src`, if it is one this daemon may believe (see the module's docstring)."""
    path = page_path(directory, src)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
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
    magic, pid, start_time, next_seq = _LAYOUT.unpack(data)
    if magic != MAGIC or not 0 < pid < 1 << 31 or next_seq >= 1 << 62:
        return None
    return PageInfo(pid, start_time, next_seq)


def process_gone(info: PageInfo) -> bool:
    """The process that wrote the page has ended (its pid is gone, or is another process now)."""
    now = proc_start_time(info.pid)
    return now is None or now != info.start_time


def remove(directory: Path, src: int) -> None:
    _unlink(page_path(directory, src))


def sweep(directory: Path | None) -> int:
    """Remove the pages of processes that are gone (at a daemon's drain: after it, nobody on this
    socket's directory would read them). Returns how many were removed."""
    if directory is None:
        return 0
    try:
        names = os.listdir(directory)[:MAX_SWEPT]
    except OSError:
        return 0
    removed = 0
    for name in names:
        if len(name) != 16 or not _HEX.issuperset(name):
            continue
        src = int(name, 16)
        info = read_page(directory, src)
        if info is not None and process_gone(info):
            removed += _unlink(directory / name)
    return removed


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:      # gone already, or not ours to remove: nothing else to do
        return False
