"""World: which ranks the daemon waits for before a step is complete.

The ranks of a run are the configured world (`aggregator.world_size`; a node daemon's slice of
the global ranks from `first_rank`), else those the hellos say (`note_size`: the largest
WORLD_SIZE a client announced, a hint the ranks themselves overrule), and every rank that has
reported a step. A rank outside a configured world is a stranger (a bogus rank id): its records
join their steps, but no step waits for it or is incomplete without it.

A rank missing from DEAD_AFTER_TIMEOUTS timed-out steps in a row is gone: no longer waited for,
so one dead rank does not delay every later step by the timeout; it is waited for again as soon
as it reports. The Aggregator asks two things on its hot path, precomputed here at every
change: `steady`, the ranks whose record changes nothing here (one set lookup per record), and
`expected` with its size, the ranks a step needs to be complete.
"""
from __future__ import annotations

# Timed-out steps in a row a rank may miss before the world stops waiting for it.
DEAD_AFTER_TIMEOUTS = 2


class World:
    def __init__(self, world_size: int, first_rank: int = 0) -> None:
        self.configured = world_size       # a statement about which ranks exist (0: none)
        self.first_rank = first_rank       # a node daemon waits for its own slice of the global ranks
        self.size_hint = world_size        # the configured size, else the largest a hello said
        self.seen: set[int] = set()
        self.gone: set[int] = set()
        self.strangers: set[int] = set()
        self.misses: dict[int, int] = {}   # rank -> timed-out steps missed in a row
        # Precomputed at every change (_recount): what the hot path reads.
        self.known: set[int] = set()
        self.expected: set[int] = set()
        self.num_expected = 0
        self.steady: set[int] = set()
        self._recount()

    def known_ranks(self) -> set[int]:
        """The ranks of the run: the configured or announced world and every rank seen."""
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
        self.steady = (self.seen - self.gone - self.misses.keys()) | self.strangers

    def note_size(self, world_size: int) -> None:
        """A hello's WORLD_SIZE: believed when nothing is configured and it is larger than known."""
        if not self.configured and world_size > self.size_hint:   # (no strangers without a configured world)
            self.size_hint = world_size
            self._recount()

    def reported(self, rank: int) -> None:
        """`rank` is done with a step (a rank not in `steady`): seen, not gone, no misses."""
        # Only a configured world size is a statement about which ranks exist; one from the
        # hellos (a client without WORLD_SIZE says 1) is a hint the ranks themselves overrule.
        configured, first = self.configured, self.first_rank
        if configured and not first <= rank < first + configured:
            self.strangers.add(rank)
            self.steady.add(rank)         # what _recount gives, without its O(world) walk
            return
        if rank not in self.gone and rank not in self.misses:
            # Not gone, nothing missed: what _recount would give, in place (a head of thousands
            # of nodes sees each one's first step: no walk of the world per node). In a world
            # nobody announced, a rank seen for the first time joins the known and expected ones.
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
