"""Structure-aware fuzzing of a real daemon: records that look valid (the right kinds, headers
and bodies) with hostile contents: invalid UTF-8 in any string, msgpack ext types, nil/int/array
map keys, None/str/NaN/huge numbers where numbers are expected, model configs with zero heads
or 10^12 layers, world sizes of 10^9, bogus ranks and seqs.

Against a daemon process (C inner loops, and TELEMETRY_PURE_PYTHON=1): after every example it
is alive, answers status, and every frame is accounted for (records_in + records_malformed ==
frames sent), with no record reaching the pipeline's last-resort counter (records_failed: what
the boundary should have caught).
"""
from __future__ import annotations

import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon_util import start_daemon

# A string in the frame whose bytes are replaced by invalid UTF-8 of the same length after
# packing (msgpack cannot pack an invalid str itself): lone continuation bytes, an encoded
# surrogate, an overlong NUL.
BAD_UTF8_MARK = "\u2603BADUTF8"          # 10 bytes in UTF-8
BAD_UTF8_BYTES = b"\xff\xfe\xed\xa0\x80\xc0\x80zz\x80"
assert len(BAD_UTF8_MARK.encode()) == len(BAD_UTF8_BYTES)

U63 = (1 << 63) - 1
hostile_numbers = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1),
    st.sampled_from([0, -1, 1, 10**12, 10**18, U63, 1e308, -1e308, 5e-324, float("inf"), float("nan")]),
)
hostile_text = st.one_of(st.text(max_size=12), st.just(BAD_UTF8_MARK), st.just(""), st.just("x" * 300))
hostile_keys = st.one_of(hostile_text, st.none(), st.integers(min_value=-5, max_value=5), st.booleans(),
                         st.tuples(st.integers(0, 3), st.integers(0, 3)))
scalars = st.one_of(hostile_numbers, hostile_text, st.binary(max_size=8),
                    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)))
hostile_data = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(hostile_keys, inner, max_size=3)),
    max_leaves=12)

MODEL_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "num_local_experts", "num_experts_per_tok",
              "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers")
# Mostly sane sizes (so the config gets as far as the formula), some hostile.
sizes = st.one_of(st.integers(1, 64), st.integers(1, 64), hostile_numbers, st.sampled_from([10**12, 0]))
hf_config = st.fixed_dictionaries(
    {"model_type": st.sampled_from(["llama", "gpt2", "qwen2_moe", "mixtral", BAD_UTF8_MARK]),
     **{k: sizes for k in MODEL_KEYS[1:8]}},
    optional={k: st.one_of(sizes, st.lists(sizes, max_size=3)) for k in MODEL_KEYS[8:]})
model = st.fixed_dictionaries({"hf_config": hf_config},
                              optional={"seq_len": hostile_numbers, "dtype": hostile_text, "causal": scalars,
                                        "gradient_checkpointing": scalars})
hello_info = st.fixed_dictionaries(
    {}, optional={"world_size": st.one_of(hostile_numbers, st.sampled_from([10**6, 10**9, 1 << 62])),
                  "model": model, "pid": hostile_numbers, "host": hostile_text, "device_name": hostile_text,
                  "peak_flops": hostile_numbers, "config": hostile_data, "x": hostile_data})
# Metric names the derived stages read, with hostile values beside ordinary ones.
PERF = ["perf/step_time", "perf/tokens", "perf/samples", "perf/attn_doc_len_sq", "perf/tokens_per_second",
        "train/loss", "train/grad_norm", "perf/step_time_max"]
metric_values = st.dictionaries(st.one_of(st.sampled_from(PERF), hostile_text), hostile_numbers, max_size=6)

ranks = st.one_of(st.integers(0, 3), st.sampled_from([U63, 1 << 40, 7]))
seqs = st.one_of(st.integers(0, 50), st.sampled_from([U63, U63 - 1, 1 << 40]))


@st.composite
def records(draw) -> bytes:
    kind = draw(st.sampled_from([1, 2, 2, 2, 3, 4]))
    src = draw(st.sampled_from([11, 12, 13, U63]))
    header = [kind, 1, src, draw(ranks), draw(seqs), draw(st.sampled_from([0, 1, U63])),
              draw(st.sampled_from([0, 1, U63, time.time_ns()]))]
    if kind == 1:
        body = [draw(hello_info)]
    elif kind == 2:
        body = [draw(st.one_of(st.integers(0, 20), st.sampled_from([U63, 1 << 40]))), draw(metric_values)]
    elif kind == 3:
        body = [draw(st.one_of(st.just("diagnosis/x"), hostile_text)), draw(st.dictionaries(hostile_keys, hostile_data, max_size=4))]
    else:
        body = [draw(st.dictionaries(st.one_of(st.sampled_from(["records_sent", "records_dropped"]), hostile_keys),
                                     hostile_data, max_size=4))]
    frame = msgpack.packb(header + body, use_bin_type=True)
    return frame.replace(BAD_UTF8_MARK.encode(), BAD_UTF8_BYTES)


def _settle(d, expected: int, timeout_s: float = 30.0) -> dict:
    """Status once every frame sent so far is accounted for (or the deadline: then the last)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert d.proc.poll() is None, f"daemon died:\n{d.output()[-3000:]}"
        s = d.status(timeout_s=60.0)
        if s["records_in"] + s["records_malformed"] >= expected or time.monotonic() > deadline:
            return s
        time.sleep(0.02)


@pytest.mark.parametrize("pure_python", [False, True], ids=["c_loops", "python_loops"])
def test_hostile_records_never_stop_the_daemon(tmp_path, pure_python):
    env = {"TELEMETRY_PURE_PYTHON": "1" if pure_python else "0"}
    d = start_daemon(tmp_path, transport="tcp", env=env, config={"aggregator": {"step_timeout_s": 0.2}})
    ctx = zmq.Context()
    push = d.push(ctx)
    sent = [0]
    try:
        assert d.status()["inner_loops"] == ("python" if pure_python else "c")

        @settings(max_examples=300, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(records(), min_size=1, max_size=8))
        def example(frames):
            for f in frames:
                push.send(f)
            sent[0] += len(frames)
            s = _settle(d, sent[0])
            assert s["records_in"] + s["records_malformed"] == sent[0], s
            assert s["records_failed"] == 0, d.output()[-3000:]
            assert s["records_lost"] < 10**6, s       # bounded by what was sent, not by a seq of 2^63
            assert s["world_size"] <= 1 << 16, s

        example()
        # Still ingesting ordinary records after all that.
        from protocol import encode_metrics
        for step in range(3):
            push.send(encode_metrics(99, 0, step, 0, time.time_ns(), 1000 + step, {"train/loss": 1.0}))
        sent[0] += 3
        s = _settle(d, sent[0])
        assert s["records_in"] + s["records_malformed"] == sent[0]
        assert d.stop() == 0, d.output()[-3000:]
        assert "Traceback" not in d.output(), d.output()[-3000:]
        # What reached the source of truth is valid JSON, line by line.
        for rec in d.read_jsonl():
            assert isinstance(rec, dict)
    finally:
        push.close(linger=0)
        ctx.term()
        d.cleanup()
