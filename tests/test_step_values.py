"""Each closed step's values dict from the reduced columns (`step_values`): the C twin gives the
Python one's dicts, keys in the same order and the values themselves, for batches whose steps
share their names (the usual case) and batches whose steps do not."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.daemon import hotpath, loops

native = pytest.mark.skipif(hotpath.native is None, reason="the C loops are not built here")
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


@native
@settings(max_examples=500, deadline=None)
@given(reduced_batches())
def test_step_values_in_c_equals_python(batch):
    names, reduced = batch
    got, want = hotpath.native.step_values(names, reduced), loops.step_values(names, reduced)
    assert len(got) == len(want) == len(names)
    for g, w, step_names in zip(got, want, names):
        assert list(g) == list(w) == list(step_names)
        assert all(g[k] is w[k] for k in w)       # the reduced values themselves


@pytest.mark.parametrize("step_values", [pytest.param(loops.step_values, id="python"),
                                         pytest.param(getattr(hotpath.native, "step_values", None), id="c",
                                                      marks=native)])
def test_step_values_cases(step_values):
    reduced = {"a": [1, 2, 3], "b": [None, 2.5, -0.0]}
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
