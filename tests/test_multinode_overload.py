"""A head that cannot keep up with its nodes stays exact per node: what each node sent is, at the
head, received or counted lost, even for the records that never reach it.

A head behind its nodes (overloaded, starved of CPU, or back from an outage with every node's
buffer arriving at once) leaves records queued on the nodes' links. A node daemon that drains
then gives its link `close_linger_s`, and libzmq discards what is still queued, uncounted. The
forwarder's bye carries the node's final seq and drop count: if it waits behind that queue, it
is discarded with it, and the head never learns how many records the node sent (measured: 4,587
of 8,192 nodes with their last records neither received nor counted). The bye goes on a
connection of its own (sinks/forward.py, close), so the head counts what never came as lost.

The head here is a PULL socket on the head's remote-ingest options whose reader does not read
until every node has closed (the head's intake behind), then reads everything through the
head's own Receiver: its per-source accounting is the head's."""
from __future__ import annotations

import threading
import time

import zmq

from protocol import Bye
from protocol.output import MetricsRecord
from telemetry.daemon.receiver import Receiver
from telemetry.daemon.sinks.base import Out
from telemetry.daemon.sinks.forward import ForwardConfig, ForwardSink
from testkit.faults import free_port

NODES = 16
# Per node: more than the head's pipe, the kernel's socket buffers and what one close_linger_s
# can move when the head reads nothing (about 7 MB of records a node).
STEPS = 4000
VALUES = 60


def _metrics(step: int) -> Out:
    rec = MetricsRecord(time.time(), step, {f"node/value_{i:02d}": step + i * 0.5 for i in range(VALUES)})
    return Out("metrics", rec, b"")


def test_a_head_behind_its_nodes_accounts_every_record_of_every_node():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context(1)
    head = ctx.socket(zmq.PULL)
    head.setsockopt(zmq.RCVHWM, 16)          # a connection's queue at the head, in messages
    head.setsockopt(zmq.LINGER, 0)
    head.bind(endpoint)
    sinks = [ForwardSink(ForwardConfig(endpoint=endpoint, node_rank=n, num_nodes=NODES, close_linger_s=0.5))
             for n in range(NODES)]
    try:
        for s in sinks:
            s.start()
        batch = [_metrics(step) for step in range(STEPS)]

        def node(s: ForwardSink) -> None:
            s.consume(batch)
            s.close()                         # the node drains while the head is behind

        threads = [threading.Thread(target=node, args=(s,)) for s in sinks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)                       # a hang detector: each close lingers 0.5 s
        assert not any(t.is_alive() for t in threads)
        # Every node has ended; the head now reads what reached it.
        recv = Receiver()

        def read_all() -> None:
            while True:
                recs, _, n = recv.take(lambda: head.recv(zmq.NOBLOCK), zmq.Again, 4096)
                if not n:
                    return
                for rec in recs:              # as the daemon does with each bye it processes
                    if isinstance(rec, Bye):
                        recv.note_bye(rec.src)

        read_all()
        time.sleep(0.5)                       # what libzmq's I/O thread still moves into the queue
        read_all()
    finally:
        head.close(0)
        ctx.term()
    per = recv.sources
    behind = 0
    for s in sinks:
        sent = s.seq                          # seq numbers given out: every record it tried, and its bye
        assert s.num_dropped == 0, s.stats()  # nothing dropped on the node: all of it was queued
        acc = per.get(s.src)
        assert acc is not None, f"node {s.cfg.node_rank}: nothing of it reached the head"
        assert acc.bye, f"node {s.cfg.node_rank}: its bye never reached the head ({acc})"
        assert acc.received + acc.refused + acc.lost() == sent, (s.cfg.node_rank, acc, sent)
        behind += acc.lost() > 0
    # The head was behind indeed: nodes whose records did not all reach it, counted lost.
    assert behind > 0
