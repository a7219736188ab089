"""A head's view of its nodes, unit by unit: which link is which node and who went without a bye
(node_links.py), a node's clock against the head's (node_clocks.py). The end-to-end tests with
real daemons: test_multinode_links.py, test_multinode_clock.py."""
from __future__ import annotations

from types import SimpleNamespace

from protocol import Event, Hello, Metrics
from telemetry.daemon.node_clocks import AGREE_S, SKEW_MIN_S, NodeClocks
from telemetry.daemon.node_links import LINK_GRACE_MAX_S, LINK_GRACE_S, NodeLinks

S = 1_000_000_000


def _src(received: int = 0, bye: bool = False):
    return SimpleNamespace(received=received, bye=bye)


def test_a_link_that_closes_without_a_bye_is_named_after_the_grace_and_only_then():
    links = NodeLinks()
    links.on_hello(3, {"link": "10.0.0.3:4711"}, src=33)
    links.on_hello(4, {"link": "10.0.0.4:4712"}, src=44)
    links.on_hello(5, {}, src=55)                     # an older node: no link said
    sources = {33: _src(10), 44: _src(10), 55: _src(10)}
    for link in ("10.0.0.3:4711", "10.0.0.4:4712", "127.0.0.1:999"):    # the last: no node's
        links.closed(link)
    at = links._closed[0][1]
    assert links.due(at, sources) == []              # within the grace: a bye may still be queued
    sources[44].bye = True                           # node 4 drained: its bye came after all
    (ev,) = links.due(at + LINK_GRACE_S, sources)
    assert ev["kind"] == "event" and ev["name"] == "link_closed" and ev["rank"] == 3
    assert ev["data"] == {"link": "10.0.0.3:4711"}
    assert links.stats() == {"known": 2, "io_threads": 1, "closed_named": 1, "closed_with_bye": 1}
    assert not links.busy()


def test_a_node_that_linked_again_or_whose_records_still_come_is_not_named_yet():
    links = NodeLinks()
    links.on_hello(1, {"link": "a:1"}, src=11)
    links.on_hello(2, {"link": "b:2"}, src=22)
    sources = {11: _src(5), 22: _src(5)}
    links.closed("a:1")
    links.closed("b:2")
    t0 = links._closed[-1][1]
    assert links.due(t0, sources) == []              # (the daemon's loop looks at every turn)
    links.on_hello(1, {"link": "a:9"}, src=11)       # node 1 reconnected: a new link
    sources[22].received = 6                         # node 2's queued records still being read
    assert links.due(t0 + LINK_GRACE_S, sources) == []
    assert links.busy()                               # node 2 waits another grace
    (ev,) = links.due(t0 + 2 * LINK_GRACE_S + 0.01, sources)
    assert ev["rank"] == 2
    # ... but not past LINK_GRACE_MAX_S, however its records go on trickling in.
    links.on_hello(7, {"link": "c:3"}, src=77)
    sources[77] = _src(0)
    links.closed("c:3")
    t1 = links._closed[-1][1]
    assert links.due(t1, sources) == []
    named = []
    for k in range(1, 20):
        sources[77].received += 1
        named += links.due(t1 + k * LINK_GRACE_S / 2, sources)
        if named:
            break
    assert named and named[0]["rank"] == 7 and k * LINK_GRACE_S / 2 <= LINK_GRACE_MAX_S + LINK_GRACE_S


def _event(src, t_ns, name="node_daemon"):
    return Event(version=1, src=src, rank=src, seq=0, dropped=0, t_ns=t_ns, name=name, data={})


def test_a_clock_off_by_minutes_is_corrected_once_two_observations_agree():
    clocks = NodeClocks()
    now = 1_800_000_000 * S
    assert clocks.observe(2, 2, now + 300 * S, now) is None                 # one observation: not yet
    change = clocks.observe(2, 2, now + 1 * S + 300 * S, now + 1 * S + 3_000_000)
    assert change["name"] == "clock_offset" and change["rank"] == 2
    assert abs(change["data"]["offset_s"] - 300.0) < 0.01
    m = Metrics(version=1, src=2, rank=2, seq=5, dropped=0, t_ns=now + 310 * S, step=9, values={"a": 1.0})
    other = Metrics(version=1, src=3, rank=3, seq=5, dropped=0, t_ns=now + 10 * S, step=9, values={"a": 1.0})
    fixed, untouched = clocks.correct([m, other])
    assert abs(fixed.t_ns - (now + 10 * S)) < S // 100 and untouched is other
    h = Hello(version=1, src=2, rank=2, seq=0, dropped=0, t_ns=now + 300 * S, info={"started_at": now / S + 300})
    assert abs(clocks.correct([h])[0].info["started_at"] - now / S) < 0.01
    # The same offset again changes nothing; the clock set right is no longer corrected.
    assert clocks.observe(2, 2, now + 2 * S + 301 * S, now + 2 * S) is None
    assert clocks.observe(2, 2, now + 3 * S, now + 3 * S) is None            # disagrees with the last
    back = clocks.observe(2, 2, now + 4 * S, now + 4 * S)
    assert back["data"]["offset_s"] == 0 and clocks.offset_ns == {}


def test_small_offsets_and_replayed_records_are_left_alone():
    clocks = NodeClocks()
    now = 1_800_000_000 * S
    off = int((SKEW_MIN_S - 1) * S)                  # under the threshold: a backlog looks like this
    assert clocks.observe(1, 1, now + off, now) is None and clocks.observe(1, 1, now + off, now) is None
    # Records a head outage held, read as a burst: stale by different amounts, they do not agree.
    for stale_s in (60, 50, 40, 30 - AGREE_S):
        assert clocks.observe(4, 4, now - stale_s * S, now) is None
    assert clocks.offset_ns == {}
    assert clocks.correct([_event(1, now)])[0].t_ns == now
