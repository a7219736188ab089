"""The per-source accounting is bounded and sanity-checked (issue 18): a refused record is
counted once (malformed, not also lost), a seq of 2^63-1 does not make records_lost 9.2e18,
500k fake src ids neither cost hundreds of MB nor slow status down."""
from __future__ import annotations

import time
import tracemalloc

import msgpack
import pytest

from daemon_util import feed
from protocol import encode_metrics
from telemetry.daemon import hotpath
from telemetry.daemon import loops as python_loops
from telemetry.daemon.receiver import MAX_SOURCES, MAX_SEQ_GAP, Receiver

LOOPS = [pytest.param(python_loops, id="python_loops"),
         pytest.param(hotpath.native, id="c_loops",
                      marks=pytest.mark.skipif(hotpath.native is None, reason="C loops not built"))]
U63 = (1 << 63) - 1


@pytest.mark.parametrize("loops", LOOPS)
def test_a_negative_step_is_counted_once(loops):
    r = Receiver(loops)
    frames = [encode_metrics(7, 0, 0, 0, 1, 0, {"x": 1.0}),
              msgpack.packb([2, 1, 7, 0, 1, 0, 1, -5, {"x": 1.0}]),      # step -5: refused
              encode_metrics(7, 0, 2, 0, 1, 2, {"x": 1.0})]
    feed(r, frames)
    t = r.totals()
    assert (t["records_in"], t["records_malformed"], t["records_lost"]) == (2, 1, 0), t
    assert r.per_rank()[0]["received"] == 2


@pytest.mark.parametrize("loops", LOOPS)
@pytest.mark.parametrize("split", [False, True], ids=["one_batch", "two_batches"])
def test_a_seq_of_2_63_is_not_believed(loops, split):
    r = Receiver(loops)
    frames = [encode_metrics(7, 0, 0, 0, 1, 0, {"x": 1.0}), encode_metrics(7, 0, U63, 0, 1, 1, {"x": 1.0}),
              encode_metrics(8, 1, 0, U63, 1, 1, {"x": 1.0}), encode_metrics(8, 1, 5, U63, 1, 1, {"x": 1.0})]
    if split:
        feed(r, frames[:1]), feed(r, frames[1:])
    else:
        feed(r, frames)
    t = r.totals()
    assert t["records_in"] == 4
    assert t["records_lost"] <= 4 and t["records_dropped_by_clients"] <= 4, t
    assert t["records_seq_bogus"] >= 1
    # A real gap (a client whose records vanished) is still counted exactly.
    feed(r, [encode_metrics(9, 2, 0, 0, 1, 1, {"x": 1.0}), encode_metrics(9, 2, 1000, 0, 1, 2, {"x": 1.0})])
    assert r.totals()["records_lost_in_transit"] - t["records_lost_in_transit"] == 999
    assert MAX_SEQ_GAP < U63


@pytest.mark.parametrize("loops", LOOPS)
def test_a_known_source_s_seq_jump_is_believed_up_to_max_seq_gap_lost_either_way(loops):
    """A later batch of a source already accounted: a window that grows by MAX_SEQ_GAP + 1 seqs
    (MAX_SEQ_GAP lost) is believed, one seq more is not; so is a seq that reaches back further."""
    r = Receiver(loops)
    feed(r, [encode_metrics(7, 0, 0, 0, 1, 0, {"x": 1.0})])
    feed(r, [encode_metrics(7, 0, MAX_SEQ_GAP + 1, 0, 1, 1, {"x": 1.0})])
    assert (r.totals()["records_lost"], r.num_seq_bogus) == (MAX_SEQ_GAP, 0)
    feed(r, [encode_metrics(8, 1, 0, 0, 1, 0, {"x": 1.0})])
    feed(r, [encode_metrics(8, 1, MAX_SEQ_GAP + 2, 0, 1, 1, {"x": 1.0})])
    assert (r.sources[8].max_seq, r.num_seq_bogus) == (0, 1)
    feed(r, [encode_metrics(9, 2, 2 * MAX_SEQ_GAP, 0, 1, 0, {"x": 1.0})])
    feed(r, [encode_metrics(9, 2, 0, 0, 1, 1, {"x": 1.0})])        # reaching back: not believed either
    assert (r.sources[9].min_seq, r.num_seq_bogus) == (2 * MAX_SEQ_GAP, 2)
    assert r.totals()["records_lost"] == MAX_SEQ_GAP


def test_fake_source_ids_are_bounded():
    r = Receiver(python_loops)
    n = 500_000
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for start in range(0, n, 1024):
        feed(r, [encode_metrics(1000 + i, 0, 0, 0, 1, 1, {"x": 1.0}) for i in range(start, min(n, start + 1024))])
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    t0 = time.perf_counter()
    t = r.totals()
    r.per_rank()
    took = time.perf_counter() - t0
    assert len(r.sources) == MAX_SOURCES
    assert t["records_in"] == n and t["records_untracked"] == n - MAX_SOURCES
    assert used < 64 * 2**20, used          # 211 MB before the bound
    # What totals() and per_rank() walk is the bounded table (MAX_SOURCES, above), not the 500,000
    # records: ~0.1 s idle, 0.5 s beside two CPU hogs; 30 s is a hang detector (a walk of
    # anything quadratic), not a speed.
    assert took < 30.0, took
