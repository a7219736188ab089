"""Receiver: decodes and validates frames from the PULL socket and keeps the loss accounting.

Per client instance (`src`): records received, the lowest and highest sequence numbers seen
and the client's own cumulative drop count. Loss is exact even when records arrive out of order
(deferred tensor records): a src whose records min..max reached this daemon `received` times
lost (max - min + 1 - received), of which the client counted (dropped - dropped as of min)
itself and the rest vanished in transit (a daemon killed with records in its queue). A fresh
client starts at seq 0, so min is 0 for it; a daemon restarted mid-run accounts from the first
record it sees of each surviving client, never for what its predecessor received.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import msgpack
import msgspec

from protocol import Bye, Event, Hello, MalformedRecord, Metrics
from protocol.clean import clean
from protocol.codec import check_names, decode_header, decoder_parts, peek_headers
from protocol.constants import KIND_BYE, KIND_METRICS, MAX_NAME_CHARS, MAX_PARTS, MAX_RANK, MAX_VALUES
from telemetry.daemon import hotpath
from telemetry.daemon import loops as python_loops
from telemetry.shared.numbers import is_int

log = logging.getLogger("telemetry.receiver")

# Sources (client instances) whose loss is accounted: a run has a few per rank (restarts,
# forks). Beyond this (a flood of fake src ids cost hundreds of MB and a slow status before this
# bound: benchmarks/RESULTS.md, Memory), a new src's records
# are still taken in but counted in records_untracked instead of being loss-accounted.
MAX_SOURCES = 1 << 16
# The most records one batch may add to a source's loss (dropped by the client or vanished): a
# seq that jumps further (a seq of 2^63-1, with or without a drop count to match) is not
# believed, and counted in records_seq_bogus, instead of making records_lost 9.2e18. A real
# client losing 16M records between two that arrive would be stalled for hours.
MAX_SEQ_GAP = 1 << 24
# Marks of each source's progress kept (one a second): a source that moved within them is one a
# drain waits for (a rank that paused a few seconds, descheduled on a loaded box, is still live).
LIVE_MARKS = 3

# The bounds of a metrics record's header and body (protocol/records.py), for loops.decode_frames.
_METRICS_LIMITS = (MAX_RANK, MAX_VALUES, MAX_PARTS)

# The free-form map of each rare kind (see protocol.clean).
_FREE_FORM = {Hello: "info", Event: "data", Bye: "stats"}

# Why a metrics value is refused alone (values_refused's reasons): by the value's type as msgpack
# decodes it (a tuple arrives as a list); "name" is a name that is not 1..MAX_NAME_CHARS characters
# of text; "other" anything else (bytes, an ext type).
_VALUE_REASONS = {str: "text", dict: "map", list: "list"}
_NUMBER_TYPES = (float, int, bool, type(None))


@dataclass(slots=True)
class SourceStats:
    rank: int
    min_seq: int
    dropped_at_min: int       # the client's drop count when it sent record min_seq
    received: int = 0
    max_seq: int = -1
    dropped: int = 0          # the client's own count (in-band, cumulative)
    refused: int = 0          # records of this src that arrived but were not taken: malformed,
                              # or left unread at the drain deadline (counted apart, not as lost)
    earlier: int = 0          # records that arrived at a predecessor daemon (restore)
    bye: bool = False         # its bye arrived: max_seq is final, its accounting is closed
    hello: bool = False       # it said hello: a client (TelemetryClient) that says bye at close
    arrived_at_mark: int = -1  # received + refused at the last mark_progress (-1: none yet)
    moved_at: int = 0         # the number of the last mark at which it had moved

    def lost(self) -> int:
        return max(0, self.max_seq - self.min_seq + 1 - self.received - self.refused - self.earlier)

    def dropped_in_window(self) -> int:
        """What the client says it dropped in the window: never more than the window lost
        (a client cannot drop what it did not send; a bogus drop count is not believed)."""
        return min(max(0, self.dropped - self.dropped_at_min), self.lost())

    def transit(self) -> int:
        return self.lost() - self.dropped_in_window()


def tally_headers(headers: list) -> tuple[list, list[int]]:
    """Frames' headers (peek_header's tuples; None: no header, skipped) as the receiver accounts
    them: one row per source (src, rank, count, min_seq, dropped_at_min, max_seq, max_dropped),
    as tally makes for decoded records, and the srcs of the byes among them. One pass and
    one row a source, not one a frame: a drain counts what it cannot process at the cost of
    reading the headers."""
    per_src: dict[int, list] = {}
    get = per_src.get
    byes = []
    for h in headers:
        if h is None:
            continue
        kind, src, rank, seq, dropped = h
        row = get(src)
        if row is None:
            per_src[src] = [src, rank, 1, seq, dropped, seq, dropped]
        else:
            row[2] += 1
            if seq < row[3]:
                row[3], row[4] = seq, dropped
            elif seq > row[5]:
                row[5] = seq
            if dropped > row[6]:
                row[6] = dropped
        if kind == KIND_BYE:
            byes.append(src)
    return list(per_src.values()), byes


def _value_reason(name, value) -> str | None:
    """Why a metrics value is refused alone (_VALUE_REASONS), or None: it is taken."""
    if type(name) is not str or not 0 < len(name) <= MAX_NAME_CHARS:
        return "name"
    if type(value) in _NUMBER_TYPES:
        return None
    return _VALUE_REASONS.get(type(value), "other")


class Receiver:
    def __init__(self, loops=hotpath.loops, names=None) -> None:
        """names: a memory.NameCatalogue (new metric names beyond its cap are shed), or None."""
        self.loops = loops          # loops.py or its C twin (hotpath.loops); same results: the intake's
                                    # read_frames_upto and tally, and `status` says which
        self.sources: dict[int, SourceStats] = {}
        self.num_in = 0
        self.num_malformed = 0
        self.num_byes = 0
        self.num_keys_coerced = 0   # rare records whose non-str map keys were turned into text
        self.num_untracked = 0      # records of sources beyond MAX_SOURCES (not loss-accounted)
        self.num_seq_bogus = 0      # batches whose seq jump was not believed (MAX_SEQ_GAP)
        # Metrics values refused alone, by reason (_VALUE_REASONS): the rest of their record taken.
        self.values_refused: dict[str, int] = {}
        self._refused_rows: list[tuple] = []   # malformed frames' headers: received all the same
        self.had_predecessor = False   # restore()d: a daemon ran on this log directory before
        self.restored: set[int] = set()   # the sources restore()d (a predecessor's clients)
        self.names = names
        self.batch_bytes = 0           # the last batch's frames, in bytes (the memory budget's measure)
        self._mark_no = 0             # marks of progress taken (mark_progress), for open_live
        self._names_cache: list = []   # loops.decode_frames' names of the last record read

    def accept(self, frames: list, num_bytes: int) -> tuple[list, bool]:
        """Decode, validate and account a batch of frames (bounded by the socket's MAXMSGSIZE;
        `num_bytes`: their lengths' sum). Returns the valid records in order and whether they
        are all metrics records. The daemon's hot path: decoded in one loop, accounted in one
        call (loops.tally or its C twin)."""
        self.batch_bytes = num_bytes
        malformed_before = self.num_malformed
        try:
            recs, all_metrics, num_byes, per_src = self._check(frames)
        except Exception as exc:   # the last resort (nothing known reaches it): count, go on
            self.num_malformed = malformed_before + len(frames)
            log.error("a batch of %d frames raised %r in the receiver; counted as malformed",
                      len(frames), exc, exc_info=exc)
            return [], True
        self._account(per_src)
        if self._refused_rows:
            self._account(self._refused_rows, refused=True)
            self._refused_rows = []
        self.num_byes += num_byes
        self.num_in += len(recs)
        return recs, all_metrics

    def take(self, next_frame: Callable[[], bytes], empty: type[BaseException],
             max_frames: int) -> tuple[list, bool, int]:
        """`accept` for up to `max_frames` frames read with next_frame() (until it raises
        `empty`): (records, all metrics?, frames read). For frames that are not in a list
        already (tests, benchmarks); the daemon's receiver stage hands `accept` its batch."""
        frames = []
        for _ in range(max_frames):
            try:
                frames.append(next_frame())
            except empty:
                break
        recs, all_metrics = self.accept(frames, sum(map(len, frames)))
        return recs, all_metrics, len(frames)

    def loops_name(self) -> str:
        """Which inner loops this receiver runs: "python" (loops.py) or "c" (hotpath.py)."""
        return "python" if self.loops is python_loops else "c"

    def unread(self, frames: list) -> None:
        """Frames read off the socket but never processed (the drain deadline, or shed at intake:
        intake.Intake): each well-formed
        header counts as arrived for its src, like a refused record, so that its seq window
        does not count it lost a second time (the caller counts these frames as lost once,
        in records_unread_at_drain), whether or not the src's bye was processed before them."""
        self.unread_headers(peek_headers(frames))

    def unread_headers(self, headers: list) -> None:
        """`unread` for frames whose headers were already read (protocol.codec.peek_header; None
        for a frame without one: nothing to account it to, counted lost by the caller)."""
        rows, byes = tally_headers(headers)
        self._account(rows, refused=True)
        for src in byes:
            self.note_bye(src)

    def note_hello(self, src_id: int) -> None:
        src = self.sources.get(src_id)
        if src is not None:
            src.hello = True

    def note_bye(self, src_id: int) -> None:
        """The source's bye arrived (processed or only counted): its seq window is complete."""
        src = self.sources.get(src_id)
        if src is not None:
            src.bye = True

    def add_unseen(self, src_id: int, rank: int, next_seq: int) -> int | None:
        """A client that ended before any record of it arrived (its page: client_page.py): every
        seq it took is lost. Returns how many (None: no room for another source, or a page too
        far ahead to believe)."""
        if len(self.sources) >= MAX_SOURCES or next_seq == 0:    # 0: made, then killed before a record
            return None
        if not 0 <= rank <= MAX_RANK or not 0 < next_seq <= MAX_SEQ_GAP:
            self._not_believed(src_id, rank, next_seq)
            return None
        self.sources[src_id] = SourceStats(rank, 0, 0, 0, next_seq - 1, 0, bye=True)
        return next_seq

    def end_by_page(self, src_id: int, next_seq: int) -> int | None:
        """A client whose process ended without a bye, or that closed with a bye this daemon
        never read: its page's next seq stands for the bye's (telemetry/shared/client_page.py),
        so every seq it took and this daemon never counted is lost. Returns how many seqs that
        adds past the last one that arrived; None for a page not believed (further ahead than
        any real client's, counted in records_seq_bogus): the client stays as it was."""
        src = self.sources[src_id]
        tail = next_seq - 1 - src.max_seq
        if tail > MAX_SEQ_GAP:          # no page of a real client is that far ahead of its records
            self._not_believed(src_id, src.rank, next_seq)
            return None
        src.bye = True
        if tail <= 0:
            return 0
        src.max_seq = next_seq - 1
        return tail

    def _not_believed(self, src_id: int, rank: int, next_seq: int) -> None:
        self.num_seq_bogus += 1
        log.warning("src %d (rank %d): its seq page says %d records, past what any client makes unseen: "
                    "not believed (counted in records_seq_bogus)", src_id, rank, next_seq)

    def mark_progress(self) -> None:
        """Note which open sources moved since the last mark; called about once a second
        (CHECKPOINT_INTERVAL_S in the daemon), off the ingest path."""
        self._mark_no = n = self._mark_no + 1
        for s in self.sources.values():
            if not s.bye:
                arrived = s.received + s.refused
                if arrived != s.arrived_at_mark:
                    s.arrived_at_mark, s.moved_at = arrived, n

    def open_live(self, hello_only: bool = True) -> set[int]:
        """The clients (sources that said hello: a TelemetryClient says bye at close) without a
        bye that moved within the last LIVE_MARKS marks (seconds) or since the last: clients still
        sending, whose bye a drain waits for. A source long silent (a rank killed without a bye)
        is not waited for, nor, with `hello_only`, one that never said hello (hand-made frames,
        or a client told not to: its bye may or may not come)."""
        since = self._mark_no - LIVE_MARKS
        return {i for i, s in self.sources.items() if (s.hello or not hello_only) and not s.bye
                and (s.moved_at > since or s.received + s.refused != s.arrived_at_mark)}

    def open_clients(self) -> set[int]:
        """Every client whose final count is not known: without a bye, and a client (it said
        hello) or a predecessor's (restored): what per_rank counts `open`, less the sources that
        never said hello here (a bare sender, which says no bye)."""
        restored = self.restored
        return {i for i, s in self.sources.items() if not s.bye and (s.hello or i in restored)}

    def still_open(self, src_ids: set[int]) -> set[int]:
        sources = self.sources
        return {i for i in src_ids if i in sources and not sources[i].bye}

    def _check(self, frames: list) -> tuple[list, bool, int, list]:
        """Decode and validate a batch of frames: (records, all metrics?, byes, per-src tally)."""
        decode, errors, good_names = decoder_parts()
        try:
            recs = self.loops.decode_frames(frames, decode, Metrics, _METRICS_LIMITS, self._names_cache)
        except errors:                      # a malformed frame: decode one at a time
            recs = self._decode_each(frames, decode, errors)
        all_metrics, num_byes, per_src, unknown = self.loops.tally(recs, Metrics, Bye, good_names)
        bad: set[int] = set()
        if not all_metrics:                 # hellos, events, byes: their free-form maps made writable
            self._clean_rare(recs, bad)
        if unknown or bad:
            for i in unknown:               # key sets seen for the first time: check their names
                try:
                    keys = check_names(tuple(recs[i].values))
                except MalformedRecord:     # a name too long or empty: that value refused alone
                    recs[i] = self._drop_bad_names(recs[i])
                    keys = check_names(tuple(recs[i].values))
                kept = self.names.admit(recs[i].values) if self.names is not None else None
                if kept is not None:        # names beyond the catalogue's cap: their values shed
                    good_names.pop(keys, None)   # so the next record with this key set is cut too
                    recs[i] = msgspec.structs.replace(recs[i], values=kept)
            if bad:
                recs = [rec for i, rec in enumerate(recs) if i not in bad]
                all_metrics, num_byes, per_src, _ = self.loops.tally(recs, Metrics, Bye, good_names)
        return recs, all_metrics, num_byes, per_src

    def _clean_rare(self, recs: list, bad: set[int]) -> None:
        """Every map key in a hello's info, an event's data, a bye's stats a str (protocol.clean),
        in place in `recs`; the index of a record nested too deep for that goes into `bad`."""
        for i, rec in enumerate(recs):
            kind = type(rec)
            if kind is Metrics:
                continue
            field = _FREE_FORM[kind]
            value = getattr(rec, field)
            try:
                cleaned = clean(value)
            except RecursionError as exc:
                self._reject(exc)
                bad.add(i)
                continue
            if cleaned is not value:
                self.num_keys_coerced += 1
                recs[i] = msgspec.structs.replace(rec, **{field: cleaned})

    def _decode_each(self, frames: list, decode: Callable, errors: tuple) -> list:
        recs = []
        for frame in frames:
            try:
                recs.append(decode(frame))
            except errors as exc:
                rec = self._salvage(frame, decode)
                if rec is not None:
                    recs.append(rec)
                    continue
                self._reject(exc)
                header = decode_header(frame)
                if header is not None:     # received from its src: refused once, not also lost
                    src, rank, seq, dropped = header
                    self._refused_rows.append((src, rank, 1, seq, dropped, seq, dropped))
        return recs

    def _salvage(self, frame: bytes, decode: Callable):
        """A metrics frame refused only for some of its values (text, a map, a list, a name too
        long): the record without them, those counted by reason; None for any other refused frame.
        Runs only on the failure path: a frame decoded again untyped, its good values encoded and
        decoded again with the same typed decoder, so what is taken is what a good frame gives."""
        try:                        # msgpack's unpacker: it reads as deep as the client's packer writes
            raw = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        except Exception:           # not msgpack, invalid UTF-8, an unhashable key: malformed
            return None
        if type(raw) is not list or len(raw) < 9 or raw[0] != KIND_METRICS or type(raw[8]) is not dict:
            return None
        kept, refused = {}, []
        for name, value in raw[8].items():
            reason = _value_reason(name, value)
            if reason is None:
                kept[name] = value
            else:
                refused.append((name, reason))
        if not refused:             # its values were not the trouble: the record is malformed
            return None
        raw[8] = kept
        try:
            rec = decode(msgpack.packb(raw, use_bin_type=True))
        except Exception:           # the header or the step is bad too
            return None
        self._count_refused(rec, refused)
        return rec

    def _drop_bad_names(self, rec: Metrics) -> Metrics:
        """`rec` without its values whose names are not 1..MAX_NAME_CHARS characters (counted)."""
        kept, refused = {}, []
        for name, value in rec.values.items():
            if 0 < len(name) <= MAX_NAME_CHARS:
                kept[name] = value
            else:
                refused.append((name, "name"))
        self._count_refused(rec, refused)
        return msgspec.structs.replace(rec, values=kept)

    def _count_refused(self, rec: Metrics, refused: list) -> None:
        """Count values refused alone; the first of each reason is named in the log."""
        counts = self.values_refused
        for name, reason in refused:
            n = counts.get(reason, 0)
            counts[reason] = n + 1
            if n == 0:
                shown = repr(name)
                shown = shown if len(shown) <= 80 else shown[:60] + f"... ({len(name)} characters)"
                log.warning("refused value %s of rank %d at step %d: %s; the rest of its record taken "
                            "(counted in values_refused)", shown, rec.rank, rec.step,
                            "a name of 1..%d characters wanted" % MAX_NAME_CHARS if reason == "name"
                            else f"{reason} is not a number")

    def _account(self, per_src: list, refused: bool = False) -> None:
        """Fold a batch's per-source tally into the running accounting (refused: the rows are
        malformed records' headers: they arrived, so they are no loss, but not received)."""
        sources = self.sources
        for src_id, rank, count, min_seq, dropped_at_min, max_seq, dropped in per_src:
            src = sources.get(src_id)
            if src is None:
                if len(sources) >= MAX_SOURCES:
                    self.num_untracked += count
                    continue
                if self.had_predecessor and min_seq > 0:
                    min_seq = dropped_at_min = 0   # its first records went to the dead daemon
                src = sources[src_id] = SourceStats(rank, min_seq, dropped_at_min, 0, max_seq, dropped)
                if refused:
                    src.refused = count
                else:
                    src.received = count
                if src.lost() > MAX_SEQ_GAP:
                    self._bogus_seq(src, src_id, min_seq, dropped_at_min, min_seq + count - 1)
                continue
            # The window grows by `grow` seqs, so its loss by at most that: only a growth past
            # MAX_SEQ_GAP needs the loss before and after (a head folds a row a node a batch).
            grow = (max_seq - src.max_seq if max_seq > src.max_seq else 0) + \
                (src.min_seq - min_seq if min_seq < src.min_seq else 0)
            before = (src.min_seq, src.dropped_at_min, src.max_seq, src.lost()) if grow > MAX_SEQ_GAP else None
            if refused:
                src.refused += count
            else:
                src.received += count
            if max_seq > src.max_seq:
                src.max_seq = max_seq
            if min_seq < src.min_seq:
                src.min_seq = min_seq
                src.dropped_at_min = dropped_at_min
            if dropped > src.dropped:
                src.dropped = dropped
            if before is not None and src.lost() - before[3] > MAX_SEQ_GAP:
                self._bogus_seq(src, src_id, *before[:3])

    # -- across a restart --------------------------------------------------------------------------
    def snapshot(self, held: dict[int, int] | None = None) -> dict:
        """The per-source accounting, for `restore` in a daemon that follows this one on the same
        log directory (sources.json, beside metrics.jsonl: see continuity.py). `held`: records
        per source taken in but in no output record yet (open steps): not counted as arrived, so
        that a successor counts them lost if this daemon dies with them. `ended`: the sources
        whose bye arrived (their window final), a key a daemon that does not know it ignores."""
        held = held or {}
        return {"version": 1, "sources": [[src_id, s.rank, s.min_seq, s.dropped_at_min,
                                           s.received + s.refused + s.earlier - held.get(src_id, 0), s.max_seq,
                                           s.dropped] for src_id, s in self.sources.items()],
                "ended": [src_id for src_id, s in self.sources.items() if s.bye]}

    def restore(self, snap: dict) -> int:
        """Continue a predecessor's accounting (see `snapshot`): a client that outlived the
        daemon it sent to keeps its seq window, so what the dead daemon had accepted but not
        checkpointed, and what vanished with it, is counted lost once the client's next record
        (or bye) arrives. A client first seen now with seq > 0 is accounted from seq 0 (its
        earlier records went to the predecessor after its last checkpoint). Returns how many
        sources were restored; a snapshot that does not parse is ignored."""
        rows = snap.get("sources") if isinstance(snap, dict) and snap.get("version") == 1 else None
        if not isinstance(rows, list):
            return 0
        refused = 0
        for row in rows[:MAX_SOURCES]:
            if (not isinstance(row, list) or len(row) != 7
                    or not all(is_int(x) and -1 <= x < 1 << 63 for x in row)):
                refused += 1
                continue
            src_id, rank, min_seq, dropped_at_min, arrived, max_seq, dropped = row
            src = SourceStats(rank, min_seq, dropped_at_min, 0, max_seq, dropped, earlier=arrived)
            # What no daemon writes: a rank out of range, a source twice, more arrived than its
            # window holds, a loss in transit larger than the live path believes of one batch.
            if (not 0 <= rank <= MAX_RANK or src_id in self.sources or max_seq < min_seq - 1
                    or arrived > max_seq - min_seq + 1 or src.transit() > MAX_SEQ_GAP):
                refused += 1
                continue
            self.sources[src_id] = src
            self.restored.add(src_id)
        if refused or len(rows) > MAX_SOURCES:
            log.warning("sources.json: %d row(s) not believed (not what a daemon writes); those clients are "
                        "accounted from their next record", refused + max(0, len(rows) - MAX_SOURCES))
        ended = snap.get("ended")
        for src_id in ended[:MAX_SOURCES] if isinstance(ended, list) else ():
            src = self.sources.get(src_id) if is_int(src_id) else None
            if src is not None:        # its bye came before the checkpoint: not open, nothing to wait for
                src.bye = True
        self.had_predecessor = True
        # As they were: a restored client is live at a drain only if it sends again (open_live).
        for src in self.sources.values():
            src.arrived_at_mark, src.moved_at = 0, self._mark_no - LIVE_MARKS
        return len(self.sources)

    def _bogus_seq(self, src: SourceStats, src_id: int, min_seq: int, dropped_at_min: int, max_seq: int) -> None:
        """A batch moved a source's seq window further than any real loss would: keep the
        window as it was (the records still count as received), count it, warn once."""
        src.min_seq, src.dropped_at_min, src.max_seq = min_seq, dropped_at_min, max(max_seq, min_seq - 1)
        self.num_seq_bogus += 1
        if self.num_seq_bogus == 1:
            log.warning("src %d (rank %d) jumped its seq by more than %d records: "
                        "not believed (counted in records_seq_bogus)", src_id, src.rank, MAX_SEQ_GAP)

    def _reject(self, exc: Exception) -> None:
        if isinstance(exc, RecursionError):   # deeply nested maps/arrays inside an event's data
            exc = MalformedRecord("nesting too deep")
        self.num_malformed += 1
        if self.num_malformed == 1 or self.num_malformed % 10_000 == 0:  # never log per item
            log.warning("rejected malformed record (%d so far): %s", self.num_malformed, exc)

    def totals(self) -> dict:
        lost = dropped = transit = earlier = 0
        for s in self.sources.values():
            n_lost, n_dropped = s.lost(), s.dropped_in_window()
            lost += n_lost
            dropped += n_dropped
            transit += n_lost - n_dropped
            earlier += s.earlier
        return {
            "records_in": self.num_in,
            # What the clients this daemon continues (sources.json) had sent to the daemons before
            # it on this log directory, as their last checkpoint said: records_in + this is the run's.
            "records_in_earlier_daemons": earlier,
            "records_malformed": self.num_malformed,
            "records_dropped_by_clients": dropped,
            # Counted by no one: sent (seq assigned, not dropped by the client) and never received.
            "records_lost_in_transit": transit,
            "records_lost": lost,
            "num_sources": len(self.sources),
            "records_untracked": self.num_untracked,
            "records_seq_bogus": self.num_seq_bogus,
            "values_refused": sum(self.values_refused.values()),
        }

    def per_rank(self) -> dict[int, dict]:
        """Per rank: received (taken in), refused (arrived, not taken: malformed, or only counted
        at the drain), lost (of which dropped_by_client; the rest in transit), sources, and
        open (sources whose bye has not arrived: their final count is not known); earlier: what
        its sources had sent to the daemons before this one on the log directory, as their last
        checkpoint counted it (received + refused + earlier + lost: all the rank sent)."""
        out: dict[int, dict] = {}
        for s in self.sources.values():
            r = out.setdefault(s.rank, {"received": 0, "refused": 0, "lost": 0, "dropped_by_client": 0,
                                        "sources": 0, "open": 0, "earlier": 0})
            r["earlier"] += s.earlier
            r["received"] += s.received
            r["refused"] += s.refused
            r["open"] += not s.bye
            r["lost"] += s.lost()
            r["dropped_by_client"] += s.dropped_in_window()
            r["sources"] += 1
        return out


