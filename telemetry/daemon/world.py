"""World: which ranks the daemon waits for before a step is complete.

The ranks of a run are the ranks announced to it: the configured world (`aggregator.world_size`;
a node daemon's slice of the global ranks from `first_rank`), else the range the hellos' WORLD_SIZE
says (`note_size`: the largest a client announced) and every rank that said hello itself
(`announce`: to this daemon, or to one before it on the log directory, as its checkpoint says:
continuity.py). A rank of the world joins the ranks a step waits for once it reports a step (the
range of a world size at once). Only while nothing at all is announced (no --world-size, no
hello, no predecessor's: hand-made frames) are the ranks seen the world, the first
MAX_UNANNOUNCED_RANKS of them; the first announcement ends that, and the ranks seen that it does
not vouch for leave the world.

A rank outside the world is a stranger (a rank no hello announced, or a bogus rank id beyond a
configured world): its records join their steps, but no step waits for it or is incomplete
without it, so a local user who forges records for thousands of ranks over loopback TCP neither
delays a step nor lengthens its missing_ranks. The first MAX_UNANNOUNCED_RANKS strangers are
remembered; a further one's records are refused (the aggregator counts both).

A rank missing from DEAD_AFTER_TIMEOUTS timed-out steps in a row is gone: no longer waited for,
so one dead rank does not delay every later step by the timeout; it is waited for again as soon
as it reports. The Aggregator asks three things on its hot path, precomputed here at every
change: `steady`, the ranks of the world whose record changes nothing here (one set lookup per
record), `expected` with its size, the ranks a step needs to be complete, and, for a rank not
steady, `admit` (is it of the world?).
"""
from __future__ import annotations

# Timed-out steps in a row a rank may miss before the world stops waiting for it.
DEAD_AFTER_TIMEOUTS = 2
# The largest world believed (a configured or announced size, ranks announced): per-rank
# structures and each step's missing_ranks are sized by it.
MAX_WORLD_SIZE = 1 << 16
# Strangers remembered (their records join their steps); a further one's records are refused. Also
# the most ranks seen that make the world while nothing is announced.
MAX_UNANNOUNCED_RANKS = 1024


class World:
    def __init__(self, world_size: int, first_rank: int = 0) -> None:
        self.configured = world_size       # a statement about which ranks exist (0: none)
        self.first_rank = first_rank       # a node daemon waits for its own slice of the global ranks
        self.size_hint = world_size        # the configured size, else the largest a hello said
        self.announced: set[int] = set()   # ranks that said hello (here or to a predecessor)
        self.seen: set[int] = set()
        self.gone: set[int] = set()
        self.strangers: set[int] = set()   # ranks outside the world whose records are taken
        self.misses: dict[int, int] = {}   # rank -> timed-out steps missed in a row
        # Precomputed at every change (_recount): what the hot path reads.
        self.known: set[int] = set()
        self.expected: set[int] = set()
        self.num_expected = 0
        self.steady: set[int] = set()
        self._recount()

    def known_ranks(self) -> set[int]:
        """The ranks of the run: the configured or announced world and every rank of it seen."""
        if not self.size_hint:
            return set(self.seen)
        first = self.first_rank
        return set(range(first, first + self.size_hint)) | self.seen

    def size(self) -> int:
        return self.size_hint or len(self.seen)

    def _recount(self) -> None:
        self.known = self.known_ranks()
        self.expected = self.known - self.gone
        self.num_expected = len(self.expected)
        # Ranks seen, not gone, with no misses pending: a record from one of them changes nothing.
        self.steady = self.seen - self.gone - self.misses.keys()

    def _by_sight(self) -> bool:
        """Nothing announced: the ranks seen are the world."""
        return not self.size_hint and not self.announced

    def _vouched(self, rank: int) -> bool:
        """Whether `rank` is of the world: configured, in an announced range, or announced itself
        (while nothing is announced, any of the first MAX_UNANNOUNCED_RANKS ranks seen)."""
        first = self.first_rank
        if first <= rank < first + self.size_hint:
            return True
        if self.configured:
            return False                   # only a configured world says which ranks exist
        if rank in self.announced:
            return True
        return self._by_sight() and (rank in self.seen or len(self.seen) < MAX_UNANNOUNCED_RANKS)

    def admit(self, rank: int) -> bool | None:
        """For a rank not in `steady`, before its record is added: True, a rank of the world (its
        record counts toward its step); False, a stranger (its record joins its step, which never
        waits for it); None, a stranger beyond the MAX_UNANNOUNCED_RANKS remembered: its record
        is refused. O(1)."""
        if rank in self.strangers:
            return False
        if self._vouched(rank):
            return True
        if len(self.strangers) < MAX_UNANNOUNCED_RANKS:
            self.strangers.add(rank)
            return False
        return None

    def announce(self, rank: int) -> None:
        """`rank` said hello (to this daemon, or to one before it on the log directory): of the
        world. Nothing configured is changed by it."""
        if rank in self.announced or len(self.announced) >= MAX_WORLD_SIZE:
            return
        by_sight = self._by_sight()
        self.announced.add(rank)
        self.strangers.discard(rank)       # its next record is of the world
        if by_sight:
            self._end_by_sight()

    def note_size(self, world_size: int) -> None:
        """A hello's WORLD_SIZE: believed when nothing is configured and it is larger than known."""
        if not self.configured and world_size > self.size_hint:
            by_sight = self._by_sight()
            self.size_hint = world_size
            first = self.first_rank
            self.strangers = {r for r in self.strangers if not first <= r < first + world_size}
            if by_sight:
                self._end_by_sight()
            self._recount()

    def _end_by_sight(self) -> None:
        """The first announcement: the ranks seen that it does not vouch for leave the world (a
        stranger's records that came before any hello no longer hold a step up). Once a run."""
        outside = {r for r in self.seen if not self._vouched(r)}
        if outside:
            self.seen -= outside
            self.gone -= outside
            for r in outside:
                self.misses.pop(r, None)
        self._recount()

    def reported(self, rank: int) -> None:
        """`rank`, of the world (`admit`) and not in `steady`, is done with a step: seen, not gone, no misses."""
        if rank not in self.gone and rank not in self.misses:
            # Not gone, nothing missed: what _recount would give, in place (a head of thousands
            # of nodes sees each one's first step: no walk of the world per node). A rank of an
            # announced (not sized) world seen for the first time joins the known and expected ones.
            self.seen.add(rank)
            if rank not in self.known:
                self.known.add(rank)
                self.expected.add(rank)
                self.num_expected = len(self.expected)
            self.steady.add(rank)
            return
        self.seen.add(rank)
        self.gone.discard(rank)
        self.misses.pop(rank, None)
        self._recount()

    def timed_out(self, ranks: set[int]) -> None:
        """A step timed out with `ranks`: each expected rank not among them missed it."""
        for r in self.expected - ranks:
            n = self.misses[r] = self.misses.get(r, 0) + 1
            if n >= DEAD_AFTER_TIMEOUTS:
                self.gone.add(r)
        self._recount()
