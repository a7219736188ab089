"""Each closed step's values dict from the reduced columns (`aggregator.step_values`): keys in the
step's own order and the reduced values themselves, for batches whose steps share their names
(the usual case, a faster path) and batches whose steps do not. It has no C twin since issue 28
item 6: the twin bought 5 % of ingest, under the 10 % a C loop needs to keep its place."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.daemon import hotpath, loops
from telemetry.daemon.aggregator import step_values as _step_values

NAMES = ("train/loss", "perf/tokens", "perf/step_time", "a", "b", "c")


@st.composite
def reduced_batches(draw):
    num_steps = draw(st.integers(0, 8))
    shared = draw(st.booleans())
    first = tuple(draw(st.lists(st.sampled_from(NAMES), unique=True)))
    names = [first if shared else tuple(draw(st.lists(st.sampled_from(NAMES), unique=True)))
             for _ in range(num_steps)]
    if shared and draw(st.booleans()):
        names = [tuple(n) for n in names]          # equal tuples, not the same object
    used = {n for step in names for n in step}
    values = st.one_of(st.none(), st.floats(allow_nan=True), st.integers(), st.booleans())
    reduced = {n: [draw(values) for _ in range(num_steps)] for n in sorted(used)}
    return names, reduced


@settings(max_examples=500, deadline=None)
@given(reduced_batches())
def test_step_values_gives_each_steps_own_names_and_the_reduced_values(batch):
    names, reduced = batch
    got = _step_values(names, reduced)
    assert len(got) == len(names)
    for i, (g, step_names) in enumerate(zip(got, names)):
        assert list(g) == list(step_names)
        assert all(g[k] is reduced[k][i] for k in step_names)       # the reduced values themselves


def test_step_values_cases():
    reduced = {"a": [1, 2, 3], "b": [None, 2.5, -0.0]}
    step_values = _step_values
    assert step_values([("a", "b"), ("b", "a"), ("a",)], reduced) == [{"a": 1, "b": None}, {"b": 2.5, "a": 2}, {"a": 3}]
    assert list(step_values([("b", "a")] * 3, reduced)[2]) == ["b", "a"]
    assert step_values([], {}) == []
    with pytest.raises(KeyError):
        step_values([("a", "x")], reduced)


def test_the_twins_are_all_there_on_both_sides():
    for twin in hotpath.TWINS:
        assert callable(getattr(loops, twin))
        if hotpath.native is not None:
            assert callable(getattr(hotpath.native, twin))
    assert "step_values" not in hotpath.TWINS
