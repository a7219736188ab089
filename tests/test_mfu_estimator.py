"""MfuEstimator: the daemon's per-step MFU from a hello and the ranks' synthetic values."""
from __future__ import annotations

import pytest

from mfu_util import step_metrics
from telemetry.daemon.mfu import MfuEstimator, hardware_flops, training_flops

# Llama-shaped, from to_dict()-style keys; GPT-2 spelled its own way
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": None, "intermediate_size": 96, "vocab_size": 128,
         "tie_word_embeddings": False}
N = 69_632                # matmul weights incl. LM head (see test_mfu.test_llama_by_hand)
ATTN = 4 * 2 * 4 * 16     # forward attention FLOPs per unit of sum L_i^2
H100 = 989.4e12


def hello(**model):
    base = {"hf_config": LLAMA, "num_params": 1, "seq_len": 16, "gradient_checkpointing": False,
            "dtype": "bf16", "causal": True}
    return {"model": {**base, **model}, "device_name": "NVIDIA H100 80GB HBM3"}


def test_two_ranks_packed_causal_by_hand():
    est = MfuEstimator.from_hello(hello(), halve_causal=True)
    assert est.peak_flops_per_device == pytest.approx(H100)
    per_rank = {0: {"perf/tokens": 1000, "perf/attn_doc_len_sq": 9000, "perf/step_time": 0.5},
                1: (800, 6400, 0.25)}  # the daemon's (tokens, sum L_i^2, step_time) rows work too
    out = step_metrics(est, per_rank, world_size=2)
    f0 = 6 * N * 1000 + 3 * ATTN * 9000 // 2
    f1 = 6 * N * 800 + 3 * ATTN * 6400 // 2
    rate = f0 / 0.5 + f1 / 0.25
    assert out["perf/model_flops_per_second"] == pytest.approx(rate)
    assert out["perf/mfu"] == pytest.approx(rate / (2 * H100))
    assert out["perf/mfu_percent"] == pytest.approx(100 * rate / (2 * H100))
    assert out["perf/hfu"] == pytest.approx(out["perf/mfu"])  # no recompute


def test_default_counts_full_attention_like_palm_and_megatron():
    """A causal model's attention is counted whole unless asked: MFU compares with PaLM's."""
    est = MfuEstimator.from_hello(hello(causal=True))
    out = step_metrics(est, {0: {"perf/tokens": 1000, "perf/attn_doc_len_sq": 9000, "perf/step_time": 0.5}})
    assert out["perf/model_flops_per_second"] == pytest.approx((6 * N * 1000 + 3 * ATTN * 9000) / 0.5)


def test_gradient_checkpointing_raises_hfu_only():
    est = MfuEstimator.from_hello(hello(gradient_checkpointing=True), halve_causal=True)
    out = step_metrics(est, {0: {"perf/tokens": 512, "perf/attn_doc_len_sq": 512 * 16, "perf/step_time": 1.0}})
    assert out["perf/mfu"] == pytest.approx(training_flops(LLAMA, 512, 512 * 16, causal=True) / H100)
    assert out["perf/hfu"] == pytest.approx(
        hardware_flops(LLAMA, 512, 512 * 16, causal=True, gradient_checkpointing=True) / H100)
    assert out["perf/hfu"] > out["perf/mfu"]


def test_gradient_accumulation_and_missing_doc_len():
    """perf/tokens covers all micro-batches of the step; without Σ Lᵢ², rows are seq_len long."""
    est = MfuEstimator.from_hello(hello(causal=False))
    one = step_metrics(est, {0: {"perf/tokens": 4 * 16, "perf/step_time": 1.0}})
    four = step_metrics(est, {0: {"perf/tokens": 4 * 4 * 16, "perf/step_time": 4.0}})  # 4 micro-batches
    assert one["perf/mfu"] == pytest.approx(four["perf/mfu"])
    assert one["perf/model_flops_per_second"] == (6 * N * 64 + 3 * ATTN * 64 * 16)


def test_missing_rank_is_extrapolated_for_throughput_not_mfu():
    est = MfuEstimator.from_hello(hello(), halve_causal=True)
    row = {"perf/tokens": 1000, "perf/attn_doc_len_sq": 16000, "perf/step_time": 1.0}
    both = step_metrics(est, {0: row, 1: row}, world_size=2)
    one = step_metrics(est, {0: row}, world_size=2)
    assert one["perf/mfu"] == pytest.approx(both["perf/mfu"])
    assert one["perf/model_flops_per_second"] == pytest.approx(both["perf/model_flops_per_second"])


def test_overrides_and_unknowns():
    unknown = {**hello(), "device_name": "cpu"}
    est = MfuEstimator.from_hello(unknown)
    out = step_metrics(est, {0: (100, 1600, 1.0)})
    assert "perf/mfu" not in out and out["perf/model_flops_per_second"] > 0
    est = MfuEstimator.from_hello(unknown, peak_override=1e12)
    assert step_metrics(est, {0: (100, 1600, 1.0)})["perf/mfu"] == pytest.approx(out["perf/model_flops_per_second"] / 1e12)
    tf32 = MfuEstimator.from_hello(hello(dtype="fp32"), dtype_override="tf32")
    assert tf32.peak_flops_per_device == pytest.approx(494.7e12)
    # hellos the estimator cannot use give {} instead of raising
    assert step_metrics(MfuEstimator.from_hello({}), {0: (100, 1600, 1.0)}) == {}
    bad = hello(hf_config={"model_type": "llama"})
    assert step_metrics(MfuEstimator.from_hello(bad), {0: (100, 1600, 1.0)}) == {}
    est = MfuEstimator.from_hello(hello())
    assert step_metrics(est, {0: (0, 0, 1.0), 1: (10, 100, 0.0), 2: "junk", 3: {}}) == {}
