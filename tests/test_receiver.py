"""The receiver's loss accounting, per client instance (src), from sequence numbers alone."""
import json

import pytest

import protocol
from daemon_util import feed, feed_one
from telemetry.daemon.receiver import Receiver


def frame(src, seq, dropped=0):
    return protocol.encode_metrics(src, 0, seq, dropped, 1, seq, {"train/loss": 1.0})


def test_out_of_order_and_counted_drops():
    r = Receiver()
    for seq in (0, 2, 1, 5):          # 3 and 4: dropped by the client, which says so in-band
        feed_one(r, frame(7, seq, dropped=2 if seq == 5 else 0))
    t = r.totals()
    assert (t["records_in"], t["records_lost"], t["records_dropped_by_clients"], t["records_lost_in_transit"]) \
        == (4, 2, 2, 0)


def test_silent_loss_is_what_the_client_did_not_count():
    r = Receiver()
    for seq in (0, 1, 4):             # 2 and 3 vanished; the client counted none
        feed_one(r, frame(7, seq))
    assert r.totals()["records_lost_in_transit"] == 2


def test_a_restarted_daemon_accounts_from_the_first_record_it_sees():
    """A rank that outlived a daemon restart arrives mid-sequence: what the old daemon received
    is not lost; drops the client counted before that point are not this daemon's either."""
    r = Receiver()
    for seq in range(1000, 1010):
        feed_one(r, frame(7, seq, dropped=300))
    for seq in range(1050, 1060):     # 40 dropped by the client in between, counted in-band
        feed_one(r, frame(7, seq, dropped=340))
    t = r.totals()
    assert t["records_lost"] == 40
    assert t["records_dropped_by_clients"] == 40
    assert t["records_lost_in_transit"] == 0


def test_a_successor_says_what_the_daemons_before_it_took_in():
    # Issue 33: after a head restart `status` showed only the new head's figures. The successor
    # restores its predecessor's checkpoint: records_in is its own, records_in_earlier_daemons
    # what the checkpoint says the clients had sent before, and together they are the run's.
    first = Receiver()
    for seq in range(0, 500):
        feed_one(first, frame(7, seq))
    for seq in range(0, 200):
        feed_one(first, frame(8, seq))
    second = Receiver()
    second.restore(first.snapshot())
    for seq in range(500, 600):
        feed_one(second, frame(7, seq))
    t = second.totals()
    assert t["records_in"] == 100 and t["records_in_earlier_daemons"] == 700
    assert t["records_lost"] == 0


def test_a_successor_keeps_the_byes_its_predecessor_had():
    """A client that said bye before the checkpoint is ended for the successor too: not open in
    per_rank (it said 1 open for ever), not waited for at a drain; a checkpoint without the key
    (an older daemon's) restores every source open, as before."""
    first = Receiver()
    for seq in range(0, 5):
        feed_one(first, frame(7, seq))
    feed_one(first, protocol.encode_bye(7, 0, 5, 0, 1, {"sent": 6, "dropped": 0}))
    first.note_bye(7)          # the daemon's rare stage, on the bye
    for seq in range(0, 3):
        feed_one(first, frame(8, seq))
    snap = json.loads(json.dumps(first.snapshot()))
    second = Receiver()
    second.restore(snap)
    assert second.per_rank()[0]["open"] == 1 and second.open_live() == set()
    assert {i for i, s in second.sources.items() if not s.bye} == {8}
    older = Receiver()
    older.restore({k: v for k, v in snap.items() if k != "ended"})
    assert older.per_rank()[0]["open"] == 2
    hostile = Receiver()
    hostile.restore({**snap, "ended": [7, "x", None, 10**30, 99]})
    assert {i for i, s in hostile.sources.items() if s.bye} == {7}


def test_a_checkpoint_row_no_daemon_writes_is_not_believed(caplog):
    """sources.json is the user's file: a row out of range (a rank past MAX_RANK, a source twice,
    more arrived than its window, a window 2^63 long: a loss of that size counted for ever, and
    written back at every checkpoint) is refused, said once; the good rows are kept."""
    good = [7, 0, 0, 0, 10, 9, 0]
    rows = [good, [8, -1, 0, 0, 1, 0, 0], [9, 1 << 40, 0, 0, 1, 0, 0], [7, 0, 0, 0, 3, 2, 0],
            [10, 0, 0, 0, 1000, 82, 0], [11, 0, 0, 0, 5, (1 << 63) - 1, 0], [12, 0, 9, 0, 0, 3, 0], "x"]
    r = Receiver()
    assert r.restore({"version": 1, "sources": rows}) == 1
    assert r.sources[7].earlier == 10 and r.totals()["records_lost"] == 0
    assert "7 row(s) not believed" in caplog.text


def test_malformed_frames_are_counted_not_raised():
    r = Receiver()
    assert feed_one(r, b"\xc1garbage") is None
    assert r.totals()["records_malformed"] == 1


def test_a_batch_refuses_bad_names_alone_and_keeps_the_rest_in_order():
    """An empty or overlong name costs its value, not its record (values_refused["name"]);
    protocol.decode alone still refuses such a record whole."""
    protocol.codec._good_names.clear()
    r = Receiver()
    ok = {"train/loss": 1.0, "perf/tokens": 5}
    frames = [protocol.encode_metrics(7, 0, 0, 0, 1, 0, ok),
              protocol.encode_metrics(7, 0, 1, 0, 1, 1, {"": 1.0, "a": 2.0}),                      # empty name
              protocol.encode_metrics(7, 0, 2, 0, 1, 2, {"x" * (protocol.MAX_NAME_CHARS + 1): 1.0}),  # too long
              protocol.encode_metrics(8, 1, 0, 0, 1, 0, dict(ok)),
              protocol.encode_metrics(8, 1, 1, 0, 1, 1, dict(reversed(list(ok.items())))),
              protocol.encode_event(8, 1, 2, 0, 1, "eval", {"acc": 0.5})]
    recs, all_metrics = feed(r, frames)
    assert [rec.seq for rec in recs] == [0, 1, 2, 0, 1, 2] and not all_metrics
    assert [(rec.src, rec.seq) for rec in recs] == [(7, 0), (7, 1), (7, 2), (8, 0), (8, 1), (8, 2)]
    assert [dict(rec.values) for rec in recs[1:3]] == [{"a": 2.0}, {}]
    assert r.sources[7].received == 3 and r.sources[8].received == 3
    t = r.totals()
    assert t["records_malformed"] == 0 and t["records_in"] == 6
    assert r.values_refused == {"name": 2} and t["values_refused"] == 2
    with pytest.raises(protocol.MalformedRecord):
        protocol.decode(frames[1])
