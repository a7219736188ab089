"""Intake: the ingest socket's frames, read ahead of processing into a queue bounded in bytes.

libzmq's receive queue counts messages (`rcvhwm`, per connection), not bytes: a daemon busy with
wide records let a connection's whole rcvhwm of wide frames pile up there (gigabytes; many
ranks' large hellos: hundreds of MB; benchmarks/RESULTS.md, Memory). So every turn the daemon
first reads what libzmq holds (a recv is cheap) into this queue, then processes one batch from
its head. The queue's bytes are bounded by the ingest share of the memory budget
(`memory.Budget.ingest_bytes`); a frame that does not fit is shed at once, the newest first (what
is queued keeps its order), and counted: its header is accounted to its source as arrived
(`Receiver.unread`, so its seq window does not count it lost a second time) and the frame in
`records_shed_at_intake`, part of `records_lost`.
A hello bigger than the daemon keeps anyway (HELLO_INFO_MAX_BYTES) is cut as it is read, from
its encoded form (cut_hello: a small fraction of what decoding a large config costs). Metrics
frames are shed; a rank's hello (cut to its scalars), bye or event may overdraw the share by an
eighth, so that a flood of metrics costs a rank neither its identity nor its final count.
libzmq then holds only what arrives during one turn.

Reading ahead replaces libzmq's back-pressure as the daemon's answer to a backlog: before, a
full connection queue made the client's own send queue fill and the client drop (counted in its
`dropped`). Now the daemon holds up to its share, which for small records is more than libzmq
held (38 MB at the default budget: about 250k frames of 100 bytes against 10,240 a connection),
and sheds beyond it.
"""
from __future__ import annotations

import collections
import functools
import itertools
import time
from typing import Callable

import msgspec
import zmq

from protocol.codec import peek_header
from protocol.constants import KIND_HELLO, KIND_METRICS
from telemetry.daemon.memory import HELLO_INFO_MAX_BYTES, HELLO_INFO_OVER_BUDGET_BYTES, Shed
from telemetry.daemon.rings import RingSet

# The counters' names, the same in status (top level and intake), memory.shed and the daemon record.
SHED_KIND = "records_shed_at_intake"
HELLOS_CUT_KIND = "hellos_cut_at_intake"

# A frame held in the queue costs its bytes plus a bytes object's header (33 B) and its slot in
# the deque (8 B), rounded up.
FRAME_OVERHEAD_BYTES = 48
# One read (loops.read_frames_upto) takes at most READ_CHUNK frames or READ_CHUNK_BYTES (plus one
# frame): what is held at once before it is queued or shed. A turn reads at most
# MAX_READ_PER_TURN frames: reading is cheap but not free, and a turn that only read would keep
# the loop from its timers and control requests. Bytes per turn are not capped: what is not read
# stays in libzmq, unbounded in bytes.
READ_CHUNK = 1024
READ_CHUNK_BYTES = 1 << 20
MAX_READ_PER_TURN = 16 * READ_CHUNK
# Frames other than metrics may overdraw the share by 1/OVERDRAFT_DIVISOR of it (see _admit_some).
OVERDRAFT_DIVISOR = 8
# A hello frame above this (its info could not be kept whole anyway: HELLO_INFO_MAX_BYTES of JSON,
# plus the frame's header) is cut as it is read: 300 ranks starting with 0.86 MB configs then
# queue ~64 KiB each, not 258 MB, and leave the share to the metrics that follow them.
CUT_ABOVE_BYTES = HELLO_INFO_MAX_BYTES + 4096


# A metrics frame begins with one of these: a msgpack array of up to 15 items, then its kind.
_METRICS_HEADS = frozenset(bytes((0x90 + n, KIND_METRICS)) for n in range(16))
# take_rare takes up to this many frames out of the queue one at a time, more by a copy of it.
RARE_REMOVED_ONE_BY_ONE = 64
# scan_cost_s times its test on this many frames.
RARE_SAMPLE = 4096
# take_firsts groups frames by their first bytes unless that makes more groups than this (srcs
# with short encodings, whose first bytes hold the seq too): then by their headers.
MAX_FIRSTS_BY_BYTES = 4096


def _kind(frame: bytes) -> int | None:
    """The record kind from a frame's header (None: no readable header)."""
    h = peek_header(frame)
    return None if h is None else h[0]


class _RawHello(msgspec.Struct, array_like=True):
    """A hello frame with its info's values left encoded (msgspec.Raw): read without building
    them, which for a large config is most of the cost of decoding it (benchmarks/RESULTS.md)."""
    kind: int
    version: int
    src: int
    rank: int
    seq: int
    dropped: int
    t_ns: int
    info: dict[str, msgspec.Raw]


_raw_hello = msgspec.msgpack.Decoder(_RawHello)
_raw_map = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])


def _is_map(raw: msgspec.Raw) -> bool:
    """Whether an encoded value is a msgpack map (fixmap, map 16, map 32)."""
    first = memoryview(raw)[:1].tobytes()
    return bool(first) and (0x80 <= first[0] <= 0x8f or first[0] in (0xde, 0xdf))


def cut_hello(frame: bytes, limit: int) -> bytes | None:
    """The hello frame with its info cut to about `limit` bytes of msgpack: top-level items kept
    in order while they fit, and of a mapping that does not fit (a model config) the items that
    do (its scalars; its big tables go), never deeper; a "_truncated" note names the cut. The
    frame itself when it fits; None when it is no hello this can read (the receiver decides)."""
    if len(frame) <= limit:
        return frame
    try:
        h = _raw_hello.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    note = (f"hello info of {len(frame)} bytes cut to {limit} as it was read (the daemon's memory budget); "
            "see the rank's own config for the rest")
    room = limit - len(note) - 64
    out: dict = {}
    for key, raw in h.info.items():
        n = len(key) + len(raw) + 2
        if n <= room:
            out[key] = raw
            room -= n
        elif room > 64 + len(key) and _is_map(raw):
            try:
                inner = _raw_map.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            part: dict = {}
            left = room - len(key) - 8
            for k, v in inner.items():
                m = len(k) + len(v) + 2
                if m <= left:
                    part[k] = v
                    left -= m
            out[key] = part
            room = left
    out["_truncated"] = note
    return msgspec.msgpack.encode((h.kind, h.version, h.src, h.rank, h.seq, h.dropped, h.t_ns, out))


class Intake:
    """The ingest socket plus its read-ahead queue. fill() each turn, then pop() frames (empty:
    IndexError) and taken() what was popped, so that the queue's byte count stays exact."""

    def __init__(self, sock: zmq.Socket, max_bytes: int, read_frames: Callable,
                 unread: Callable[[list], None], recv: Callable[[], bytes] | None = None,
                 shed: Shed | None = None, rings: "RingSet | None" = None) -> None:
        self.max_bytes = max_bytes
        # The local clients' record rings (rings.py): read after the socket, while the queue has room.
        self.rings = rings
        self._read_frames = read_frames        # loops.read_frames_upto or its C twin
        self._unread = unread                  # Receiver.unread_headers: account shed frames
        self._shed = shed if shed is not None else Shed()   # the memory budget's count of what is shed
        self._q: collections.deque[bytes] = collections.deque()
        self.pop = self._q.popleft
        self.num_bytes = 0                     # held now, with FRAME_OVERHEAD_BYTES each
        self.peak_bytes = 0
        self.num_shed = 0                      # frames shed (records_shed_at_intake)
        self.num_hellos_cut = 0                # hellos queued with their info cut (big, or beyond the share)
        self.bytes_shed = 0
        # A C call, no Python frame per frame; on a head whose node links are CURVE, the check of
        # which node each frame speaks as (security.identity.NodeGuard.recv), same contract.
        self._recv = recv or functools.partial(sock.recv, zmq.NOBLOCK)

    def __len__(self) -> int:
        return len(self._q)

    def fill(self) -> int:
        """Read what libzmq holds, up to MAX_READ_PER_TURN frames; cut big hellos; shed what does
        not fit. Returns how many frames were read."""
        read = 0
        rings = self.rings
        while read < MAX_READ_PER_TURN:
            frames, size = self._read_frames(self._recv, zmq.Again, READ_CHUNK, READ_CHUNK_BYTES)
            if not frames:
                break
            read += len(frames)
            if rings is not None:
                # A bye's client's ring read in before it (the client wrote it all before the bye).
                with_rings = rings.before_byes(frames)
                if with_rings is not frames:
                    frames, size = with_rings, sum(map(len, with_rings))
            self._queue(frames, size)
        if rings is not None and (rings.ready or rings.due(time.monotonic())):
            frames = rings.read(max(0, self.max_bytes - self.num_bytes))
            if frames:
                read += len(frames)
                self._queue(frames, sum(map(len, frames)))
        if self.num_bytes > self.peak_bytes:
            self.peak_bytes = self.num_bytes
        return read

    def fill_rings_to_end(self) -> int:
        """Every frame the rings hold, queued (the drain: what is not processed is counted)."""
        if self.rings is None:
            return 0
        frames = self.rings.drain()
        if frames:
            self._queue(frames, sum(map(len, frames)))
        return len(frames)

    def _queue(self, frames: list, size: int) -> None:
        """Frames read, queued in order: big hellos cut, what does not fit shed (_admit_some)."""
        if size > CUT_ABOVE_BYTES and max(map(len, frames)) > CUT_ABOVE_BYTES:
            frames = [self._cut_hello(f, HELLO_INFO_MAX_BYTES) if len(f) > CUT_ABOVE_BYTES else f
                      for f in frames]
            size = sum(map(len, frames))
        size += FRAME_OVERHEAD_BYTES * len(frames)
        if self.num_bytes + size <= self.max_bytes:
            self._q.extend(frames)
            self.num_bytes += size
        else:
            self._admit_some(frames)

    def _admit_some(self, frames: list) -> None:
        """The frames that still fit, in order; the rest shed and accounted. A frame other than
        metrics (a rank's hello, bye or event) may overdraw the share by an OVERDRAFT_DIVISOR-th,
        a hello cut to its scalars first, so that a rank keeps its identity and its final count
        when metrics are shed."""
        room = self.max_bytes - self.num_bytes
        overdraft = self.max_bytes // OVERDRAFT_DIVISOR
        shed = []                 # their headers, read once (peek_header)
        for frame in frames:
            cost = len(frame) + FRAME_OVERHEAD_BYTES
            if cost <= room or not self._q:          # an empty queue always takes one frame
                self._q.append(frame)
                room -= cost
                continue
            h = peek_header(frame)
            if h is not None and h[0] != KIND_METRICS:
                kept = self._cut_hello(frame, HELLO_INFO_OVER_BUDGET_BYTES) if h[0] == KIND_HELLO else frame
                if len(kept) + FRAME_OVERHEAD_BYTES <= room + overdraft:
                    self._q.append(kept)
                    room -= len(kept) + FRAME_OVERHEAD_BYTES
                    continue
            shed.append(h)
            self.bytes_shed += len(frame)
        self.num_bytes = self.max_bytes - room
        if shed:
            self.num_shed += len(shed)
            self._shed.add(SHED_KIND, len(shed), "frames beyond the ingest share, read ahead of a busy pipeline, "
                           "are shed (and counted lost)")
            self._unread(shed)

    def _cut_hello(self, frame: bytes, limit: int) -> bytes:
        """A hello frame re-encoded with its info cut to about `limit` bytes (cut_hello), counted
        in num_hellos_cut; any other frame (a wide metrics record, an event, a hello that is no
        valid record: the receiver refuses it) unchanged."""
        if _kind(frame) != KIND_HELLO:
            return frame
        out = cut_hello(frame, limit)
        if out is None or out is frame:
            return frame
        self.num_hellos_cut += 1
        self._shed.add(HELLOS_CUT_KIND, 1, "hellos with an info bigger than is kept (64 KiB of JSON) are cut as "
                       "they are read, to their scalars when beyond the ingest share")
        return out

    def taken(self, num_frames: int, num_bytes: int) -> None:
        """`num_frames` frames of `num_bytes` (their lengths) were popped."""
        self.num_bytes -= num_bytes + FRAME_OVERHEAD_BYTES * num_frames

    def take_all(self) -> list:
        """Everything queued (the drain counts what it cannot process)."""
        frames = list(self._q)
        self._q.clear()
        self.num_bytes = 0
        return frames

    def take_firsts(self) -> list:
        """The first queued frame of each source, out of the queue (by the bytes that follow the
        kind: version and src; a src below 2^32, which no client draws, by its header read
        whole). A client's frames are queued in the order it sent them, so these
        hold each source's lowest seq in the queue: a drain that counts them first, and may leave
        the rest uncounted, still has every client's seq window start where it should (the
        rest lies inside it: lost in transit once the bye closes it)."""
        q = self._q
        firsts = {f[2:12]: f for f in reversed(q)}
        if len(firsts) > MAX_FIRSTS_BY_BYTES:
            firsts = {}
            for f in reversed(q):
                h = peek_header(f)
                firsts[f[2:12] if h is None else h[1]] = f
        out = list(firsts.values())
        if len(out) <= RARE_REMOVED_ONE_BY_ONE:
            for f in out:
                q.remove(f)
        else:
            chosen = set(map(id, out))
            kept = [f for f in q if id(f) not in chosen]
            q.clear()
            q.extend(kept)
        self.num_bytes -= sum(map(len, out)) + FRAME_OVERHEAD_BYTES * len(out)
        return out

    def take_batch(self, max_frames: int) -> tuple[list, int]:
        """The daemon's batch: up to `max_frames` frames from the head of the queue, and their
        lengths' sum."""
        q = self._q
        if max_frames >= len(q):
            frames = list(q)
            q.clear()
        else:
            popleft = q.popleft
            frames = [popleft() for _ in range(max_frames)]
        num_bytes = sum(map(len, frames))
        self.num_bytes -= num_bytes + FRAME_OVERHEAD_BYTES * len(frames)
        return frames, num_bytes

    def take(self, max_frames: int) -> list:
        """Up to `max_frames` frames from the head of the queue (the drain counts what it cannot
        process a bounded batch at a time, so that it sees its deadline between batches)."""
        if max_frames >= len(self._q):
            return self.take_all()
        frames = [self._q.popleft() for _ in range(max_frames)]
        self.taken(len(frames), sum(map(len, frames)))
        return frames

    def take_rare(self) -> list:
        """The queued frames that are not plainly metrics records (by their first two bytes: a
        short msgpack array whose kind is metrics), out of the queue, which keeps the rest in
        order: the byes among them close their clients' accounting, so a drain that cannot
        count the whole backlog in time finds them first (two bytes looked at a frame)."""
        q = self._q
        try:
            rare = [f for f in q if f[1] != KIND_METRICS or f[0] >> 4 != 0x9]
        except IndexError:        # a frame shorter than two bytes: no record at all
            rare = [f for f in q if f[:2] not in _METRICS_HEADS]
        if len(rare) <= RARE_REMOVED_ONE_BY_ONE:
            for f in rare:            # a few byes: found by identity, no copy of the queue
                q.remove(f)
        else:
            kept = [f for f in q if f[:2] in _METRICS_HEADS]
            q.clear()
            q.extend(kept)
        self.num_bytes -= sum(map(len, rare)) + FRAME_OVERHEAD_BYTES * len(rare)
        return rare

    def scan_cost_s(self, sample: int = RARE_SAMPLE) -> float:
        """What looking over one queued frame costs now (take_rare's test and take_firsts'
        grouping, timed on up to `sample` frames at the head of the queue): the drain's estimate
        of its own scans."""
        frames = list(itertools.islice(self._q, sample))
        if not frames:
            return 0.0
        t0 = time.perf_counter()
        [f for f in frames if f[:2] not in _METRICS_HEADS]
        {f[2:12]: f for f in reversed(frames)}
        return (time.perf_counter() - t0) / len(frames)

    def stats(self) -> dict:
        return {"queued": len(self._q), "held_mb": round(self.num_bytes / 2**20, 1),
                "peak_mb": round(self.peak_bytes / 2**20, 1), "max_mb": round(self.max_bytes / 2**20, 1),
                SHED_KIND: self.num_shed, "shed_mb": round(self.bytes_shed / 2**20, 1),
                HELLOS_CUT_KIND: self.num_hellos_cut}
