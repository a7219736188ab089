"""log()'s common case in C (telemetry/client/_fastlog.c, LogState) and its Python twin
(telemetry/client/fastlog.py, PyLogState) answer every call alike: the same answer (done, the
frame for submit(), or the Python path's), the same frame bytes (msgpack's, the header's time
aside), the same seq taken, the same counters, the same calls to the queue, the bell and the
socket. The client's own tests (tests/test_client.py and the rest) check what reaches a daemon
through whichever is built; here the two meet the same calls side by side."""
from __future__ import annotations

import collections
import time

import msgpack
import pytest

from protocol import codec
from protocol.constants import KIND_METRICS, MAX_NAME_CHARS, PROTOCOL_VERSION
from telemetry.client import fastlog
from telemetry.client.core import DIRECT_AFTER_NS, OWN_TIME_EVERY_NS

pytestmark = pytest.mark.skipif(fastlog.LogState is None or codec.pack_ints_map is None,
                                reason="the client's C part is not built here")

MAX_VALUES, ROOMY, MAX_FRAME = 3, 9, 400       # small bounds: a wide row is cheap to make


class Refused(Exception):
    """The socket's error class in these tests (zmq.ZMQError's place)."""


class Side:
    """One state and what it calls."""

    def __init__(self, state, own_key=None):
        self.st = state
        self.seqs = memoryview(bytearray(8)).cast("Q")
        self.queued, self.rings, self.sent = [], [0], []
        self.send_raises = None

        def send(frame, flags):
            if self.send_raises is not None:
                raise self.send_raises
            self.sent.append((frame, flags))

        def ring():
            self.rings[0] += 1
            self.st.parked = False

        self.st.bind(self.seqs, KIND_METRICS, PROTOCOL_VERSION, 12345, 3, self.queued.append, ring, send, Refused, 1,
                     MAX_FRAME, MAX_VALUES, ROOMY, DIRECT_AFTER_NS, OWN_TIME_EVERY_NS, None, own_key)
        self.st.own_sent_at = time.monotonic_ns()     # the client's own time not due
        self.st.room = 100

    def counters(self):
        s = self.st
        return (s.sent, s.dropped, s.dropped_bg, s.submitted, s.done, s.room, bool(s.forked), bool(s.spans),
                bool(s.parked), self.seqs[0], len(self.queued), self.rings[0], len(self.sent))


def frame_fields(frame):
    """The frame's fields, its time (a clock read) left out; and that its bytes are msgpack's."""
    fields = msgpack.unpackb(frame, strict_map_key=False)
    assert msgpack.Packer(use_bin_type=True).pack(tuple(fields)) == frame
    return fields[:6] + fields[7:]


def both(own_key=None):
    return (Side(fastlog.LogState(), own_key),
            Side(fastlog.PyLogState(codec.checked_pack(codec.new_packer())), own_key))


def call_both(c, p, step, values, parts=1):
    got = []
    for side in (c, p):
        try:
            r = side.st.log(step, values, parts)
        except Exception as exc:                    # noqa: BLE001 - compared, not hidden
            r = ("raised", type(exc))
        got.append(r)
    rc, rp = got
    assert type(rc) is type(rp), (step, values, parts, rc, rp)
    if isinstance(rc, bytes):
        assert frame_fields(rc) == frame_fields(rp)
    else:
        assert rc == rp, (step, values, parts, rc, rp)
    assert c.counters() == p.counters(), (step, values, parts, c.counters(), p.counters())
    for a, b in ((c.queued, p.queued), ([f for f, _ in c.sent], [f for f, _ in p.sent])):
        assert [frame_fields(f) for f in a] == [frame_fields(f) for f in b]
    return rc


NOT_TAKEN = [
    # (step, values, parts): the Python path's
    (1, {"a": 1.0}, 2), (1, {"a": 1.0}, True), (1, {"a": 1.0}, 1.0), (1, {"a": 1.0}, 2**70),
    (1.5, {"a": 1.0}, 1), (-1, {"a": 1.0}, 1), (2**63, {"a": 1.0}, 1), (True, {"a": 1.0}, 1), (None, {"a": 1.0}, 1),
    ("1", {"a": 1.0}, 1), (1, collections.OrderedDict(a=1.0), 1), (1, [("a", 1.0)], 1),
    (1, {"a": "text"}, 1), (1, {"": 1.0}, 1), (1, {"y" * (MAX_NAME_CHARS + 1): 1.0}, 1), (1, {7: 1.0}, 1),
    (1, {"a": 2**64}, 1), (1, {"a": object()}, 1), (1, {"\ud800": 1.0}, 1),
    (1, {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}, 1),            # wider than MAX_VALUES
    (1, {"x" * 200: 1.0, "y" * 200: 2.0}, 1),                      # longer than MAX_FRAME
]


@pytest.mark.parametrize("step,values,parts", NOT_TAKEN)
def test_what_the_common_case_leaves_to_python_is_left_untouched_by_both(step, values, parts):
    c, p = both()
    assert call_both(c, p, step, values, parts) is False
    assert c.seqs[0] == 0


def test_queued_rung_submitted_sent_and_refused_alike():
    c, p = both()
    rows = [{"a": 1.0}, {"a": 1, "b": -5, "c": None}, {"b": True, "c": False}, {"é": 2**63 + 1, "z": -(2**63)},
            {}, {"n" * MAX_NAME_CHARS: 0.5}]
    # Queued: a loop faster than DIRECT_AFTER_NS (the first call is "long after" nothing: sent).
    assert call_both(c, p, 0, rows[0]) is None and len(c.sent) == 1
    for i, row in enumerate(rows):
        assert call_both(c, p, i + 1, row) is None
    assert len(c.queued) == len(rows)
    # A parked thread is rung after the append; a drop count rides in the header.
    for side in (c, p):
        side.st.parked = True
        side.st.dropped_bg = 7
        side.st.dropped = 2
    assert call_both(c, p, 10, {"a": 1.0}) is None and c.rings[0] == 1
    # The queue not open to this path (full, not started, closing): the frame, its seq taken.
    for side in (c, p):
        side.st.room = side.st.submitted - side.st.done
    frame = call_both(c, p, 11, {"a": 2.0})
    assert isinstance(frame, bytes) and frame_fields(frame)[4:6] == [c.seqs[0] - 1, 9]
    # Nothing pending and the last call long ago: sent here; the socket's refusal counted.
    for side in (c, p):
        side.st.done = side.st.submitted
        side.st.last_ns = 0
    assert call_both(c, p, 12, {"a": 3.0}) is None and len(c.sent) == 2
    for side in (c, p):
        side.st.last_ns = 0
        side.send_raises = Refused()
    assert call_both(c, p, 13, {"a": 4.0}) is None and c.st.dropped == 3
    for side in (c, p):                             # any other error is the caller's
        side.st.last_ns = 0
        side.send_raises = KeyError("boom")
    assert call_both(c, p, 14, {"a": 5.0}) == ("raised", KeyError)
    # Forked, spans waiting, the client's own time due, unbound: the Python path's.
    for flag in ("forked", "spans"):
        for side in (c, p):
            setattr(side.st, flag, True)
        assert call_both(c, p, 15, {"a": 1.0}) is False
        for side in (c, p):
            setattr(side.st, flag, False)
    for side in (c, p):
        side.st.own_sent_at = time.monotonic_ns() - OWN_TIME_EVERY_NS
    assert call_both(c, p, 16, {"a": 1.0}) is False
    for side in (c, p):
        side.st.own_sent_at = time.monotonic_ns()
        side.st.unbind()
    assert call_both(c, p, 17, {"a": 1.0}) is False


def test_the_clients_own_time_rides_in_the_record_it_is_due_in_alike():
    """Due once every OWN_TIME_EVERY_NS: the value (own_ns so far, in seconds) added last to the
    record, the next due a period later; left to the Python path when the record has no room for
    it or a value of that name (the Python path's rules decide), or no name was bound."""
    key = "telemetry/client_s"
    c, p = both(own_key=key)
    for side in (c, p):
        side.st.own_ns = 1_234_567_891
        side.st.own_sent_at = time.monotonic_ns() - OWN_TIME_EVERY_NS
    assert call_both(c, p, 1, {"a": 1.0, "b": 2}) is None
    ((frame, _),) = c.sent
    assert msgpack.unpackb(frame)[8] == {"a": 1.0, "b": 2, key: 1.234567891}
    assert list(msgpack.unpackb(frame)[8])[-1] == key
    # Not due again until a period later: the next record is the values alone.
    assert call_both(c, p, 2, {"a": 1.0}) is None
    assert key not in msgpack.unpackb(c.queued[-1] if c.queued else c.sent[-1][0])[8]
    for values in ({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.0, key: 5.0}):      # full (MAX_VALUES 3); named so
        for side in (c, p):
            side.st.own_sent_at = time.monotonic_ns() - OWN_TIME_EVERY_NS
        assert call_both(c, p, 3, values) is False
    # No name bound: the Python path's.
    c, p = both()
    for side in (c, p):
        side.st.own_sent_at = time.monotonic_ns() - OWN_TIME_EVERY_NS
    assert call_both(c, p, 1, {"a": 1.0}) is False
    for st in (fastlog.LogState(), fastlog.PyLogState(codec.checked_pack(codec.new_packer()))):
        with pytest.raises((ValueError, TypeError)):
            st.bind(memoryview(bytearray(8)).cast("Q"), KIND_METRICS, PROTOCOL_VERSION, 1, 0, list.append, print,
                    print, Refused, 1, 1, 1, 1, 1, 1, None, "")


def test_each_call_it_takes_adds_its_own_time():
    c, p = both()
    for side in (c, p):
        before = side.st.own_ns
        side.st.log(1, {"a": 1.0}, 1)
        assert side.st.own_ns > before
        before = side.st.own_ns
        side.st.log(1.5, {"a": 1.0}, 1)             # left to Python: it times itself
        assert side.st.own_ns == before


def test_bind_refuses_what_is_no_seq_cell():
    st = fastlog.LogState()
    args = (KIND_METRICS, PROTOCOL_VERSION, 1, 0, list.append, print, print, Refused, 1, 1, 1, 1, 1, 1)
    for bad in (bytearray(8), memoryview(bytearray(16)).cast("Q"), memoryview(bytes(8)).cast("Q")):
        with pytest.raises((ValueError, TypeError, BufferError)):
            st.bind(bad, *args)
    with pytest.raises(ValueError):
        st.bind(memoryview(bytearray(8)).cast("Q"), KIND_METRICS, PROTOCOL_VERSION, 2**63, *args[3:])
    assert st.log(1, {"a": 1.0}, 1) is False         # still unbound


def test_a_replaced_wall_clock_gives_the_records_time_in_both():
    """A process whose time.time_ns was replaced (a test's shifted clock) has its records' times
    from it, as the Python path reads them; the C part read CLOCK_REALTIME regardless, and a node
    made to run minutes off had its ranks' records on the real clock and its daemon's on the other."""
    for state in (fastlog.LogState(), fastlog.PyLogState(codec.checked_pack(codec.new_packer()))):
        queued = []
        state.bind(memoryview(bytearray(8)).cast("Q"), KIND_METRICS, PROTOCOL_VERSION, 1, 0, queued.append,
                   lambda: None, print, Refused, 1, MAX_FRAME, MAX_VALUES, ROOMY, DIRECT_AFTER_NS, OWN_TIME_EVERY_NS,
                   lambda: 1_234_567_890_123)
        state.own_sent_at, state.room, state.last_ns = time.monotonic_ns(), 100, 1_234_567_890_000
        assert state.log(1, {"a": 1.0}, 1) is None
        assert msgpack.unpackb(queued[0])[6] == 1_234_567_890_123, type(state)
