"""Analytic model FLOPs and MFU: no profiler anywhere near the training step.

The formula (exact, checked against torch.utils.flop_counter.FlopCounterMode in tests):

    model FLOPs of one training step = 6 * N * tokens + 12 * L * H * d * sum_i(L_i^2)   [/2 on
                                                                       the attention term if causal]
    N  = the matmul weights a token passes through: per layer the attention projections
         (q: h*H*d, k and v: h*K*d each with K key-value heads (GQA/MQA), o: H*d*h) and the MLP
         (3 matrices h*I for gated families: Llama, Qwen2/3, Mistral, Gemma 1-3, Phi-3, OLMo;
         2 for GPT-2, GPT-NeoX, StarCoder2; MoE layers: top_k routed experts + shared expert +
         the h*E router), plus the LM head h*V, counted whether or not it is tied to the
         embedding. Embedding lookups, norms, biases, softmax, masks and the loss are not
         matmuls and FlopCounterMode counts none of them (bias adds ride along in addmm, which
         it counts as 2*m*n*k).
    L, H, d: layers, query heads, head_dim (explicit in the config, else hidden/heads). The
         attention term is QK^T and AV, 2 * 2*T*T*d per head and layer forward, 3x for
         forward+backward. Key-value heads do not appear: eager attention repeats them to H.
    sum_i(L_i^2): over the documents of the step. One unpacked batch of B rows of length T gives
         B*T^2, so per token 12*L*H*d*T: PaLM's 6N + 12LHQT. With packing the trainer sends the
         real sum, so that attention across document boundaries (masked, or never computed by
         varlen kernels) does not inflate MFU.

6 = 2 (multiply-add) x 3 (forward, input gradient, weight gradient). FlopCounterMode (eager
attention, fp32, CPU) counts exactly this for GPT-2, Llama, Qwen2, Qwen3, Mistral, Gemma,
Gemma2/3, GPT-NeoX, GPT-BigCode (multi-query), StarCoder2, OLMo2, Phi-3 and, with
experts_implementation="eager", Mixtral, Qwen2-MoE and Qwen3-MoE.
`causal=True` halves the attention term (the work a causal kernel actually needs); the contract's
default, `causal=False`, is what eager attention computes and what PaLM and Megatron count.

Hardware FLOPs (HFU) add what gradient checkpointing recomputes: the forward of every decoder
layer again, 2 * N_layers * tokens + 4 * L * H * d * sum_i(L_i^2) (halved if causal). That is
exact for full recompute (reentrant checkpointing, Megatron "full"); torch's non-reentrant
checkpoint may skip a layer's last matmul when nothing after it saves activations (Llama's
down_proj), so there HFU reads high by 2*h*I*tokens per layer.

The daemon's side (telemetry/daemon/derived.py):

    est = MfuEstimator.from_hello(hello.info, peak_override=cfg.peak_flops or None,
                                  dtype_override=cfg.dtype or None, halve_causal=cfg.halve_causal)
    # once per batch of closed steps, from its columns (steps.StepBatch): one dict per step
    per_step = est.step_metrics_batch(batch.column("perf/tokens"), batch.column("perf/attn_doc_len_sq"),
                                      batch.column("perf/step_time"), world_size)

`from_hello` reads info["model"] = {"hf_config": dict, "seq_len": int, "causal": bool,
"gradient_checkpointing": bool, "dtype": "bf16"|...} and info["device_name"]; it never raises
(a hello it cannot use gives an estimator that returns {}). `step_metrics_columns` (one step:
rank i's values at i) and each dict of `step_metrics_batch` hold perf/model_flops_per_second
(cluster-wide) and, when the peak is known, perf/mfu (0..1), perf/mfu_percent and perf/hfu; {}
when they cannot be computed. Per-rank: perf/tokens are the
non-padding tokens of the whole optimizer step (all micro-batches: gradient accumulation is then
counted right), perf/step_time its wall time in seconds, perf/attn_doc_len_sq the step's
sum_i(L_i^2) (absent: every token is taken to sit in a full seq_len document).

    MFU = sum_r (flops_r / step_time_r) / (n_ranks * peak)

over the ranks that reported (n_ranks = world size when all did), the PaLM/Megatron definition.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from operator import truediv
from typing import Any, Mapping, Sequence

from telemetry.daemon import loops
from telemetry.daemon.peaks import normalize_dtype, peak_flops
from telemetry.shared.numbers import positive_finite

log = logging.getLogger("telemetry.daemon.mfu")

_INF = float("inf")

__all__ = [
    "ModelShape", "model_shape", "training_flops_per_token", "training_flops", "hardware_flops",
    "forward_flops", "peak_flops", "MfuEstimator",
]

# MLP matrix count by model_type. Gated MLPs (SwiGLU/GeGLU: gate, up, down) are the modern
# default; these families use a plain up/down pair.
TWO_MATRIX_MLP = frozenset({
    "gpt2", "gpt_neox", "gpt_bigcode", "gptj", "starcoder2", "opt", "phi", "bloom", "falcon",
})
# Families whose FLOPs were checked against FlopCounterMode (tests/test_mfu.py); others with
# the same attribute names are computed the same way, with one warning.
VERIFIED_FAMILIES = frozenset({
    "gpt2", "llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "gpt_neox",
    "starcoder2", "olmo2", "phi3", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_bigcode",
})
# Families whose attention is always multi-head (their configs may carry an unused
# num_key_value_heads).
MHA_ONLY = frozenset({"gpt2", "gpt_neox", "gptj", "opt", "bloom"})

# HF attribute name -> aliases other families use for it.
_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("n_embd", "d_model"),
    "num_hidden_layers": ("n_layer", "num_layers"),
    "num_attention_heads": ("n_head", "num_heads"),
    "intermediate_size": ("n_inner", "ffn_dim"),
    "vocab_size": (),
}
# Every config key the formula reads a size from, under any family's name (mfu-check refuses a
# config whose size there is not a positive integer before transformers divides by it).
SIZE_KEYS = (*(k for name, aliases in _ALIASES.items() for k in (name, *aliases)),
             "num_key_value_heads", "num_kv_heads", "head_dim")

_warned_families: set[str] = set()


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the FLOPs formula needs from a causal-LM config, in HF's terms."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_mlp_matrices: int
    # Mixture of experts (0 experts: dense). A token runs top_k experts of moe_intermediate_size
    # plus an always-on shared expert; the router is an h x num_experts matmul.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    num_moe_layers: int = 0

    @property
    def attn_matmul_params(self) -> int:
        """q, k, v, o projection weights of one layer."""
        q_and_o = 2 * self.hidden_size * self.num_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return q_and_o + k_and_v

    @property
    def dense_mlp_params(self) -> int:
        return self.num_mlp_matrices * self.hidden_size * self.intermediate_size

    @property
    def moe_mlp_params(self) -> int:
        """Active MLP weights of one MoE layer per token (top-k experts, shared expert, router)."""
        h = self.hidden_size
        routed = self.num_experts_per_tok * 3 * h * self.moe_intermediate_size
        shared = 3 * h * self.shared_expert_intermediate_size
        shared_gate = h if self.shared_expert_intermediate_size else 0
        return routed + shared + shared_gate + h * self.num_experts

    @property
    def layer_matmul_params(self) -> int:
        """Matmul weights a token meets in all decoder layers together."""
        num_dense = self.num_layers - self.num_moe_layers
        return (self.num_layers * self.attn_matmul_params + num_dense * self.dense_mlp_params
                + self.num_moe_layers * self.moe_mlp_params)

    @property
    def matmul_params(self) -> int:
        """N of the formula: decoder layers plus the LM head (tied or not)."""
        return self.layer_matmul_params + self.hidden_size * self.vocab_size

    @property
    def attn_flops_coeff(self) -> int:
        """Forward attention FLOPs per unit of sum_i(L_i^2): QK^T and AV, 2*d each, all heads."""
        return 4 * self.num_layers * self.num_heads * self.head_dim


def _as_dict(hf_config: Any) -> dict[str, Any]:
    if isinstance(hf_config, Mapping):
        d = dict(hf_config)
    elif hasattr(hf_config, "to_dict"):
        d = hf_config.to_dict()
    elif hasattr(hf_config, "__dict__"):
        d = dict(vars(hf_config))
    else:
        raise TypeError(f"hf_config must be a transformers config or a dict, not {type(hf_config).__name__}")
    # Multimodal wrappers (Gemma 3, Llava, ...) keep the language model under text_config.
    text = d.get("text_config")
    if isinstance(text, Mapping) and "hidden_size" not in d and "n_embd" not in d:
        d = {**dict(text), "model_type": text.get("model_type", d.get("model_type"))}
    return d


# Sane bounds on a config's dimensions (the largest real models are far inside them): a hello
# is input from the network, and a config with 10^12 layers or an infinite head_dim must not
# hang the daemon's loop or overflow its arithmetic; one outside them disables MFU, with a warning.
MAX_DIMENSION = 1 << 24        # hidden, intermediate, head_dim sizes
MAX_LAYERS = 1 << 14
MAX_HEADS = 1 << 16
MAX_VOCAB = 1 << 26
MAX_EXPERTS = 1 << 20


def _bounded(name: str, value: Any, limit: int, model_type: str, minimum: int = 1) -> int:
    """`value` as an int in minimum..limit, else ValueError naming it (never OverflowError or
    TypeError: NaN, infinity, a string, a list)."""
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        n = None
    if n is None or isinstance(value, bool) or not minimum <= n <= limit:
        raise ValueError(f"cannot compute FLOPs for model_type {model_type!r}: {name} = {value!r} is not "
                         f"an integer in {minimum}..{limit}")
    return n


def _get(d: Mapping[str, Any], name: str, model_type: str, limit: int = MAX_DIMENSION) -> int:
    for key in (name, *_ALIASES.get(name, ())):
        value = d.get(key)
        if value is not None:
            return _bounded(name, value, limit, model_type)
    aliases = _ALIASES.get(name, ())
    also = f" (nor {', '.join(repr(a) for a in aliases)})" if aliases else ""
    raise ValueError(f"cannot compute FLOPs for model_type {model_type!r}: the config has no "
                     f"{name!r}{also}; run `telemetry mfu-check` or set the FLOPs by hand")


def model_shape(hf_config: Any) -> ModelShape:
    """Read the formula's inputs from a transformers config object or its to_dict() output.

    Raises ValueError naming the missing attribute for a config it cannot read.
    """
    d = _as_dict(hf_config)
    model_type = str(d.get("model_type") or "unknown")
    if d.get("is_encoder_decoder"):
        raise ValueError(f"cannot compute FLOPs for model_type {model_type!r}: encoder-decoder "
                         "models are not supported (decoder-only causal LMs only)")
    hidden = _get(d, "hidden_size", model_type)
    num_layers = _get(d, "num_hidden_layers", model_type, MAX_LAYERS)
    num_heads = _get(d, "num_attention_heads", model_type, MAX_HEADS)
    vocab = _get(d, "vocab_size", model_type, MAX_VOCAB)
    kv = d.get("num_key_value_heads") or d.get("num_kv_heads")
    if model_type in MHA_ONLY:
        num_kv_heads = num_heads
    elif kv:
        num_kv_heads = _bounded("num_key_value_heads", kv, MAX_HEADS, model_type)
    elif d.get("multi_query") and not d.get("new_decoder_architecture"):
        num_kv_heads = 1  # GPTBigCode / Falcon-7B multi-query attention
    else:
        num_kv_heads = num_heads
    head_dim = d.get("head_dim")
    head_dim = _bounded("head_dim", head_dim, MAX_DIMENSION, model_type) if head_dim else hidden // num_heads
    if d.get("intermediate_size") is None and "n_inner" in d and d["n_inner"] is None:
        intermediate = 4 * hidden  # GPT-2 / GPTBigCode: n_inner=None means 4 * n_embd
    else:
        intermediate = _get(d, "intermediate_size", model_type)
    if model_type not in VERIFIED_FAMILIES and model_type not in _warned_families:
        _warned_families.add(model_type)
        log.warning("FLOPs formula not verified for model_type %r: assuming a %s MLP; check it with "
                    "`telemetry mfu-check`", model_type,
                    "2-matrix" if model_type in TWO_MATRIX_MLP else "gated 3-matrix")
    moe = _moe_fields(d, num_layers, model_type)
    return ModelShape(
        model_type=model_type, hidden_size=hidden, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, intermediate_size=intermediate,
        vocab_size=vocab, num_mlp_matrices=2 if model_type in TWO_MATRIX_MLP else 3, **moe)


def _moe_fields(d: Mapping[str, Any], num_layers: int, model_type: str) -> dict[str, int]:
    """num_layers is bounded already (MAX_LAYERS): the count below walks the layers."""
    num_experts = _bounded("num_experts", d.get("num_local_experts") or d.get("num_experts") or 0,
                           MAX_EXPERTS, model_type, minimum=0)
    top_k = _bounded("num_experts_per_tok", d.get("num_experts_per_tok") or 0, MAX_EXPERTS, model_type, minimum=0)
    if num_experts <= 0 or top_k <= 0:
        return {}
    # Mixtral's experts are intermediate_size wide; Qwen-MoE names them moe_intermediate_size.
    moe_inter = _bounded("moe_intermediate_size", d.get("moe_intermediate_size") or d.get("intermediate_size") or 0,
                         MAX_DIMENSION, model_type, minimum=0)
    # Qwen-MoE: layer i is sparse unless listed in mlp_only_layers, every decoder_sparse_step-th.
    step = _bounded("decoder_sparse_step", d.get("decoder_sparse_step") or 1, MAX_LAYERS, model_type)
    dense_only = d.get("mlp_only_layers") or ()
    if not isinstance(dense_only, (list, tuple)) or len(dense_only) > MAX_LAYERS:
        raise ValueError(f"cannot compute FLOPs for model_type {model_type!r}: mlp_only_layers is not a "
                         f"list of at most {MAX_LAYERS} layer numbers")
    dense_only = {i for i in dense_only if isinstance(i, int)}
    num_moe = sum(1 for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0)
    return {"num_experts": num_experts, "num_experts_per_tok": top_k,
            "moe_intermediate_size": moe_inter,
            "shared_expert_intermediate_size": _bounded(
                "shared_expert_intermediate_size", d.get("shared_expert_intermediate_size") or 0,
                MAX_DIMENSION, model_type, minimum=0),
            "num_moe_layers": num_moe}


def _shape(hf_config: Any) -> ModelShape:
    return hf_config if isinstance(hf_config, ModelShape) else model_shape(hf_config)


def _attention(shape: ModelShape, sum_doc_len_sq: int, causal: bool) -> int:
    forward = shape.attn_flops_coeff * int(sum_doc_len_sq)
    return forward // 2 if causal else forward


def training_flops_per_token(hf_config: Any, seq_len: int, causal: bool = False) -> int:
    """Forward+backward model FLOPs per token of a causal LM trained on seq_len-token rows.

    6 * N + 12 * L * H * d * seq_len (the attention term halved when causal). hf_config: a
    transformers config or its to_dict(). See the module docstring for N.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    shape = _shape(hf_config)
    return 6 * shape.matmul_params + 3 * _attention(shape, seq_len, causal)


def training_flops(hf_config: Any, num_tokens: int, sum_doc_len_sq: int, causal: bool = False) -> int:
    """Model FLOPs (forward+backward) of a step over num_tokens tokens in documents of lengths
    L_i with sum_i(L_i^2) = sum_doc_len_sq (B*T*T for B unpacked rows of T tokens)."""
    shape = _shape(hf_config)
    return 6 * shape.matmul_params * int(num_tokens) + 3 * _attention(shape, sum_doc_len_sq, causal)


def forward_flops(hf_config: Any, num_tokens: int, sum_doc_len_sq: int, causal: bool = False) -> int:
    """Model FLOPs of the forward pass alone (a third of training_flops)."""
    shape = _shape(hf_config)
    return 2 * shape.matmul_params * int(num_tokens) + _attention(shape, sum_doc_len_sq, causal)


def hardware_flops(hf_config: Any, num_tokens: int, sum_doc_len_sq: int, causal: bool = False,
                   gradient_checkpointing: bool = False) -> int:
    """FLOPs the hardware runs: model FLOPs plus, with gradient checkpointing, the decoder
    layers' forward again (full recompute; the LM head is not checkpointed)."""
    shape = _shape(hf_config)
    total = training_flops(shape, num_tokens, sum_doc_len_sq, causal)
    if gradient_checkpointing:
        total += 2 * shape.layer_matmul_params * int(num_tokens) + _attention(shape, sum_doc_len_sq, causal)
    return total


@dataclass(frozen=True, slots=True)
class MfuEstimator:
    """Per-step MFU/HFU for the daemon, built once from a rank's hello.

    shape None (no or unreadable config) makes step_metrics_columns return {}; peak None keeps
    perf/model_flops_per_second and drops the MFU keys.
    """

    shape: ModelShape | None
    seq_len: int
    causal: bool = True
    gradient_checkpointing: bool = False
    peak_flops_per_device: float | None = None
    # (a, b) of model FLOPs = a * tokens + b * sum(L_i^2), then of hardware FLOPs; see __post_init__
    coefficients: tuple[float, float, float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "coefficients", self._coefficients() if self.shape is not None else (0.0,) * 4)

    @classmethod
    def from_hello(cls, info: Mapping[str, Any], peak_override: float | None = None,
                   dtype_override: str | None = None, halve_causal: bool = False) -> "MfuEstimator":
        """Build from a hello's info map; never raises (the daemon must not crash on input).

        peak_override: FLOP/s of one device, replacing the table (unknown GPUs, MIG slices,
        clocks locked below boost). info["peak_flops"], if a rank sends it, is used the same way.
        dtype_override: the peak's dtype ("bf16", "fp16", "tf32", "fp32") instead of the one
        the rank reports (e.g. "tf32" for an fp32 run with TF32 matmuls allowed).
        halve_causal: count half the attention term for a causal model (the work a causal kernel
        needs). Off by default: MFU follows PaLM and Megatron, which count the full 12·L·H·d·T,
        so figures compare with theirs.
        """
        model = info.get("model") if isinstance(info, Mapping) else None
        if not isinstance(model, Mapping):
            return cls(shape=None, seq_len=0)
        try:
            shape = model_shape(model.get("hf_config") or {})
        except (ValueError, TypeError) as exc:
            log.warning("MFU disabled: %s", exc)
            shape = None
        seq_len = int(positive_finite(model.get("seq_len")) or 0)
        reported = dtype_override or str(model.get("dtype", "bf16"))
        dtype = normalize_dtype(reported) or reported
        peak = positive_finite(peak_override) or positive_finite(info.get("peak_flops"))
        if peak is None and shape is not None:
            peak = peak_flops(str(info.get("device_name", "unknown")), dtype)
        return cls(shape=shape, seq_len=seq_len, causal=halve_causal and bool(model.get("causal", True)),
                   gradient_checkpointing=bool(model.get("gradient_checkpointing", False)),
                   peak_flops_per_device=peak)

    def step_metrics_columns(self, tokens: Sequence[Any], doc_sq: Sequence[Any] | None,
                             step_times: Sequence[Any], world_size: int | None = None) -> dict[str, float]:
        """step_metrics from the ranks' values side by side (the daemon's aggregator has them so):
        tokens[i], doc_sq[i] (None: not logged) and step_times[i] are rank i's.

        FLOPs are linear in the token count and in sum(L_i^2), so a step's FLOP rate is
        a * sum(tokens_i / t_i) + b * sum(doc_sq_i / t_i): when every value is a positive finite
        number (every step of a healthy run) that is two sums over the ranks, in C.
        """
        if self.shape is None or not tokens:
            return {}
        try:
            fast = (0 < min(step_times) and max(step_times) < _INF and 0 < min(tokens) and max(tokens) < _INF
                    and (doc_sq is None or (0 < min(doc_sq) and max(doc_sq) < _INF))
                    and (doc_sq is not None or self.seq_len > 0))
        except TypeError:        # a None or another non-number among them
            fast = False
        if fast:
            token_rate = sum(map(truediv, tokens, step_times))
            sq_rate = sum(map(truediv, doc_sq, step_times)) if doc_sq is not None else token_rate * self.seq_len
            num_ranks = len(step_times)
        else:
            token_rate, sq_rate, num_ranks = self._rates_checked(tokens, doc_sq, step_times)
            if num_ranks == 0:
                return {}
        return self._from_rates(token_rate, sq_rate, num_ranks, world_size)

    def step_metrics_batch(self, tokens: Sequence[Any], doc_sq: Sequence[Any], step_times: Sequence[Any],
                           world_size: int | None = None, rate_sums=loops.rate_sums) -> list[dict[str, float]]:
        """step_metrics_columns of many steps (a steps.StepBatch's columns): the i-th dict is
        step_metrics_columns(tokens[i], doc_sq[i], step_times[i], world_size), {} where
        tokens[i] or step_times[i] is None (no rank of the step logged it).

        rate_sums: telemetry.daemon.loops.rate_sums or its C twin; it gives each step's two
        sums at once where every value is a positive finite number (every step of a healthy
        run); the other steps go through step_metrics_columns.
        """
        if self.shape is None:
            return [{} for _ in step_times]
        token_rates = rate_sums(tokens, step_times)
        sq_rates = rate_sums(doc_sq, step_times)
        out = []
        for i, (token_rate, sq_rate, times) in enumerate(zip(token_rates, sq_rates, step_times)):
            if token_rate is not None and doc_sq[i] is None and self.seq_len > 0:
                sq_rate = token_rate * self.seq_len      # every token in a full seq_len-long document
            if token_rate is not None and sq_rate is not None:
                out.append(self._from_rates(token_rate, sq_rate, len(times), world_size))
            elif times is None or tokens[i] is None:
                out.append({})
            else:                                        # a value to check: rank by rank
                out.append(self.step_metrics_columns(tokens[i], doc_sq[i], times, world_size))
        return out

    def _from_rates(self, token_rate: float, sq_rate: float, num_ranks: int, world_size: int | None) -> dict:
        """The figures from sum(tokens_i / t_i) and sum(doc_sq_i / t_i) over num_ranks ranks."""
        a_model, b_model, a_hw, b_hw = self.coefficients
        model_rate = a_model * token_rate + b_model * sq_rate
        # Ranks that did not report are assumed to run like the mean of those that did.
        scale = max(int(world_size or num_ranks), num_ranks) / num_ranks
        out = {"perf/model_flops_per_second": model_rate * scale}
        if self.peak_flops_per_device:
            mfu = model_rate / (num_ranks * self.peak_flops_per_device)
            out["perf/mfu"] = mfu
            out["perf/mfu_percent"] = 100.0 * mfu
            out["perf/hfu"] = (a_hw * token_rate + b_hw * sq_rate) / (num_ranks * self.peak_flops_per_device)
        return out

    def _rates_checked(self, tokens, doc_sq, step_times) -> tuple[float, float, int]:
        """sum(tokens_i / t_i), sum(doc_sq_i / t_i) and the number of ranks counted, rank by rank:
        a rank without tokens or a positive step time is left out; one without doc_sq counts
        full seq_len-long rows."""
        token_rate = sq_rate = 0.0
        num_ranks = 0
        for i, (n, t) in enumerate(zip(tokens, step_times)):
            n, t = positive_finite(n), positive_finite(t)
            if n is None or t is None:
                continue
            sq = positive_finite(doc_sq[i]) if doc_sq is not None else None
            if sq is None:
                if self.seq_len <= 0:
                    continue
                sq = n * self.seq_len  # every token in a full seq_len-long document
            token_rate += n / t
            sq_rate += sq / t  # as the fast path above: the values as sent
            num_ranks += 1
        return token_rate, sq_rate, num_ranks

    def _coefficients(self) -> tuple[float, float, float, float]:
        """Read off training_flops and hardware_flops themselves, so they cannot drift apart."""
        shape, causal, gc = self.shape, self.causal, self.gradient_checkpointing
        unit = 2 if causal else 1         # _attention halves with integer division: scale it up
        a_model = training_flops(shape, 1, 0, causal)
        b_model = training_flops(shape, 0, unit, causal) / unit
        a_hw = hardware_flops(shape, 1, 0, causal, gc)
        b_hw = hardware_flops(shape, 0, unit, causal, gc) / unit
        return a_model, b_model, a_hw, b_hw
