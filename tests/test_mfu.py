"""The FLOPs formula against torch's FlopCounterMode (eager attention, CPU, tiny configs)."""
from __future__ import annotations

import logging
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from telemetry.daemon import mfu  # noqa: E402

warnings.filterwarnings("ignore", module="transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

BATCH, SEQ, VOCAB = 2, 16, 128
DENSE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=VOCAB, max_position_embeddings=64)
FAMILIES = {
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64,
                 bos_token_id=0, eos_token_id=0),
    "gpt2_n_inner": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_inner=80,
                         vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0),
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64,
                        bos_token_id=0, eos_token_id=0),  # multi_query: one kv head
    "llama": DENSE,
    "llama_head_dim_mqa": dict(DENSE, model_type="llama", num_key_value_heads=1, head_dim=24),
    "qwen2": DENSE,
    "mistral": DENSE,
    "gemma": dict(DENSE, num_key_value_heads=1, head_dim=24),
    "gemma2": dict(DENSE, head_dim=24),
    "gemma3_text": dict(DENSE, head_dim=24),
    "qwen3": dict(DENSE, head_dim=24),
    "phi3": dict(DENSE, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "gpt_neox": DENSE,  # multi-head only: num_key_value_heads is ignored by the model
    "starcoder2": DENSE,
    "olmo2": DENSE,
    "mixtral": dict(DENSE, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(DENSE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, mlp_only_layers=[1]),
    "qwen3_moe": dict(DENSE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=24),
}


def make_config(name: str):
    kwargs = dict(FAMILIES[name])
    model_type = kwargs.pop("model_type", name)
    return AutoConfig.for_model(model_type, **kwargs)


def counted_flops(cfg, input_ids, gradient_checkpointing: bool = False, use_reentrant: bool = True) -> int:
    """FlopCounterMode's total for forward + backward of the causal-LM loss."""
    torch.manual_seed(0)
    extra = {"experts_implementation": "eager"} if getattr(cfg, "num_experts_per_tok", None) else {}
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", **extra)
    model.train()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    with FlopCounterMode(display=False) as counter:
        model(input_ids=input_ids, labels=input_ids).loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_formula_equals_flop_counter(name):
    cfg = make_config(name)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    counted = counted_flops(cfg, input_ids)
    per_token = mfu.training_flops_per_token(cfg, SEQ)
    assert per_token * BATCH * SEQ == counted
    # the daemon gets the config as a dict (model.config.to_dict())
    assert mfu.training_flops_per_token(cfg.to_dict(), SEQ) == per_token
    assert mfu.training_flops(cfg.to_dict(), BATCH * SEQ, BATCH * SEQ * SEQ) == counted


def test_llama_by_hand():
    cfg = make_config("llama")
    # per layer q 64*64 + k,v 2*(32*64) + o 64*64 + MLP 3*64*96; two layers; LM head 64*128
    n = 2 * (4096 + 4096 + 4096 + 3 * 6144) + 8192
    assert mfu.model_shape(cfg).matmul_params == n == 69_632
    attn_fwd_per_sq = 4 * 2 * 4 * 16  # 4 * L * H * head_dim
    assert mfu.training_flops_per_token(cfg, SEQ) == 6 * n + 3 * attn_fwd_per_sq * SEQ == 442_368
    assert mfu.training_flops_per_token(cfg, SEQ, causal=True) == 6 * n + 3 * attn_fwd_per_sq * SEQ // 2
    # packed: documents of 3, 5 and 8 tokens in one 16-token row
    sum_sq = 3 * 3 + 5 * 5 + 8 * 8
    assert mfu.training_flops(cfg, 16, sum_sq) == 6 * n * 16 + 12 * 2 * 4 * 16 * 98 == 6_835_200
    assert mfu.training_flops(cfg, 16, sum_sq, causal=True) == 6 * n * 16 + 6 * 2 * 4 * 16 * 98
    assert mfu.forward_flops(cfg, 16, sum_sq) * 3 == mfu.training_flops(cfg, 16, sum_sq)


def test_packed_equals_documents_run_one_by_one():
    """Σ Lᵢ² is what the documents cost when each is attended to on its own."""
    cfg = make_config("qwen2")
    lengths = [3, 5, 8]
    total = sum(counted_flops(cfg, torch.randint(0, VOCAB, (1, n))) for n in lengths)
    assert mfu.training_flops(cfg, sum(lengths), sum(n * n for n in lengths)) == total
    # and the unpacked count for the same 16 tokens is larger: packing must not inflate MFU
    assert mfu.training_flops(cfg, 16, 16 * 16) > total


@pytest.mark.parametrize("name,use_reentrant", [("llama", True), ("gpt2", True), ("gpt2", False)])
def test_hardware_flops_with_gradient_checkpointing(name, use_reentrant):
    cfg = make_config(name)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    counted = counted_flops(cfg, input_ids, gradient_checkpointing=True, use_reentrant=use_reentrant)
    tokens, sum_sq = BATCH * SEQ, BATCH * SEQ * SEQ
    assert mfu.hardware_flops(cfg, tokens, sum_sq, gradient_checkpointing=True) == counted
    assert mfu.hardware_flops(cfg, tokens, sum_sq) == mfu.training_flops(cfg, tokens, sum_sq) < counted


def test_nested_text_config_and_plain_object():
    inner = make_config("gemma3_text").to_dict()
    wrapper = {"model_type": "gemma3", "text_config": inner, "vision_config": {"hidden_size": 1}}
    assert mfu.training_flops_per_token(wrapper, SEQ) == mfu.training_flops_per_token(inner, SEQ)


def test_missing_attribute_is_named():
    cfg = make_config("llama").to_dict()
    del cfg["hidden_size"]
    with pytest.raises(ValueError, match="'hidden_size'.*'n_embd'"):
        mfu.training_flops_per_token(cfg, SEQ)
    with pytest.raises(ValueError, match="'vocab_size'"):
        mfu.training_flops_per_token({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1,
                                      "num_attention_heads": 2, "intermediate_size": 8}, SEQ)
    with pytest.raises(ValueError, match="encoder-decoder"):
        mfu.training_flops_per_token({"model_type": "t5", "is_encoder_decoder": True}, SEQ)
    with pytest.raises(ValueError, match="seq_len"):
        mfu.training_flops_per_token(make_config("llama"), 0)
