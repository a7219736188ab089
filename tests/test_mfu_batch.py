"""MFU over a batch of steps (`MfuEstimator.step_metrics_batch`, what the daemon runs) gives
step_metrics_columns' figures step by step, with the Python and the C `rate_sums`; and the two
`rate_sums` agree value by value (positive ints and floats summed, NaN, 0, inf, bools, big ints,
None and cells of different lengths sent the slow way)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.daemon import hotpath, loops
from telemetry.daemon.mfu import MfuEstimator

native = pytest.mark.skipif(hotpath.native is None, reason="the C loops are not built here")

LLAMA = {"hf_config": {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000},
         "seq_len": 128, "dtype": "bf16", "causal": True}
GOOD = st.one_of(st.floats(1e-6, 1e12), st.integers(1, 2**53))
ODD = st.one_of(st.sampled_from([0, 0.0, -1.0, float("nan"), float("inf"), True, 2**53 + 1, 2**70, None, "x"]),
                st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**64, 2**64))
VALUE = st.one_of(GOOD, GOOD, GOOD, ODD)


def _cell(draw, n: int, any_length: bool):
    if draw(st.integers(0, 7)) == 0:
        return None
    size = draw(st.integers(0, 8)) if any_length and draw(st.integers(0, 7)) == 0 else n
    cell = [draw(VALUE) for _ in range(size)]
    return tuple(cell) if draw(st.booleans()) else cell


@st.composite
def mfu_columns(draw, any_length: bool = False):
    """Columns as a StepBatch has them (per step one value per rank, or None); with any_length,
    now and then cells of other lengths, empty ones too."""
    tokens, doc_sq, times = [], [], []
    for _ in range(draw(st.integers(0, 8))):
        n = draw(st.integers(1, 8))
        tokens.append(_cell(draw, n, any_length))
        times.append(_cell(draw, n, any_length))
        doc_sq.append(None if draw(st.booleans()) else _cell(draw, n, any_length))
    return tokens, doc_sq, times


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return repr(a) == repr(b)
    return type(a) is type(b) and a == b


@native
@settings(max_examples=1500, deadline=None)
@given(mfu_columns(any_length=True))
def test_rate_sums_in_c_equals_python(columns):
    tokens, _, times = columns
    got, want = hotpath.native.rate_sums(tokens, times), loops.rate_sums(tokens, times)
    assert type(got) is list and len(got) == len(want)
    assert all(map(_same, got, want)), (tokens, times, got, want)


def test_rate_sums_cases():
    for rate_sums in filter(None, (loops.rate_sums, getattr(hotpath.native, "rate_sums", None))):
        assert rate_sums([(4096, 2048), (1, 2), None, (1,), (1, 2.0), (), (True,), (1.0, float("nan"))],
                         [(0.5, 0.25), [2.0, 4.0], (1.0,), None, (1.0, 0.0), (), (1.0,), (1.0, 1.0)]) == [
            4096 / 0.5 + 2048 / 0.25, 1 / 2.0 + 2 / 4.0, None, None, None, None, None, None]


@pytest.mark.parametrize("seq_len", [128, 0])
@pytest.mark.parametrize("peak", [1e15, None])
@settings(max_examples=300, deadline=None)
@given(columns=mfu_columns(), world_size=st.sampled_from([None, 0, 1, 8]))
def test_step_metrics_batch_is_step_metrics_columns_step_by_step(seq_len, peak, columns, world_size):
    est = MfuEstimator.from_hello({"model": {**LLAMA, "seq_len": seq_len}, "device_name": "NVIDIA H100 80GB HBM3"},
                                  peak_override=peak)
    tokens, doc_sq, times = columns
    want = [{} if ts is None or ns is None else est.step_metrics_columns(ns, sq, ts, world_size)
            for ns, sq, ts in zip(tokens, doc_sq, times)]
    for rate_sums in filter(None, (loops.rate_sums, getattr(hotpath.native, "rate_sums", None))):
        try:
            got = est.step_metrics_batch(tokens, doc_sq, times, world_size, rate_sums)
        except Exception as exc:          # only where step by step raises too
            with pytest.raises(type(exc)):
                [est.step_metrics_columns(ns, sq, ts, world_size) for ns, sq, ts in zip(tokens, doc_sq, times)
                 if ts is not None and ns is not None]
            continue
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert list(g) == list(w) and all(_same(g[k], w[k]) for k in w), (columns, got, want)


@settings(max_examples=300, deadline=None)
@given(VALUE)
def test_one_positive_finite_for_the_hot_loops_and_a_hellos_figures(v):
    # Issue 28: MFU's reading of a hello took True as 1 and "4096" as 4096 where the loops (and
    # the C twin) refuse both; one definition now (telemetry.shared.numbers).
    from telemetry.shared.numbers import positive_finite

    assert (positive_finite(v) is not None) == loops._positive_finite(v), v
    est = MfuEstimator.from_hello({"model": {**LLAMA, "seq_len": v}, "peak_flops": v, "device_name": "unknown"})
    assert est.seq_len == (int(v) if positive_finite(v) is not None else 0), v
    assert est.peak_flops_per_device == positive_finite(v), v


def test_a_bool_or_a_string_in_a_hello_is_no_figure():
    for v in (True, "4096", "1e15"):
        est = MfuEstimator.from_hello({"model": {**LLAMA, "seq_len": v}, "peak_flops": v, "device_name": "unknown"})
        assert est.seq_len == 0 and est.peak_flops_per_device is None, v
