"""Nothing is written twice: a record for a step already closed is late (written as the rank's
own record), also when the step closed earlier in the same batch; with the C and the Python
inner loops. The case of issue 18: 8 ranks whose hellos carry no world size, the aggregator
learning the world from the ranks it sees."""
from __future__ import annotations

import pytest

from protocol import decode, encode_metrics
from telemetry.daemon import hotpath
from telemetry.daemon import loops as python_loops
from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import AggregatorConfig
from aggregator_util import finish_many

LOOPS = [pytest.param(python_loops, id="python_loops"),
         pytest.param(hotpath.native, id="c_loops",
                      marks=pytest.mark.skipif(hotpath.native is None, reason="C loops not built"))]


@pytest.mark.parametrize("loops", LOOPS)
def test_a_step_is_aggregated_once_while_the_world_is_learned(loops):
    a = Aggregator(AggregatorConfig(world_size=0), loops=loops)
    num_ranks, num_steps = 8, 20
    # Records in one batch, each step's ranks one after the other (rank 0 first): with the world
    # learned as ranks appear, step 0 closes on each new rank's record.
    recs = [decode(encode_metrics(100 + r, r, s, 0, 1, s, {"train/loss": float(r)}))
            for s in range(num_steps) for r in range(num_ranks)]
    closed, late = a.add_many(recs)
    closed += a.flush()
    out = finish_many(a, closed)
    steps = [rec["step"] for rec in out]
    assert len(steps) == len(set(steps)), f"steps aggregated twice: {sorted(steps)}"
    # Every record is in exactly one aggregate or handed back as late.
    in_aggregates = sum(len(acc.records) for acc in closed)
    assert in_aggregates + len(late) == len(recs)
    assert all(rec.step in set(steps) for rec in late)
    assert a.num_records_late == len(late)


@pytest.mark.parametrize("loops", LOOPS)
def test_a_bogus_rank_makes_no_step_incomplete(loops):
    """A rank id outside the known world (issue 18): its record joins its step, but no later step
    waits for it or is reported without it."""
    a = Aggregator(AggregatorConfig(world_size=2, step_timeout_s=60), loops=loops)
    recs = [decode(encode_metrics(1, 999, 0, 0, 1, 0, {"train/loss": 5.0}))]
    recs += [decode(encode_metrics(10 + r, r, s, 0, 1, s, {"train/loss": 1.0})) for s in range(5) for r in range(2)]
    closed, late = a.add_many(recs)
    out = finish_many(a, closed)
    assert [rec["step"] for rec in out] == [0, 1, 2, 3, 4] and not late
    assert all("missing_ranks" not in rec for rec in out), out
    assert a.num_steps_incomplete == 0 and 999 not in a.world.known_ranks() - a.world.gone
