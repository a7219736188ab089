"""The column reductions in C (`_hotpath.reduce_column`) give what their Python twin
(`reductions.reduce_column`) gives, value by value and type by type: cells of floats (NaN, ±inf,
-0.0, sums that overflow to inf), of ints (near 2**53, where int / int stops being a division of
doubles, and past 2**63, where the C's 64-bit sums overflow), bools, mixtures, missing values
(None) and cells that are None; the same exception where Python raises one."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.daemon import hotpath, loops
from telemetry.daemon import reductions
from telemetry.daemon.reductions import CODES, LAST, MAX, MEAN, MIN, SUM, Reducer

native = pytest.mark.skipif(hotpath.native is None, reason="the C loops are not built here")

INT = st.one_of(st.integers(-1000, 1000), st.integers(-2**53 - 4, 2**53 + 4), st.integers(2**62, 2**64),
                st.integers(-2**64, -2**62), st.sampled_from([2**53, 2**53 + 1, -2**53, 2**63 - 1, -2**63]))
FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 0.1, 1e308, -1e308]))
VALUE = st.one_of(FLOAT, FLOAT, INT, INT, st.booleans(), st.none())


@st.composite
def columns(draw):
    """A column as a StepBatch holds one: per step a tuple (or, in a window, a list) of values,
    or None. Most columns are of one type, as a real metric's are."""
    kind = draw(st.sampled_from(["float", "int", "any"]))
    value = {"float": st.one_of(FLOAT, FLOAT, FLOAT, st.none()),
             "int": st.one_of(INT, INT, INT, st.none()), "any": VALUE}[kind]
    cells = []
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.integers(0, 9)) == 0:
            cells.append(None)
            continue
        cell = draw(st.lists(value, min_size=1, max_size=9))
        cells.append(tuple(cell) if draw(st.booleans()) else cell)
    return cells


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return repr(a) == repr(b)            # NaN is NaN, and -0.0 is not 0.0
    return type(a) is type(b) and a == b


def _run(func, column, op):
    try:
        return func(column, op), None
    except Exception as exc:                  # the twins raise alike, or both not at all
        return None, type(exc)


@native
@settings(max_examples=2000, deadline=None)
@given(columns(), st.sampled_from([MEAN, SUM, MAX, MIN, LAST]))
def test_reduce_column_in_c_equals_python(column, op):
    (got, got_exc), (want, want_exc) = _run(hotpath.native.reduce_column, column, op), _run(loops.reduce_column, column, op)
    assert got_exc is want_exc
    if want_exc is not None:
        return
    assert type(got) is list and len(got) == len(want) == len(column)
    for g, w in zip(got, want):
        assert _same(g, w), (column, op, got, want)
        if op in (MAX, MIN, LAST):                # the item itself, as max() and min() return it
            assert g is w


@pytest.mark.parametrize("reduce", [pytest.param(loops.reduce_column, id="python"),
                                    pytest.param(getattr(hotpath.native, "reduce_column", None), id="c",
                                                 marks=native)])
def test_reduce_column_cases(reduce):
    nan = float("nan")
    column = [(1.0, 2.0, 4.0), (1, 2, 4), (True, True), (-0.0,), (-0.0, -0.0), (None, 2.5, None), (None, None), None,
              (nan, 1.0), (1.0, nan), (2**63, 1), (2**53 + 1, 0)]
    assert [repr(x) for x in reduce(column, MEAN)] == [repr(x) for x in [
        7 / 3, 7 / 3, 1.0, -0.0, 0.0, 2.5, None, None, nan, nan, (2**63 + 1) / 2, (2**53 + 1) / 2]]
    assert [repr(x) for x in reduce(column, SUM)] == [repr(x) for x in [
        7.0, 7, 2, -0.0, 0.0, 2.5, None, None, nan, nan, 2**63 + 1, 2**53 + 1]]
    assert [repr(x) for x in reduce(column, MAX)] == [repr(x) for x in [
        4.0, 4, True, -0.0, -0.0, 2.5, None, None, nan, 1.0, 2**63, 2**53 + 1]]
    assert [repr(x) for x in reduce(column, MIN)] == [repr(x) for x in [
        1.0, 1, True, -0.0, -0.0, 2.5, None, None, nan, 1.0, 1, 0]]
    assert [repr(x) for x in reduce(column, LAST)] == [repr(x) for x in [
        4.0, 4, True, -0.0, -0.0, 2.5, None, None, 1.0, nan, 1, 0]]
    with pytest.raises(ValueError):
        reduce(column, 5)
    with pytest.raises(TypeError):
        reduce([("a", 1)], SUM)


def test_the_codes_are_the_c_enum_and_every_rule_has_one():
    # _hotpath.c's enum: OP_MEAN, OP_SUM, OP_MAX, OP_MIN, OP_LAST
    assert (MEAN, SUM, MAX, MIN, LAST) == (0, 1, 2, 3, 4)
    assert [reductions.BY_CODE[code] for code in CODES.values()] == list(reductions.FUNCS.values())


@native
def test_the_aggregator_reduces_with_the_loops_it_was_given():
    calls = []

    def counting(column, op):
        calls.append(op)
        return hotpath.native.reduce_column(column, op)

    r = Reducer({"m": "max", "n": "sum"})
    assert r.reduce_columns({"m": [(1.0, 3.0)], "n": [(1, 2)], "o": [(1.0, 2.0)]}, counting) == {
        "m": [3.0], "n": [3], "o": [1.5]}
    assert calls == [MAX, SUM, MEAN]


def _straggler_view_by_step(batch) -> list[dict]:
    """The straggler view step by step, as the aggregator computed it before it used the column
    reductions: the reference the column version must match."""
    out = []
    for times, ranks in zip(batch.column("perf/step_time"), batch.ranks):
        v: dict = {}
        out.append(v)
        if times is None:
            continue
        ranks = [r for r, t in zip(ranks, times) if t is not None]
        times = [t for t in times if t is not None]
        if not times:
            continue
        slowest = max(times)
        v["perf/step_time_max"], v["perf/step_time_min"] = slowest, min(times)
        v["perf/slowest_rank"] = ranks[times.index(slowest)]
    return out


@st.composite
def step_time_batches(draw):
    from telemetry.daemon.steps import StepBatch

    num_steps = draw(st.integers(1, 6))
    ranks, cells = [], []
    for _ in range(num_steps):
        world = draw(st.integers(1, 6))
        ranks.append(tuple(draw(st.permutations(range(world)))))
        cells.append(None if draw(st.integers(0, 5)) == 0 else
                     tuple(draw(st.one_of(FLOAT, FLOAT, st.none(), INT)) for _ in range(world)))
    return StepBatch(steps=list(range(num_steps)), t_ns=[0] * num_steps, ranks=ranks, names=[()] * num_steps,
                     columns={"perf/step_time": cells})


@settings(max_examples=500, deadline=None)
@given(step_time_batches())
def test_the_straggler_view_from_the_column_reductions_is_the_step_by_step_one(batch):
    from telemetry.daemon.straggler_view import add_step_time_view

    want = _straggler_view_by_step(batch)
    for reduce in filter(None, (loops.reduce_column, getattr(hotpath.native, "reduce_column", None))):
        got = [{} for _ in range(len(batch))]
        add_step_time_view(batch, got, reduce)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert list(g) == list(w) and all(_same(g[k], w[k]) for k in w), (batch, got, want)
