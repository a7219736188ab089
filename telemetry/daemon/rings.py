"""The daemon's side of the local clients' record rings (telemetry/shared/ring.py).

A daemon on an ipc endpoint says in the pages' directory that it reads rings (ring.advertise);
a client started while it runs writes every frame but its bye into a ring of its own there. The
daemon finds new rings as they are made (inotify, whose descriptor the loop polls with its
sockets; a listing every WATCHED_SCAN_S besides, every SCAN_S without inotify, and at once for a
bye whose ring it does not hold yet); every read attaches the rings made since before it reads
any. Frames of several rings are merged by the time each was made, and a frame made after a
read began is held for the next (read, _hold_made_after): what reaches the aggregator is in the
order the clients made it, as one socket's queue would have it.

The daemon looks at the rings it holds between its waits on the sockets
(core.Daemon._wait_polling_rings: a load of each ring's write position, no turn of the loop):
after a look that found records, the next comes when the next records are likely (EXPECT_FACTOR
of the time between such looks, smoothed: the clients' cadence), then MIN_POLL_S apart, the
period doubling with each empty look up to a few times that cadence (MAX_POLL_S once nothing
came for IDLE_AFTER_S). So records that keep coming wait at most MIN_POLL_S and are read in
batches (a turn of the daemon's loop per batch, as the sender thread's
batches on the socket were; the emit -> subscriber budget, 20 ms at 10k records/s, holds), a
loop logging every 100 ms costs two or three looks a record, and an idle daemon looks
MAX_POLL_S apart. As it looks and reads, at most every ring.BEAT_EVERY_S, it stores its beat in
each ring it holds: a client whose reader beat lately knows it still reads without a system call.

What is read joins the intake queue like the socket's frames (intake.Intake.fill): the same
decoding, accounting and shedding. A ring is read only while the intake has room in its budget;
the rest waits in the ring, and a client whose ring is full drops and counts (in-band). A bye
comes on the socket: before it is queued, its client's ring is read to its end (the client wrote
it all before it sent the bye), so the bye closes an accounting that has seen every record. At
its drain the daemon reads every ring it holds to its end (a client killed without a bye left
its records there), then removes them.

A ring is believed only as a regular file of this user, of the size its header says, opened
without following links through the directory's descriptor (the pages' rules); a ring whose
positions or lengths are impossible is let go (counted in `rings_broken`), never read past.
Rings there before the daemon started whose client is gone are another run's: not read.
"""
from __future__ import annotations

import heapq
import logging
import mmap
import os
import stat
import struct
import time
from pathlib import Path

import msgspec

from protocol.constants import KIND_BYE, MAX_FRAME_BYTES
from protocol.codec import peek_header
from telemetry.daemon import hotpath
from telemetry.shared import client_page, ring

log = logging.getLogger("telemetry.rings")

MIN_POLL_S = 0.005
MAX_POLL_S = 0.1
# After records, the next look comes this share of the clients' cadence later (the time between
# reads that found records, smoothed).
EXPECT_FACTOR = 0.9
# Nothing read for this long: the clients are idle, and looks go MAX_POLL_S apart.
IDLE_AFTER_S = 1.0
SCAN_S = 0.1
# With inotify telling of new files, the listing is only a safety net.
WATCHED_SCAN_S = 1.0
MAX_RINGS = 4096
# Read from one ring in one go at most: the intake's chunk (intake.READ_CHUNK).
CHUNK_FRAMES = 1024
# A ring's pages read past are handed back once this many bytes are (Reader).
FORGET_BYTES = 1 << 16

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<4Q")
_BYE = bytes((KIND_BYE,))


class RingBroken(Exception):
    pass


class _Made(msgspec.Struct, array_like=True):
    """A frame's header up to its time (the rest of the frame is not read)."""
    kind: int
    version: int
    src: int
    rank: int
    seq: int
    dropped: int
    t_ns: int


_made = msgspec.msgpack.Decoder(_Made).decode


def _made_at(frame: bytes) -> int:
    """When a frame was made (its header's t_ns; 0 for one without a readable header: the
    receiver refuses it, counted)."""
    try:
        return _made(frame).t_ns
    except (msgspec.DecodeError, msgspec.ValidationError):
        return 0


_IN_CREATE, _IN_MOVED_TO, _IN_NONBLOCK, _IN_CLOEXEC = 0x100, 0x80, 0o4000, 0o2000000


def _inotify(directory: Path) -> int | None:
    """A non-blocking inotify descriptor that becomes readable when a file is made in
    `directory` (Linux; None elsewhere or when it cannot be had: the rings are then found by
    listing every SCAN_S alone)."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_CREATE | _IN_MOVED_TO) < 0:
            os.close(fd)
            return None
        return fd
    except (OSError, AttributeError):
        return None


class Reader:
    """One client's ring, mapped: read() takes frames from the read position on. The pages it
    has read past are handed back (MADV_DONTNEED: the data stays in the file, for the client to
    overwrite) every FORGET_BYTES, so that a ring costs the daemon's RSS what it holds unread, not
    its capacity."""

    __slots__ = ("src", "map", "cap", "r", "forgotten")

    def __init__(self, src: int, mapping: mmap.mmap, cap: int) -> None:
        self.src, self.map, self.cap = src, mapping, cap
        self.r = self.forgotten = _U64.unpack_from(mapping, ring.RPOS_AT)[0]

    def read(self, out: list, max_frames: int, max_bytes: int) -> tuple[int, int]:
        """Append up to `max_frames` frames (and `max_bytes` of them, past one) to `out`: (frames,
        bytes). Raises RingBroken on impossible positions or lengths (loops.read_ring)."""
        try:
            self.r, taken, size = hotpath.loops.read_ring(self.map, self.r, out, max_frames, max_bytes,
                                                          MAX_FRAME_BYTES)
        except ValueError as exc:
            raise RingBroken(str(exc)) from None
        if self.r - self.forgotten >= FORGET_BYTES:
            self._forget(self.forgotten, self.r)
            self.forgotten = self.r
        return taken, size

    def _forget(self, a: int, b: int) -> None:
        """Hand back the whole pages of ring positions a..b (read)."""
        cap, page = self.cap, mmap.PAGESIZE
        while a < b:
            off = a % cap
            n = min(b - a, cap - off)
            start = -(-(ring.HEADER_BYTES + off) // page) * page
            end = (ring.HEADER_BYTES + off + n) // page * page
            if end > start:
                try:
                    self.map.madvise(mmap.MADV_DONTNEED, start, end - start)
                except (OSError, ValueError):
                    return
            a += n

    def close(self) -> None:
        try:
            self.map.close()
        except (BufferError, ValueError):
            pass


class RingSet:
    """The rings of one daemon's local clients (see the module's docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.fd: int | None = None
        self.rings: dict[int, Reader] = {}
        self.skipped: set[int] = set()      # rings not to read (another run's, broken, bye'd)
        self.period = MAX_POLL_S
        self.next_poll = 0.0
        self.last_read = 0.0        # when the last look found records
        self.last_attach = 0.0      # when the last new ring was attached: its first records come soon
        self.gap = 0.0              # the time between those looks, smoothed: the clients' cadence
        self.next_scan = 0.0
        self.num_attached = 0
        self.num_frames = 0
        self.num_bytes = 0
        self.num_broken = 0
        self.advertised = False
        self.ready = False          # look() found records (or some are held): the next fill reads them
        self.held: dict[int, list] = {}     # src -> frames read, given with the next look (read())
        self.watch_fd: int | None = None
        self.scan_s = SCAN_S
        self.next_beat = 0.0

    # -- the lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Open the directory, note the rings of gone clients already there (another run's), and
        say that this daemon reads rings."""
        if not ring.advertise(self.directory):
            log.warning("rings: %s is not this user's alone: local clients send on the socket", self.directory)
            return
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            os.close(fd)
            return
        self.fd = fd
        self.advertised = True
        # A new ring is found as its file is made (inotify; the loop polls this descriptor with
        # its sockets), so a client's first records wait no listing; the listing stays, rarer.
        self.watch_fd = _inotify(self.directory)
        self.scan_s = SCAN_S if self.watch_fd is None else WATCHED_SCAN_S
        own_ns = client_page.pid_namespace()
        with client_page.PageDir(self.directory) as pages:
            for src in self._listed():
                info = pages.read(src)
                if info is None or client_page.final(info, own_ns):
                    self.skipped.add(src)

    def stop(self) -> None:
        """No more rings read (the drain is over): the marker goes, and the rings of clients gone
        or closed (by their pages: client_page.final). A live client's ring stays, with its read
        position: it goes on writing there, and a daemon next on the socket reads on from it."""
        if self.advertised:
            ring.withdraw(self.directory)
            self.advertised = False
        if self.fd is None:
            return
        own_ns = client_page.pid_namespace()
        with client_page.PageDir(self.directory) as pages:
            for src in list(self.rings) + list(self.skipped):
                info = pages.read(src)
                self.detach(src, remove=info is None or client_page.final(info, own_ns))
        os.close(self.fd)
        self.fd = None
        if self.watch_fd is not None:
            os.close(self.watch_fd)
            self.watch_fd = None

    # -- finding rings -----------------------------------------------------------------------------
    def _listed(self) -> list[int]:
        if self.fd is None:
            return []
        try:
            with os.scandir(self.fd) as it:
                names = [e.name for _, e in zip(range(client_page.MAX_LISTED), it)]
        except OSError:
            return []
        out = []
        for n in names:
            if len(n) == 21 and n.endswith(".ring") and client_page._HEX.issuperset(n[:16]):
                out.append(int(n[:16], 16))
        return out

    def scan(self) -> int:
        """Attach the rings made since the last look; how many."""
        new = 0
        for src in self._listed():
            if src not in self.rings and src not in self.skipped and self.attach(src) is not None:
                new += 1
        return new

    def attach(self, src: int) -> Reader | None:
        if self.fd is None or len(self.rings) >= MAX_RINGS:
            return None
        try:
            fd = os.open(ring.ring_name(src), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=self.fd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size <= ring.HEADER_BYTES:
                self.skipped.add(src)
                return None
            magic, cap, ring_src, _ = _HEAD.unpack(os.pread(fd, _HEAD.size, 0))
            if (magic != ring.MAGIC or ring_src != src or cap % 8 or not 0 < cap <= ring.MAX_CAPACITY
                    or st.st_size != ring.HEADER_BYTES + cap):
                self.skipped.add(src)
                return None
            mapping = mmap.mmap(fd, ring.HEADER_BYTES + cap, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError, struct.error):
            self.skipped.add(src)
            return None
        finally:
            os.close(fd)
        _U64.pack_into(mapping, ring.ATTACHED_AT, os.getpid())
        _U64.pack_into(mapping, ring.BEAT_AT, time.monotonic_ns())
        reader = self.rings[src] = Reader(src, mapping, cap)
        self.num_attached += 1
        # A new client: its first records are looked for MIN_POLL_S from now on, not a whole
        # idle period later.
        now = time.monotonic()
        self.last_attach = now
        self.period = MIN_POLL_S
        self.next_poll = min(self.next_poll, now + MIN_POLL_S)
        return reader

    def detach(self, src: int, remove: bool = True) -> None:
        reader = self.rings.pop(src, None)
        if reader is not None:
            reader.close()
        self.skipped.add(src)
        if remove:
            self._unlink(src)

    def _unlink(self, src: int) -> None:
        try:
            os.unlink(ring.ring_name(src), dir_fd=self.fd)
        except (OSError, TypeError):
            pass

    # -- reading -----------------------------------------------------------------------------------
    def wait_s(self, now: float) -> float | None:
        """How long the loop may sleep before the next poll (None: no rings read here). Holding
        no ring, the next look for new ones (SCAN_S): an idle daemon wakes no more for them."""
        if self.fd is None:
            return None
        return max(0.0, (self.next_poll if self.rings else self.next_scan) - now)

    def due(self, now: float) -> bool:
        return self.fd is not None and now >= (self.next_poll if self.rings else self.next_scan)

    def notified(self) -> None:
        """Files were made in the directory (watch_fd readable): the events read, new rings attached."""
        if self._events() and self.scan():
            self.ready = True        # a new client's first records may be there already

    def _events(self) -> bool:
        """Whether inotify told of files made since the last call (its events read; no system call
        without a watch)."""
        if self.watch_fd is None:
            return False
        told = False
        try:
            while os.read(self.watch_fd, 65536):
                told = True
        except (BlockingIOError, OSError, TypeError):
            pass
        return told

    def look(self, now: float) -> bool:
        """Whether a ring has records to read (`ready`), when its poll is due: new rings looked
        for (every SCAN_S), then each one's write position against its read position (a hint:
        read() loads it with acquire order). Nothing to read: the period doubles, up to
        MAX_POLL_S."""
        if self.fd is not None and now >= self.next_beat:
            self._beat(now)
        if self.fd is None or self.ready or not self.due(now):
            return self.ready
        if now >= self.next_scan:
            self.scan()
            self.next_scan = now + self.scan_s
        for reader in self.rings.values():
            if _U64.unpack_from(reader.map, ring.WPOS_AT)[0] != reader.r:
                self.ready = True
                return True
        self.period = min(self._most_apart(now), 2 * self.period)
        self.next_poll = now + self.period
        return False

    def _most_apart(self, now: float) -> float:
        """How far apart empty looks may get: a few times the clients' cadence while they log (a
        pause in a fast stream is no reason to read its next records late), MAX_POLL_S once
        nothing came for IDLE_AFTER_S."""
        if now - max(self.last_read, self.last_attach) > IDLE_AFTER_S:
            return MAX_POLL_S
        return max(2 * MIN_POLL_S, min(MAX_POLL_S, 4 * self.gap))

    def read(self, max_bytes: int, now: float | None = None) -> list:
        """Frames from every ring held, up to `max_bytes` of them (past one frame), oldest ring
        first each turn; new rings looked for every SCAN_S. Sets the next poll."""
        if self.fd is None:
            return []
        now = time.monotonic() if now is None else now
        if now >= self.next_beat:
            self._beat(now)
        # The rings made before this look, attached before any is read (inotify's events are
        # queued as a file is renamed into place; a client makes its ring before its first frame).
        told, due = self._events(), now >= self.next_scan
        if told or due:
            self.scan()
            if due:
                self.next_scan = now + self.scan_s
        # Frames made from here on may be missing from a ring read before their writer's: held
        # back a look (below), while more than one ring is read.
        cut_ns = time.time_ns() if len(self.rings) > 1 else None
        out: list = []
        size = 0
        per_ring = []
        held, self.held = self.held, {}
        for reader in list(self.rings.values()):
            got: list = held.pop(reader.src, [])
            if size < max_bytes:
                before = len(got)
                size += self._read_one(reader, got, CHUNK_FRAMES, max_bytes - size)[1]
                if cut_ns is not None and len(got) > before:
                    self._hold_made_after(reader.src, got, before, cut_ns)
            if got:
                per_ring.append(got)
        per_ring.extend(held.values())    # a ring let go since (broken): what it gave is kept
        if len(per_ring) == 1:
            out = per_ring[0]
        elif per_ring:
            # Several clients wrote meanwhile: their frames merged by the time each was made (the
            # header's t_ns: one host's clock), each ring's in its own order. A socket delivers
            # frames about as they are sent; a look at the rings every few milliseconds must not
            # put one rank's step before another's hello made earlier (the step would close
            # without that rank).
            out = list(heapq.merge(*per_ring, key=_made_at))
        if out:
            # The next look when the next records are likely (the clients' cadence so far), then
            # MIN_POLL_S apart, doubling: at a step of 100 ms two or three looks a record, not a
            # look every few milliseconds.
            if self.last_read:
                # The time between one ring's records: what passed since the last read, over the
                # records each ring that had any wrote meanwhile (records coming faster than the
                # looks make it small at once: no feedback from the looks' own period).
                each = (now - self.last_read) * max(1, len(per_ring)) / len(out)
                # Faster at once (a burst is read in batches from its start), slower by degrees (a
                # pause is no new cadence).
                self.gap = each if each < self.gap else 0.75 * self.gap + 0.25 * each
            self.last_read = now
            self.period = MIN_POLL_S
            self.next_poll = now + max(MIN_POLL_S, min(MAX_POLL_S, EXPECT_FACTOR * self.gap))
        else:
            self.period = min(self._most_apart(now), 2 * self.period)
            self.next_poll = now + self.period
        # Frames held back are given with the next look, at once.
        self.ready = bool(self.held)
        if self.ready:
            self.next_poll = now
        return out

    def _beat(self, now: float) -> None:
        """Say in every ring held that this daemon reads it (ring.BEAT_AT: its monotonic time), at
        most every ring.BEAT_EVERY_S: a client whose reader beat lately need not look at the
        reader's marker and process (system calls on the training thread: ring.watch_reader)."""
        self.next_beat = now + ring.BEAT_EVERY_S
        beat = time.monotonic_ns()
        for reader in self.rings.values():
            _U64.pack_into(reader.map, ring.BEAT_AT, beat)

    def _hold_made_after(self, src: int, got: list, first: int, cut_ns: int) -> None:
        """Hold back the frames of `got[first:]` (just read from the ring of `src`) made at or after
        `cut_ns`, the time this look began, until the next look. Their writer may have written
        them after a ring read earlier in this look had been read, and that ring's frames made
        before them (another rank's hello before this rank's step) come only with the next look:
        read by then, since they were in their ring before these were. A frame is held once: the
        next look gives it whatever its time (a writer's clock ahead holds nothing for long). A
        ring's frames are in the order they were made: the held ones are its newest."""
        k = len(got)
        while k > first and _made_at(got[k - 1]) >= cut_ns:
            k -= 1
        if k < len(got):
            self.held[src] = got[k:]
            del got[k:]

    def _read_one(self, reader: Reader, out: list, max_frames: int, max_bytes: int) -> tuple[int, int]:
        """(frames, bytes) read from `reader` into `out`; a broken ring is let go."""
        before = len(out)
        try:
            taken, size = reader.read(out, max_frames, max_bytes)
        except RingBroken as exc:
            self.num_broken += 1
            log.error("rings: the ring of src %d is broken (%s): let go, not read further; what its client "
                      "wrote after is counted lost at its bye", reader.src, exc)
            self.detach(reader.src, remove=False)
            taken, size = len(out) - before, sum(map(len, out[before:]))
        self.num_frames += taken
        self.num_bytes += size
        return taken, size

    def read_all(self, src: int) -> list:
        """Everything the ring of `src` holds (its bye is in hand: the client wrote it all), then
        the ring let go and removed; [] for a src without a ring."""
        out: list = self.held.pop(src, [])
        reader = self.rings.get(src)
        if reader is None and src not in self.skipped:
            reader = self.attach(src)
        if reader is None:
            return out
        while self._read_one(reader, out, CHUNK_FRAMES, 1 << 62)[0] and src in self.rings:
            pass
        if src in self.rings:
            self.detach(src)
        return out

    def before_byes(self, frames: list) -> list:
        """`frames` (read off the socket) with each bye's client's ring read in before it. While
        no ring was ever attached (the clients are remote, or told TELEMETRY_TRANSPORT=zmq) and
        inotify watches the directory, the frames are not looked at (a ring is renamed into place
        before its client's first frame, so its event is read, and the ring attached, by the loop's
        poll before the bye's frames are: Daemon.turn; the drain looks first, ReceiveStage)."""
        if self.fd is None or (not self.num_attached and self.watch_fd is not None):
            return frames
        byes = [i for i, f in enumerate(frames) if f[1:2] == _BYE]
        if not byes:
            return frames
        # Every ring's frames first, merged (a look): a bye read off the socket while the loop was
        # starved comes with its client's whole run in its ring, and another rank's hello made
        # before that run's first step must not come after it.
        out: list = self.read(1 << 62)
        last = 0
        for i in byes:
            h = peek_header(frames[i])
            if h is None or h[0] != KIND_BYE:
                continue
            out.extend(frames[last:i])
            out.extend(self.read_all(h[1]))
            last = i
        out.extend(frames[last:])
        return out

    def drain(self) -> list:
        """Everything every ring holds, the rings looked for once more first (the drain)."""
        if self.fd is None:
            return []
        self.scan()
        held, self.held = self.held, {}
        per_ring = []
        for reader in list(self.rings.values()):
            got = held.pop(reader.src, [])
            while self._read_one(reader, got, CHUNK_FRAMES, 1 << 62)[0] and reader.src in self.rings:
                pass
            if got:
                per_ring.append(got)
        per_ring.extend(held.values())
        # Merged by the time each frame was made, as a look's (read).
        return list(heapq.merge(*per_ring, key=_made_at)) if len(per_ring) > 1 else (per_ring[0] if per_ring else [])

    def stats(self) -> dict:
        return {"held": len(self.rings), "attached": self.num_attached, "frames": self.num_frames,
                "mb": round(self.num_bytes / 2**20, 1), "rings_broken": self.num_broken}
