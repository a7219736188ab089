"""A local client's record ring: its frames in shared memory that the daemon polls.

    <ipc socket's path>.clients/<src as 16 hex digits>.ring     0600, in the pages' 0700 directory
    HEADER_BYTES of header: MAGIC, capacity, src, attached (the daemon's pid once it reads it);
    the write position and the records written (the client's), the read position, the records
    read and the reader's beat (the daemon's), the writer's and the reader's on cache lines of
    their own; then `capacity`
    bytes of records, each a u32 length, a u32 of zero and the frame, padded to 8 bytes. A
    length of SKIP marks the end of the data before a wrap.

Why: a `send` on a ZeroMQ socket after the caller has done other work (one log() per training
step) makes a system call that wakes libzmq's I/O thread, which on a busy machine pre-empts the
caller: at a step of 100 ms that wake-up is most of what log() costs (benchmarks/RESULTS.md,
Client cost). A write into this ring is a copy and a store: no system call, no thread woken.
The daemon reads the rings it knows each turn of its loop, polling them at a period that
shortens while records come and lengthens while none do (telemetry/daemon/rings.py).

What goes where (protocol/README.md): a client (unless $TELEMETRY_TRANSPORT=zmq) whose daemon
reads rings (the daemon's marker, `reader_alive`) writes every frame into its ring, hello and events too, so that one pipe keeps
them in the order of the calls; only the bye goes on the ZeroMQ socket, and the daemon reads the
client's ring to its end before it takes the bye. A ring that is full refuses the frame (the
client counts it dropped and says so in-band, as for a full socket). The ring outlives its
process: what a client wrote before it was killed is still read. A client whose daemon does not
read rings (one of a version before them, or none when the client started) sends on the socket
as before: nothing on the wire changed.

Memory order: the writer stores the record, then the write position (a release); the reader
loads the write position (an acquire), then the record, then stores its read position. The C
writer (telemetry/client/_fastlog.c, Ring) and reader (telemetry/daemon/_hotpath.c) use atomics;
the Python twins here rely on x86's ordering of stores and of loads, so they are used only on
x86-64 (`python_twins_safe`).
"""
from __future__ import annotations

import mmap
import os
import platform
import stat
import struct
import time
from pathlib import Path

from protocol.constants import MAX_FRAME_BYTES
from telemetry.shared.client_page import own_private_dir
from telemetry.shared.stacks_file import proc_start_time

MAGIC = int.from_bytes(b"tmring01", "little")
HEADER_BYTES = 256
CAPACITY_AT, ATTACHED_AT = 8, 24          # the src at 16
WPOS_AT, RPOS_AT = 64, 128
# Beside each position, its count of records: the writer's written, the reader's read. A ring
# holds at most `max_records` records (the client's sndhwm, as its socket's queue did) and
# `capacity` bytes.
WCOUNT_AT, RCOUNT_AT = 72, 136
# On the reader's line too, its beat: its CLOCK_MONOTONIC time (ns) as it looks at its rings,
# stored at most every BEAT_EVERY_S (telemetry/daemon/rings.py). A writer whose reader beat
# within its look's period knows it reads without a system call (watch_reader).
BEAT_AT = 144
BEAT_EVERY_S = 0.25
# The capacity a client's ring gets for its sndhwm: this many bytes a record (a wide row's is
# a few hundred), never below DEFAULT_CAPACITY nor above MAX_CAPACITY.
BYTES_PER_RECORD = 256
# A frame of MAX_FRAME_BYTES (a hello with a big config) always fits a ring no more than half full.
DEFAULT_CAPACITY = 2 * MAX_FRAME_BYTES + 4096
MAX_CAPACITY = 1 << 26
RECORD_HEAD = 8
SKIP = 0xFFFFFFFF
MARKER = "ring-reader"
# What TELEMETRY_TRANSPORT may say: "zmq" (a client sends on its socket; a daemon reads no rings);
# anything else, or nothing: a client writes a ring where its daemon reads rings.
ENV_TRANSPORT = "TELEMETRY_TRANSPORT"

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_RECORD_HEAD = struct.Struct("<II")
_HEAD = struct.Struct("<4Q")


def python_twins_safe() -> bool:
    """Whether the Python writer and reader keep the memory order without atomics (x86-64)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def ring_name(src: int) -> str:
    return f"{src:016x}.ring"


def record_bytes(n: int) -> int:
    """What a frame of `n` bytes takes in the ring."""
    return RECORD_HEAD + ((n + 7) & ~7)


# -- the daemon's marker ------------------------------------------------------------------------
def advertise(directory: Path) -> bool:
    """Say in the pages' directory that this process (a daemon) reads rings: its pid and start
    time, which a client checks (`reader_alive`). False when the directory is not this user's
    alone (nothing written: clients then send on the socket)."""
    try:
        if not own_private_dir(directory, os.geteuid()):
            return False
        tmp = directory / f".{MARKER}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, f"{os.getpid()} {proc_start_time() or 0}\n".encode())
        finally:
            os.close(fd)
        os.replace(tmp, directory / MARKER)
        return True
    except OSError:
        return False


def withdraw(directory: Path) -> None:
    """The daemon stops reading rings (its drain is over): clients started from here send on the
    socket. Only its own marker goes."""
    path = directory / MARKER
    try:
        pid = int(path.read_bytes().split()[0])
    except (OSError, ValueError, IndexError):
        return
    if pid == os.getpid():
        try:
            os.unlink(path)
        except OSError:
            pass


def reader_alive(directory: Path) -> int:
    """The pid of the daemon that wrote the marker when it runs now (the same pid and start time),
    else 0: a client writes its frames into a ring only then. A directory or marker that is not
    this user's alone is not believed."""
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            return 0
        fd = os.open(MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
        try:
            mst = os.fstat(fd)
            if not stat.S_ISREG(mst.st_mode) or mst.st_uid != os.geteuid():
                return 0
            pid, start = (int(x) for x in os.read(fd, 64).split()[:2])
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return 0
    finally:
        os.close(dfd)
    return pid if 0 < pid < 1 << 31 and start != 0 and proc_start_time(pid) == start else 0


# How often a client's ring writer looks whether its reader still runs (watch_reader).
WATCH_EVERY_NS = 1_000_000_000


def watch_reader(writer, directory: Path, on_gone, pid: int = 0) -> bool:
    """Arm `writer` (Ring or PyRing) to look, at most every WATCH_EVERY_NS, before a write, whether
    the daemon that reads rings here still runs: its beat in the ring's header (a load: it beat
    within the period), else a stat of the marker and of that daemon's /proc entry (two system
    calls, in C on the training thread: no Python). When either changed, the
    full look (`reader_alive`): a daemon reads rings here (one started since reads what this ring
    holds, as a successor does) and the writer watches it. None does: if another daemon has bound
    the ingest socket since (one of a version before rings, or told TELEMETRY_TRANSPORT=zmq),
    on_gone() is called (the client sends on its socket from there); if none has, the ring keeps
    what comes, within its bound (a successor that reads rings reads it), and the look comes
    again a second later. False, nothing armed, when none reads rings now. `pid`: the reader's, as
    `reader_alive` just gave it (0: looked up here)."""
    pid = pid or reader_alive(directory)
    try:
        ino = os.lstat(directory / MARKER).st_ino if pid else 0
    except OSError:
        ino = 0
    if not ino:
        return False
    writer.watch(os.fsencode(directory / MARKER), ino, os.fsencode(f"/proc/{pid}"), WATCH_EVERY_NS,
                 reader_changed(writer, directory, on_gone, _ingest_ino(directory)))
    return True


def reader_changed(writer, directory: Path, on_gone, bound: tuple[int, int] | int):
    """What `writer` calls when its reader's marker or process changed (watch_reader): `bound`,
    the ingest socket's `_ingest_ino` when the reader was armed."""
    def changed() -> None:
        if watch_reader(writer, directory, on_gone):
            return
        if _ingest_ino(directory) not in (0, bound):
            writer.watch(None, 0, None, 0, None)
            on_gone()

    return changed


def _ingest_ino(directory: Path) -> tuple[int, int] | int:
    """The inode and change time of the ingest socket the pages' directory belongs to (0: none
    there): a daemon that binds it makes it anew (the inode's number may be the one just freed;
    the time is not)."""
    try:
        st = os.lstat(directory.with_name(directory.name.removesuffix(".clients")))
    except OSError:
        return 0
    return st.st_ino, st.st_ctime_ns


# -- the client's side --------------------------------------------------------------------------
def capacity_for(max_records: int) -> int:
    """The bytes of a ring that holds `max_records` records (see BYTES_PER_RECORD)."""
    return min(MAX_CAPACITY, max(DEFAULT_CAPACITY, max_records * BYTES_PER_RECORD))


def create(directory: Path, src: int, capacity: int = DEFAULT_CAPACITY) -> tuple[Path, mmap.mmap] | None:
    """A new ring for `src` in the pages' directory (made by the client's page already), mapped;
    None when it cannot be made, its room not had in the filesystem included (the client then
    sends on its socket). Its pages are reserved at once: `capacity` bytes of the filesystem
    (tmpfs: memory) while the ring lives."""
    capacity = (min(capacity, MAX_CAPACITY) + 7) & ~7
    path = directory / ring_name(src)
    # Made whole under a name the daemon does not look at, then renamed into place: the daemon,
    # told of new files as they are made, never meets one half made.
    tmp = directory / f".{ring_name(src)}.new"
    try:
        if not own_private_dir(directory, os.geteuid()):
            return None
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        # Every page reserved now, not at its first write: on a full filesystem (a small tmpfs,
        # /dev/shm in a container) a write into a sparse file's unbacked page is SIGBUS, which
        # would kill the training process. No room: no ring (the socket, as before).
        os.posix_fallocate(fd, 0, HEADER_BYTES + capacity)
        mapping = mmap.mmap(fd, HEADER_BYTES + capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        _HEAD.pack_into(mapping, 0, MAGIC, capacity, src, 0)
        os.rename(tmp, path)
    except (OSError, ValueError):
        _unlink(tmp)
        return None
    finally:
        os.close(fd)
    return path, mapping


def attached(mapping: mmap.mmap) -> bool:
    """Whether a daemon has read this ring (it then removes it, at the client's bye or its drain)."""
    return _U64.unpack_from(mapping, ATTACHED_AT)[0] != 0


class PyRing:
    """The client's writer in Python: send(frame, flags=0), the contract of a ZeroMQ socket's
    send with NOBLOCK (raises `error` when the ring has no room). Used where the C part is not
    built, on x86-64 only (python_twins_safe). One thread writes at a time (the client's
    hand-over between its caller and its sender thread)."""

    __slots__ = ("_map", "_cap", "_error", "_max_records", "_to", "_watch", "_next_check")

    def __init__(self, mapping: mmap.mmap, error: type, max_records: int) -> None:
        self._map = mapping
        self._cap = _U64.unpack_from(mapping, CAPACITY_AT)[0]
        self._error = error
        self._max_records = max_records
        self._to = self._watch = None
        self._next_check = 0

    def release(self) -> None:
        self._map = self._to = self._watch = None

    def redirect(self, send) -> None:
        """Every later frame goes to `send(frame, flags)` instead (see Ring in _fastlog.c)."""
        if self._map is not None:
            self._to = send

    def watch(self, marker: bytes | None, ino: int, proc: bytes | None, every_ns: int, on_change) -> None:
        """See Ring in _fastlog.c."""
        self._watch = None if on_change is None else (marker, ino, proc, every_ns, on_change)
        self._next_check = time.monotonic_ns() + every_ns

    def send(self, frame: bytes, flags: int = 0) -> None:
        w = self._watch
        if w is not None and self._to is None:
            now = time.monotonic_ns()
            if now >= self._next_check:
                self._next_check = now + w[3]
                beat = _U64.unpack_from(self._map, BEAT_AT)[0]
                try:
                    same = (beat and abs(now - beat) < w[3]) or (os.lstat(w[0]).st_ino == w[1]
                                                                  and os.path.exists(w[2]))
                except OSError:
                    same = False
                if not same:
                    try:
                        w[4]()
                    except Exception:           # never into the training loop: the ring as before
                        pass
        if self._to is not None:
            return self._to(frame, flags)
        m, cap = self._map, self._cap
        if m is None:
            raise self._error()
        n = len(frame)
        rec = record_bytes(n)
        w = _U64.unpack_from(m, WPOS_AT)[0]
        r = _U64.unpack_from(m, RPOS_AT)[0]
        written = _U64.unpack_from(m, WCOUNT_AT)[0]
        off = w % cap
        tail = cap - off
        need = rec + (tail if rec > tail else 0)
        if n > MAX_FRAME_BYTES or rec > cap or w - r + need > cap \
                or written - _U64.unpack_from(m, RCOUNT_AT)[0] >= self._max_records:
            raise self._error()
        if rec > tail:
            _U32.pack_into(m, HEADER_BYTES + off, SKIP)
            w += tail
            off = 0
        at = HEADER_BYTES + off
        _RECORD_HEAD.pack_into(m, at, n, 0)
        m[at + RECORD_HEAD:at + RECORD_HEAD + n] = frame
        _U64.pack_into(m, WCOUNT_AT, written + 1)
        _U64.pack_into(m, WPOS_AT, w + rec)


def writer(mapping: mmap.mmap, error: type, max_records: int):
    """The ring's writer: the C one when built, else PyRing on x86-64; None where neither is safe."""
    try:
        from telemetry.client._fastlog import Ring
    except ImportError:
        Ring = None
    if Ring is not None:
        return Ring(mapping, error, MAX_FRAME_BYTES, max_records)
    return PyRing(mapping, error, max_records) if python_twins_safe() else None


def _unlink(path: Path | None) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
