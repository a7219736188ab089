"""The daemon's C inner loops (telemetry/daemon/_hotpath.c) give what their Python twins
(telemetry/daemon/loops.py) give: the receiver's accounting of random batches (malformed frames,
every kind, out-of-order and repeated sequence numbers, many sources), the columns of random
closed steps (ints, floats, NaN, signed zeros, bools, None, ranks that log twice or different
keys), and whole aggregator runs with late records and timeouts, compared field by field and
value by value."""
from __future__ import annotations

import math
import os
import time
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import encode_bye, encode_event, encode_hello, encode_metrics
from protocol.output import OutputRecord
from telemetry.daemon import hotpath
from telemetry.daemon import loops as python_loops
from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import AggregatorConfig
from telemetry.daemon.receiver import Receiver
from aggregator_util import finish_many

ROOT = Path(__file__).resolve().parents[1]
native = pytest.mark.skipif(hotpath.native is None, reason="the C loops are not built here")


def test_the_c_loops_are_built_where_there_is_a_compiler():
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: the daemon runs its pure-Python loops")
    assert hotpath.native is not None and hotpath.name() == "c"


def test_telemetry_pure_python_turns_them_off():
    code = "from telemetry.daemon import hotpath; print(hotpath.name())"
    env = {**os.environ, "TELEMETRY_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "python"


NOT_BUILT = ("the C inner loops are not built (no C compiler at install?): running the pure-Python ones: "
             "the same results at a lower ingest rate")


def _says(d, text: str, timeout_s: float) -> bool:
    """Whether the daemon's output shows `text` within timeout_s. Its start-up warnings are
    written before it answers a status request; the wait is for the reading thread."""
    deadline = time.monotonic() + timeout_s
    while text not in d.output():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_daemon_whose_c_loops_are_missing_warns_and_runs_the_python_ones(make_daemon, tmp_path):
    shim = tmp_path / "shim"     # as if the install had found no compiler: the import fails
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['telemetry.daemon._hotpath'] = None\n")
    path = os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))
    d = make_daemon(env={"PYTHONPATH": path})
    assert d.status()["inner_loops"] == "python"
    assert _says(d, NOT_BUILT, timeout_s=120)


def test_a_daemon_told_to_run_pure_python_does_without_a_warning(make_daemon):
    d = make_daemon(env={"TELEMETRY_PURE_PYTHON": "1"})
    assert d.status()["inner_loops"] == "python"
    assert not _says(d, "not built", timeout_s=1)


# -- the receiver ---------------------------------------------------------------------------------
def test_the_receiver_checks_names_not_seen_yet():
    """A key set seen for the first time has its names checked; an empty name is refused alone
    (values_refused), the rest of its record taken."""
    from protocol import codec

    codec._good_names.clear()
    rx = Receiver()
    good = encode_metrics(1, 0, 0, 0, 1, 0, {"train/loss": 1.0})
    bad = encode_metrics(1, 0, 1, 0, 1, 0, {"": 1.0, "train/loss": 2.0})       # an empty name: refused alone
    recs, _, n = rx.take(iter([good, bad, good]).__next__, StopIteration, 10)
    assert n == 3 and len(recs) == 3 and rx.num_malformed == 0
    assert [dict(rec.values) for rec in recs] == [{"train/loss": 1.0}, {"train/loss": 2.0}, {"train/loss": 1.0}]
    assert rx.values_refused == {"name": 1}
    assert rx.sources[1].received == 3 and rx.sources[1].max_seq == 1
    recs, _, _ = rx.take(iter([good]).__next__, StopIteration, 10)   # now known
    assert len(recs) == 1 and rx.sources[1].received == 4


KEY_SETS = [("train/loss", "perf/step_time"), ("perf/step_time", "train/loss"), ("a",), ("x" * 200, "b"), ("", "b")]


@st.composite
def frame_batches(draw):
    """Batches of frames as they come off the socket: mostly metrics, some other kinds, some
    garbage; sources that restart, reorder and repeat; key sets seen before and new ones, some
    with a bad name (empty, too long)."""
    num_srcs = draw(st.sampled_from([1, 3, 8, 40]))
    batches = []
    for _ in range(draw(st.integers(1, 6))):
        frames = []
        for _ in range(draw(st.integers(0, 60))):
            src = draw(st.integers(0, num_srcs - 1))
            rank, seq, dropped = src % 8, draw(st.integers(0, 50)), draw(st.integers(0, 5))
            kind = draw(st.sampled_from(["metrics"] * 30 + ["hello", "event", "bye", "garbage"]))
            if kind == "metrics":
                keys = draw(st.sampled_from(KEY_SETS))
                frames.append(encode_metrics(1000 + src, rank, seq, dropped, 1, draw(st.integers(0, 9)),
                                             {k: draw(st.floats(allow_nan=False)) for k in keys}))
            elif kind == "hello":
                frames.append(encode_hello(1000 + src, rank, seq, dropped, 1, {"world_size": 8}))
            elif kind == "event":
                frames.append(encode_event(1000 + src, rank, seq, dropped, 1, "e", {}))
            elif kind == "bye":
                frames.append(encode_bye(1000 + src, rank, seq, dropped, 1, {}))
            else:
                frames.append(draw(st.binary(max_size=12)))
        batches.append(frames)
    return batches


def _take(rx: Receiver, frames: list) -> tuple:
    recs, all_metrics, n = rx.take(iter(frames).__next__, StopIteration, 1024)
    return [(type(r).__name__, r.src, r.seq, getattr(r, "values", None)) for r in recs], all_metrics, n


def _state(rx: Receiver) -> tuple:
    sources = {k: (s.rank, s.min_seq, s.dropped_at_min, s.received, s.refused, s.max_seq, s.dropped)
               for k, s in rx.sources.items()}
    return sources, rx.num_in, rx.num_malformed, rx.num_byes, rx.values_refused, rx.totals()


@native
@settings(max_examples=200, deadline=None)
@given(frame_batches())
def test_receiver_in_c_accounts_as_in_python(batches):
    from protocol import codec

    codec._good_names.clear()           # names unchecked at first in both runs
    py = Receiver(loops=python_loops)
    got_py = [_take(py, b) for b in batches]
    codec._good_names.clear()
    c = Receiver(loops=hotpath.native)
    got_c = [_take(c, b) for b in batches]
    assert got_c == got_py
    assert _state(c) == _state(py)


@native
@settings(max_examples=200, deadline=None)
@given(frame_batches(), st.booleans())
def test_tally_in_c_equals_python(batches, names_known):
    from protocol import Bye, Metrics, decode
    from protocol.codec import decoder_parts

    _, _, good_names = decoder_parts()
    for frames in batches:
        recs = []
        for f in frames:
            try:
                recs.append(decode(f))       # registers the names as checked
            except Exception:
                continue
        if not names_known:
            good_names.clear()
        assert hotpath.native.tally(recs, Metrics, Bye, good_names) == python_loops.tally(recs, Metrics, Bye, good_names)


class _Head:
    """A record as tally reads it (any class: its fields read by name), with the protocol's ints
    and ints beyond 64 bits, which the C twin compares as Python does."""

    def __init__(self, src, rank, seq, dropped, values=None):
        self.src, self.rank, self.seq, self.dropped, self.values = src, rank, seq, dropped, values


class _Other(_Head):
    pass


def _fresh(name: str) -> str:
    """An equal str that is not the same object (as msgspec hands out when its cache of names misses)."""
    return "".join(list(name))


@native
def test_tally_in_c_equals_python_for_names_equal_but_not_the_same_objects():
    known, new = ("train/loss", "perf/step_time"), ("train/loss", "perf/tokens")
    good_names = {known: known}
    big = 1 << 70
    recs = [_Head(1, 0, 5, 0, dict.fromkeys(known, 1.0)),
            _Head(2, 1, 7, 1, dict.fromkeys(map(_fresh, known), 2.0)),       # equal names, other objects
            _Head(1, 0, 3, 2, dict.fromkeys(map(_fresh, new), 3.0)),         # a key set not known yet
            _Head(2, 1, 6, 0, dict.fromkeys(map(_fresh, known[:1]), 4.0)),   # a prefix of the known one
            _Head(2, 1, 8, 0, dict.fromkeys(map(_fresh, reversed(known)), 4.0)),   # the same names, another order
            _Other(big, 2, big, big + 1),                                    # another kind, ints past 64 bits
            _Other(big, 2, big - 1, big),
            _Head(1, 0, 9, 1, dict.fromkeys(known, 5.0))]
    want = python_loops.tally(recs, _Head, _Other, good_names)
    assert want[3] == [2, 3, 4] and want[1] == 2 and want[0] is False
    assert hotpath.native.tally(recs, _Head, _Other, good_names) == want


U64 = (1 << 64) - 1
HEADER_INT = st.one_of(st.integers(0, 127), st.integers(0, 1 << 20), st.integers(0, U64), st.integers(-(1 << 63), -1),
                       st.sampled_from([0, 1, (1 << 20) - 1, 1 << 20, (1 << 63) - 1, 1 << 63, 1023, 1024, 1025]))
KEY = st.one_of(st.sampled_from(NAMES_FOR_FRAMES := ("train/loss", "perf/tokens", "a", "", "é/loss", "x" * 300)),
                st.text(max_size=12))
ODD_VALUE = st.one_of(st.integers(-(1 << 63), U64), st.booleans(), st.none(), st.text(max_size=3),
                      st.binary(max_size=3), st.lists(st.integers(-5, 5), max_size=2),
                      st.dictionaries(st.text(max_size=2), st.integers(0, 5), max_size=1))


@st.composite
def metrics_frames(draw):
    """Frames shaped like a metrics record, and all the ways they may not be one: every msgpack
    width of every int, header ints out of bounds, float32, values of every kind, names not ASCII
    and not UTF-8, a parts field in and out of bounds, trailing elements and bytes, cut frames."""
    import msgpack

    head = [draw(st.sampled_from([2, 2, 2, 2, 1, 3, 4])), draw(st.sampled_from([1, 1, 1, 1, 0, 2]))]
    head += [draw(HEADER_INT) for _ in range(6)]          # src, rank, seq, dropped, t_ns, step
    if draw(st.booleans()):                               # a header that is plainly good
        head[2:8] = [draw(st.integers(0, (1 << 63) - 1)), draw(st.integers(0, (1 << 20) - 1))] + \
            [draw(st.integers(0, (1 << 63) - 1)) for _ in range(4)]
    single = draw(st.booleans())                          # floats packed as float32
    number = st.one_of(st.floats(width=32 if single else 64), st.integers(-9, 300))
    keys = draw(st.lists(KEY, max_size=8))
    values = {k: draw(ODD_VALUE if draw(st.integers(0, 9)) == 0 else number) for k in keys}
    body = head + [values]
    tail = draw(st.sampled_from([[], [], [1], [draw(HEADER_INT)], [2, "extra"]]))
    packed = msgpack.packb(body + tail, use_bin_type=True, use_single_float=single)
    if draw(st.integers(0, 9)) == 0 and b"loss" in packed:           # a name's bytes not UTF-8
        packed = packed.replace(b"loss", b"lo\xffs", 1)
    cut = draw(st.integers(0, 12))
    if cut == 1:
        packed = packed[:draw(st.integers(0, len(packed)))]
    elif cut == 2:
        packed += b"\x00"
    return packed


def _decoded(decode, frame):
    try:
        return decode(frame)
    except Exception as exc:
        return (type(exc), str(exc))


@native
@settings(max_examples=500, deadline=None)
@given(st.lists(metrics_frames(), max_size=12), st.lists(st.sampled_from(NAMES_FOR_FRAMES), max_size=4))
def test_decode_frames_in_c_gives_what_the_decoder_gives(frames, template):
    """Frame by frame the same record (field by field, each value of its type, NaN and -0.0
    too) or the same error as the msgspec decoder; a batch of good frames the same list; with
    any names left in the cache by an earlier call."""
    from protocol.codec import decoder_parts
    from protocol.records import Metrics
    from telemetry.daemon.receiver import _METRICS_LIMITS

    decode, _, _ = decoder_parts()
    cache = [tuple(template), ("a", 1), ("a", "é"), 5]      # names kept by an earlier call; any junk
    for frame in frames:
        got = _decoded(lambda f: hotpath.native.decode_frames([f], decode, Metrics, _METRICS_LIMITS, cache)[0], frame)
        want = _decoded(decode, frame)
        if isinstance(want, tuple):
            assert got == want
        else:
            assert type(got) is type(want) and _same(_fields(got), _fields(want)), (got, want)
    good = [f for f in frames if not isinstance(_decoded(decode, f), tuple)]
    got = hotpath.native.decode_frames(good, decode, Metrics, _METRICS_LIMITS, cache)
    want = python_loops.decode_frames(good, decode, Metrics, _METRICS_LIMITS, [])
    assert _same([_fields(r) for r in got], [_fields(r) for r in want])


@native
def test_decode_frames_in_c_keeps_the_names_of_many_key_sets_and_gives_what_the_decoder_gives():
    from protocol.codec import decoder_parts
    from protocol.records import Metrics
    from telemetry.daemon.receiver import _METRICS_LIMITS

    decode, _, _ = decoder_parts()
    key_sets = [[f"set{k}/m{i}" for i in range(5)] for k in range(40)] + [["train/loss", "é"], ["train/loss", "e"]]
    frames = [encode_metrics(7, 3, seq, 0, 1, seq, dict.fromkeys(key_sets[(seq * 7) % len(key_sets)], seq * 0.5))
              for seq in range(500)]
    cache: list = []
    for at in range(0, len(frames), 50):
        got = hotpath.native.decode_frames(frames[at:at + 50], decode, Metrics, _METRICS_LIMITS, cache)
        assert _same([_fields(r) for r in got], [_fields(decode(f)) for f in frames[at:at + 50]])
        assert 0 < len(cache) <= 16 and all(type(names) is tuple for names in cache)


def _fields(rec) -> tuple:
    import msgspec

    return (type(rec).__name__,) + tuple(msgspec.structs.astuple(rec))


# -- the columns of closed steps -----------------------------------------------------------------
NAMES = ("train/loss", "perf/tokens", "perf/step_time", "perf/attn_doc_len_sq", "memory/max_allocated_gb",
         "custom/n_count", "custom/n_min", "train/lr", "train/epoch", "dataset/a/loss", "dataset/a/tokens")
NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**20, 10**20), st.booleans())
VALUE = st.one_of(NUMBER, NUMBER, NUMBER, NUMBER, st.none())


class _Rec:
    parts = 1       # one record per rank per step (the protocol's default)

    def __init__(self, rank, step, t_ns, values):
        self.rank, self.step, self.t_ns, self.values = rank, step, t_ns, values


@st.composite
def closed_steps(draw):
    """The records of closed steps: ranks in any order, some logging a step twice, with the same
    keys (the usual case), other keys or other orders; all kinds of values."""
    groups = []
    for step in range(draw(st.integers(1, 8))):
        world = draw(st.integers(1, 6))
        keys = draw(st.lists(st.sampled_from(NAMES), min_size=0, max_size=len(NAMES), unique=True))
        records = []
        for rank in draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=2 * world)):
            ks = keys if draw(st.booleans()) else draw(st.lists(st.sampled_from(NAMES), max_size=4, unique=True))
            records.append(_Rec(rank, step, draw(st.integers(0, 10**19)), {k: draw(VALUE) for k in ks}))
        groups.append(records)
    return groups


def _same(a, b) -> bool:
    if isinstance(a, OutputRecord) and isinstance(b, OutputRecord):
        return type(a) is type(b) and _same(a.to_dict(), b.to_dict())
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return repr(a) == repr(b)            # NaN is NaN, and -0.0 is not 0.0
    return type(a) is type(b) and a == b


@native
@settings(max_examples=300, deadline=None)
@given(closed_steps())
def test_gather_in_c_equals_python(groups):
    got, want = hotpath.native.gather(groups), python_loops.gather(groups)
    assert _same(got, want), (got, want)
    ranks, _, names, columns = got
    for s, records in enumerate(groups):          # the values themselves, not copies
        for rec in records:
            for name, value in rec.values.items():
                last = [r.values[name] for r in records if r.rank == rec.rank and name in r.values][-1]
                assert columns[name][s][ranks[s].index(rec.rank)] is last
        assert set(names[s]) == {n for rec in records for n in rec.values}


@native
def test_gather_of_a_head_step_of_thousands_of_ranks_in_c_equals_python():
    """A head's step: a record from each of thousands of nodes, in any order, some twice, rank
    numbers up to the protocol's largest (the C twin finds ranks by value in a table: these
    collide in it and fill it past a small step's size)."""
    import random

    from protocol.constants import MAX_RANK

    rng = random.Random(55)
    groups = []
    for step, world in enumerate((1, 3, 3000, 17, 4096)):
        ranks = rng.sample(range(MAX_RANK + 1), world) if step % 2 else list(range(world))
        order = ranks + rng.choices(ranks, k=world // 3)          # some ranks log the step twice
        rng.shuffle(order)
        groups.append([_Rec(rank, step, rng.randrange(10**12), {"train/loss": rng.random(), "perf/tokens": rank})
                       for rank in order])
    got, want = hotpath.native.gather(groups), python_loops.gather(groups)
    assert _same(got, want)
    assert [len(r) for r in got[0]] == [1, 3, 3000, 17, 4096]


@st.composite
def uniform_steps(draw):
    world = draw(st.integers(1, 6))
    keys = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=len(NAMES), unique=True))
    floats_only = draw(st.booleans())
    value = st.floats(-1e6, 1e6) if floats_only else VALUE
    steps = [{rank: {k: draw(value) for k in keys} for rank in draw(st.permutations(range(world)))}
             for _ in range(draw(st.integers(1, 10)))]
    return world, steps


def _close(agg: Aggregator, steps: list[dict]) -> list:
    recs = [_Rec(rank, step, step + rank, values) for step, rows in enumerate(steps) for rank, values in rows.items()]
    done, _ = agg.add_many(recs)
    return done


LOOPS = [pytest.param(python_loops, id="python"),
         pytest.param(hotpath.native, id="c", marks=native)]


@native
@settings(max_examples=300, deadline=None)
@given(uniform_steps())
def test_aggregated_steps_with_c_equal_python(case):
    world, steps = case
    rules = {"train/lr": "last", "train/epoch": "min"}
    results = []
    for impl in (python_loops, hotpath.native):
        agg = Aggregator(AggregatorConfig(world_size=world, reductions=rules), loops=impl)
        results.append(finish_many(agg, _close(agg, steps)))
    assert len(results[0]) == len(steps)
    assert _same(results[1], results[0])


@pytest.mark.parametrize("impl", LOOPS)
def test_reduction_returns_the_extreme_item_itself_and_the_first_slowest_rank(impl):
    agg = Aggregator(AggregatorConfig(world_size=3), loops=impl)
    big = 10**30                                  # an int: max() returns that very object
    steps = [{0: {"perf/step_time": 0.5, "m_max": big}, 1: {"perf/step_time": 0.7, "m_max": 1},
              2: {"perf/step_time": 0.7, "m_max": 2}}]
    v = finish_many(agg, _close(agg, steps))[0]["values"]
    assert v["m_max"] is big
    assert v["perf/step_time_max"] == 0.7 and v["perf/slowest_rank"] == 1     # the first to report it


@pytest.mark.parametrize("impl", LOOPS)
def test_max_and_min_keep_the_first_of_equal_items(impl):
    agg = Aggregator(AggregatorConfig(world_size=2), loops=impl)
    steps = [{0: {"memory/max_allocated_gb": 0.0, "custom/n_min": -0.0},
              1: {"memory/max_allocated_gb": -0.0, "custom/n_min": 0.0}}]
    v = finish_many(agg, _close(agg, steps))[0]["values"]
    assert repr(v["memory/max_allocated_gb"]) == "0.0" and repr(v["custom/n_min"]) == "-0.0"


# -- adding records ------------------------------------------------------------------------------
@st.composite
def arrivals(draw):
    """Records in batches as the receiver hands them: ranks that join late, skip steps, die, log
    a step twice, come back after their step went out (late), and timeouts in between."""
    world = draw(st.integers(0, 4))             # 0: the world is the ranks seen
    script = []
    for _ in range(draw(st.integers(1, 8))):
        batch = []
        for _ in range(draw(st.integers(0, 25))):
            rank, step = draw(st.integers(0, 4)), draw(st.integers(0, 12))
            keys = draw(st.sampled_from([("a", "b"), ("b", "a"), ("a",)]))
            batch.append((rank, step, draw(st.integers(0, 5)), keys, draw(st.sampled_from([1.0, -0.0, math.nan, 3]))))
        script.append((batch, draw(st.booleans())))     # expire every open step after the batch?
    return world, script


def _run_arrivals(impl, world: int, script: list) -> list:
    agg = Aggregator(AggregatorConfig(world_size=world), loops=impl)
    seen = []
    for batch, expire in script:
        recs = [_Rec(rank, step, t, dict.fromkeys(keys, value)) for rank, step, t, keys, value in batch]
        done, late = agg.add_many(recs)
        seen.append((finish_many(agg, done), [(r.rank, r.step) for r in late]))
        if expire:
            seen.append(finish_many(agg, agg.expire(time.monotonic() + agg.cfg.step_timeout_s + 1)))
        seen.append((sorted(agg.pending), agg.world.seen, agg.world.gone, dict(agg.world.misses), agg.num_records_late))
    seen.append(finish_many(agg, agg.flush()))
    return seen


@native
@settings(max_examples=300, deadline=None)
@given(arrivals())
def test_adding_and_finishing_with_c_equals_python(case):
    world, script = case
    got, want = _run_arrivals(hotpath.native, world, script), _run_arrivals(python_loops, world, script)
    assert _same(_plain(got), _plain(want))


def _plain(x):
    """Sets as sorted lists, so _same can compare them."""
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    if isinstance(x, (list, tuple)):
        return type(x)(map(_plain, x))
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


# -- the per-phase straggler view ------------------------------------------------------------------
KEYS = ("phase", "rank", "median", "excess")
TIME = st.one_of(st.floats(0.0, 2.0), st.floats(0.0, 2.0), st.integers(0, 3), st.sampled_from([0.5, 1.0, -0.0]),
                 st.just(math.nan), st.sampled_from([math.inf, -math.inf]), st.none(), st.booleans(),
                 st.integers(-10**400, 10**400), st.floats(allow_nan=False),
                 st.sampled_from([1e308, 1.7e308, 5e-324, 2**53 + 1]))      # overflow, subnormal, inexact int


@st.composite
def phase_steps(draw):
    """The arguments of phase_straggler: steps of 1-9 ranks, 0-5 phase columns in any order
    (some shorter than the steps), cells None or tuples of any values (ties: few distinct
    values), step times absent or with Nones."""
    num_steps = draw(st.integers(1, 6))
    ranks = [tuple(draw(st.permutations(range(draw(st.integers(1, 9)))))) for _ in range(num_steps)]
    ties = draw(st.booleans())
    time = st.sampled_from([0.25, 0.5, 0.0, -0.0, 1, None]) if ties else TIME

    def column(length):
        return [draw(st.none() | st.tuples(*[time] * len(ranks[s]))) for s in range(length)]

    phases = draw(st.lists(st.integers(0, 4), max_size=5, unique=True))
    columns = [(p, column(draw(st.integers(0, num_steps)) if draw(st.integers(0, 5)) == 0 else num_steps))
               for p in phases]
    step_times = draw(st.none() | st.just(column(num_steps)))
    floor_fraction = draw(st.sampled_from([0.05, 0.0, 0.5]))
    return columns, step_times, ranks, floor_fraction


def _phase_view(impl, columns, step_times, ranks, floor_fraction) -> list:
    values = [{"before": 1} for _ in ranks]
    impl.phase_straggler(columns, step_times, ranks, values, floor_fraction, KEYS)
    return values


@native
@settings(max_examples=500, deadline=None)
@given(phase_steps())
def test_phase_straggler_in_c_equals_python(case):
    got, want = _phase_view(hotpath.native, *case), _phase_view(python_loops, *case)
    assert _same(got, want), (got, want)            # value by value: int vs float, -0.0, key order
    for v, step_ranks in zip(want, case[2]):
        if "rank" in v:
            assert type(v["median"]) is float and type(v["excess"]) is float and v["rank"] in step_ranks


@pytest.mark.parametrize("impl", LOOPS)
def test_phase_straggler_semantics(impl):
    view = lambda cols, ranks=(0, 1, 2, 3), times=None: _phase_view(impl, cols, times, [ranks], 0.05)[0]
    # ties: the first rank (in the step's order) with the longest time
    v = view([(1, [(0.1, 0.3, 0.2, 0.3)])], ranks=(5, 7, 6, 4))
    assert (v["phase"], v["rank"], v["median"], v["excess"]) == (1, 7, 0.2, 0.3 - 0.2)
    # the others' median: 3 others, the middle one; 2 others, the mean of the two
    assert view([(0, [(0.1, 0.9, 0.2, 0.4)])])["median"] == 0.2
    assert view([(0, [(0.1, 0.9, 0.2)])], ranks=(0, 1, 2))["median"] == (0.1 + 0.2) / 2
    # ints count, as floats; NaN, inf, bools, None and strings do not
    v = view([(0, [(1, math.nan, 3, True)])])
    assert (v["rank"], v["median"], v["excess"]) == (2, 1.0, 2.0) and type(v["median"]) is float
    assert "rank" not in view([(0, [(math.inf, None, 0.5, "1")])])        # one counted value
    # one rank alone: nothing
    assert "rank" not in view([(0, [(0.5,)])], ranks=(3,))


@pytest.mark.parametrize("impl", LOOPS)
def test_phase_straggler_takes_the_first_significant_phase_over_a_larger_excess(impl):
    cols = [(0, [(0.01, 0.10)]), (1, [(0.5, 0.2)])]                  # excess 0.09, then 0.3
    times = [(1.0, 1.0)]
    v = _phase_view(impl, cols, times, [(0, 1)], 0.05)[0]
    assert (v["phase"], v["rank"]) == (0, 1)                           # 0.09 >= 5 % of 1.0
    v = _phase_view(impl, cols, [(10.0, None)], [(0, 1)], 0.05)[0]     # 0.09 < 5 % of 10: the largest
    assert (v["phase"], v["rank"]) == (1, 0)
    v = _phase_view(impl, cols, None, [(0, 1)], 0.05)[0]               # no step time: the largest
    assert v["phase"] == 1
    v = _phase_view(impl, [(3, [(0.0, 0.1)]), (1, [(0.5, 0.2)])], [(2.0, 2.0)], [(0, 1)], 0.05)[0]
    assert v["phase"] == 3                                             # an excess of exactly the floor


@pytest.mark.parametrize("impl", LOOPS)
def test_phase_straggler_odd_input(impl):
    # a column shorter than the steps: its missing cells are None
    values = _phase_view(impl, [(2, [(0.1, 0.2)])], [], [(0, 1), (0, 1)], 0.05)
    assert values[0]["rank"] == 1 and "rank" not in values[1]
    # a cell that is neither a tuple nor None: TypeError, the steps before it written
    values = [{}, {}]
    with pytest.raises(TypeError):
        impl.phase_straggler([(0, [(0.1, 0.2), [0.1, 0.2]])], None, [(0, 1), (0, 1)], values, 0.05, KEYS)
    assert values[0]["rank"] == 1 and values[1] == {}
    with pytest.raises(TypeError):
        impl.phase_straggler([], [0.5], [(0,)], [{}], 0.05, KEYS)
    # a step without ranks, a cell longer than the ranks: values paired with ranks as zip() pairs them
    values = _phase_view(impl, [(0, [(0.1, 0.2), (0.1, 0.2, 0.9)])], None, [(), (4, 5)], 0.05)
    assert values[0] == {"before": 1} and (values[1]["rank"], values[1]["excess"]) == (5, 0.2 - 0.1)


@native
def test_phase_straggler_with_thousands_of_ranks():
    ranks = tuple(range(5000))
    # shuffled values, 3 in 4 of them zeros of either sign: the median is one, which sign is the sort's order
    cell = tuple((r * 7919) % 5000 / 1000 if r % 4 == 0 else (-0.0 if r % 3 else 0.0) for r in ranks)
    got, want = (_phase_view(impl, [(1, [cell])], None, [ranks], 0.05) for impl in (hotpath.native, python_loops))
    assert _same(got, want) and got[0]["rank"] == cell.index(max(cell))


def test_read_frames_upto_twins_stop_at_the_frame_that_reaches_max_bytes():
    """The intake's read (intake.Intake.fill): at most max_frames, and what it holds at once is at
    most max_bytes plus one frame, whatever sizes come; the C twin and loops.py agree."""
    import random

    import zmq

    from telemetry.daemon import hotpath, loops

    rng = random.Random(7)
    for _ in range(200):
        frames = [bytes(rng.randrange(0, 5000)) for _ in range(rng.randrange(0, 40))]
        max_frames, max_bytes = rng.randrange(1, 50), rng.randrange(1, 60_000)
        results = []
        for impl in filter(None, (loops, hotpath.native)):
            it = iter(frames)

            def next_frame():
                try:
                    return next(it)
                except StopIteration:
                    raise zmq.Again() from None

            got, size = impl.read_frames_upto(next_frame, zmq.Again, max_frames, max_bytes)
            assert size == sum(map(len, got)) and got == frames[:len(got)]
            assert len(got) <= max_frames and (not got or size - len(got[-1]) < max_bytes)
            assert len(got) == len(frames) or len(got) == max_frames or size >= max_bytes
            results.append((got, size))
        assert all(r == results[0] for r in results)
