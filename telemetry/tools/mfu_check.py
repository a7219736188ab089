"""Compare the analytic FLOPs formula with FlopCounterMode for a model.

Builds the model from its config (no download, no weights: on the meta device by default, so a
70B config costs seconds and no memory), runs one forward+backward of the causal-LM loss with
eager attention inside torch.utils.flop_counter.FlopCounterMode and prints the count beside
telemetry.daemon.mfu's formula. For users who bring an unusual model: if the ratio is not 1.0000, the
daemon's MFU for that model is off by the same factor (and a peak or FLOPs override is due).

Eager attention is forced because FlopCounterMode counts SDPA's fused kernels as 0 FLOPs on
CPU, and MoE experts run their per-expert loop (experts_implementation="eager") because grouped
matmuls are invisible to it too. Exit code: 0 when formula and count agree within 0.5 %.
--model-type needs every shape flag but --num-kv-heads (default: --num-heads) and --head-dim
(default: hidden size / heads); a shape no model has (key-value heads that do not divide the
heads, a size of 0) is refused naming the flag or key, exit 2.

  telemetry mfu-check --config launch/configs/tiny.yaml
  telemetry mfu-check --hf-config config.json --seq-len 4096
  telemetry mfu-check --model-type llama --hidden-size 4096 --num-layers 32 --num-heads 32 \\
      --num-kv-heads 8 --intermediate-size 14336 --vocab-size 128256 --seq-len 8192
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from telemetry.shared.config import number_arg

TOLERANCE = 0.005  # the design's budget for formula vs FlopCounterMode

# --model-type flag -> HF config key
_SIZE_FLAGS = {
    "hidden_size": "hidden size", "num_layers": "decoder layers", "num_heads": "attention heads",
    "num_kv_heads": "key-value heads (GQA/MQA)", "head_dim": "head dimension",
    "intermediate_size": "MLP width", "vocab_size": "vocabulary size",
}
_HF_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads"}
# The flags --model-type needs: left out, transformers would fill them with its defaults for
# the family (--model-type llama --hidden-size 64 ran a 32-layer, 32-head model of head_dim 2),
# some other model than the user's. --num-kv-heads (default: --num-heads) and --head-dim
# (default: hidden size / heads) mean the same in every family and may be left out.
_REQUIRED_FLAGS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size")


# A model size, a sequence length, a batch: a positive int a model could have (on --device cpu
# it is allocated), refused at the flag otherwise.
_SIZE = number_arg(int, lo=1, hi=1 << 24)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("model (one of)")
    src.add_argument("--config", help="a trainer YAML config (model.hf_config or model.path, data.seq_len)")
    src.add_argument("--hf-config", help="a Hugging Face config.json (or to_dict() dump)")
    src.add_argument("--model-type", help="build a config from flags: llama, qwen2, mistral, gemma, gpt2, ...")
    for name, what in _SIZE_FLAGS.items():
        src.add_argument(f"--{name.replace('_', '-')}", type=_SIZE, help=what)
    parser.add_argument("--seq-len", type=_SIZE, help="tokens per row (default: the config's data.seq_len, else 128)")
    parser.add_argument("--batch-size", type=_SIZE, default=1, help="rows per step (default 1)")
    parser.add_argument("--device", choices=("meta", "cpu"), default="meta",
                        help="meta: shapes only, fast for any size (default); cpu: real tensors")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="also check hardware FLOPs with full (reentrant) recompute")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _load_trainer_config(path: str) -> tuple[dict[str, Any], int | None, str]:
    """(hf_config kwargs or {'_path': dir}, seq_len, dtype) from a trainer YAML."""
    try:
        from trainer.config import load_config  # the trainer's own loader validates the file
        cfg = load_config(path, [])
        model = {"hf_config": dict(cfg.model.hf_config), "path": cfg.model.path}
        seq_len, dtype = cfg.data.seq_len, cfg.model.dtype
    except ImportError:
        from telemetry.shared.config import read_yaml   # bounded: sizes, aliases, depth
        raw = read_yaml(path)
        model = raw.get("model") or {}
        seq_len = (raw.get("data") or {}).get("seq_len")
        dtype = model.get("dtype", "fp32")
    if model.get("path"):
        return {"_path": model["path"]}, seq_len, dtype
    if not model.get("hf_config"):
        raise ValueError(f"{path}: no model.hf_config or model.path")
    return dict(model["hf_config"]), seq_len, dtype


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_flags(args: argparse.Namespace) -> None:
    """--model-type's shape flags: all there, and heads that fit together; else ValueError
    naming the flags."""
    missing = [_flag(f) for f in _REQUIRED_FLAGS if getattr(args, f) is None]
    if missing:
        raise ValueError(f"--model-type {args.model_type} needs {', '.join(missing)} too (transformers' defaults "
                         "for them are another model's)")
    if args.num_kv_heads is not None and args.num_heads % args.num_kv_heads:
        raise ValueError(f"--num-kv-heads {args.num_kv_heads} must divide --num-heads {args.num_heads} "
                         "(each key-value head serves a whole group of heads)")
    if args.head_dim is None and args.hidden_size % args.num_heads:
        raise ValueError(f"--hidden-size {args.hidden_size} is not a multiple of --num-heads {args.num_heads} "
                         "(the head dimension is hidden size / heads unless --head-dim gives it)")


def _check_sizes(kwargs: dict[str, Any], source: str, prefix: str) -> None:
    """Each size key a config file gives is a positive integer; else ValueError naming it
    (`prefix` + key: its dotted key in a trainer config)."""
    from telemetry.daemon.mfu import SIZE_KEYS     # HF's names and the aliases the formula reads

    for key in SIZE_KEYS:
        value = kwargs.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{source}: {prefix}{key} = {value!r} is not a positive integer")


def _check_heads(shape: Any, source: str) -> None:
    """A config file's key-value heads divide its heads (grouped-query attention), else
    ValueError: the model would fail to run with a tensor-shape error."""
    if shape.num_heads % shape.num_kv_heads:
        raise ValueError(f"{source}: num_key_value_heads = {shape.num_kv_heads} must divide "
                         f"num_attention_heads = {shape.num_heads}")


def _source(args: argparse.Namespace) -> str:
    """Where the model's config comes from, as an error names it (the order _build_hf_config takes them in)."""
    if args.config:
        return f"--config {args.config}"
    if args.hf_config:
        return f"--hf-config {args.hf_config}"
    return f"--model-type {args.model_type}"


def _build_hf_config(args: argparse.Namespace) -> tuple[Any, int | None]:
    from transformers import AutoConfig

    seq_len = None
    if args.config:
        kwargs, seq_len, _ = _load_trainer_config(args.config)
    elif args.hf_config:
        from telemetry.shared.config import parse_json, read_text   # bounded: size, depth; regular files only

        kwargs = parse_json(read_text(args.hf_config), f"--hf-config {args.hf_config}")
        if not isinstance(kwargs, dict):
            raise ValueError(f"{args.hf_config}: not a JSON object")
    elif args.model_type:
        _check_flags(args)
        kwargs = {"model_type": args.model_type}
        for flag in _SIZE_FLAGS:
            value = getattr(args, flag)
            if value is not None:
                kwargs[_HF_KEYS.get(flag, flag)] = value
        if args.model_type == "gpt2":  # GPT-2 spells them differently
            renames = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
                       "num_attention_heads": "n_head", "intermediate_size": "n_inner"}
            kwargs = {renames.get(k, k): v for k, v in kwargs.items()}
    else:
        raise ValueError("give --config, --hf-config or --model-type")
    if "_path" in kwargs:
        return AutoConfig.from_pretrained(kwargs["_path"], local_files_only=True), seq_len
    kwargs = dict(kwargs)
    _check_sizes(kwargs, _source(args), "model.hf_config." if args.config else "")
    model_type = kwargs.pop("model_type", None)
    if not model_type:
        raise ValueError("the config has no model_type")
    for key in ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path"):
        kwargs.pop(key, None)
    # Token ids a tiny vocabulary does not hold make some families refuse to build.
    vocab = kwargs.get("vocab_size") or kwargs.get("n_vocab")
    if vocab:
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if isinstance(kwargs.get(key), int) and kwargs[key] >= vocab:
                kwargs[key] = None
    try:
        return AutoConfig.for_model(model_type, **kwargs), seq_len
    except Exception as exc:     # the family's own checks, some of them huggingface_hub's StrictDataclass errors
        raise ValueError(f"{_source(args)}: transformers refused it: {_first_words(exc)}") from None


def _first_words(exc: BaseException) -> str:
    """An exception's message on one line; a wrapper's (huggingface_hub's validation errors)
    says what it wraps on its second line: the wrapped one's."""
    inner = exc.__cause__ if exc.__cause__ is not None else exc
    return " ".join(str(inner).split()) or type(inner).__name__


def cpu_memory_problem(hf_config: Any, shape: Any, batch_size: int, seq_len: int) -> str | None:
    """Why real tensors of this model and batch would not fit in this machine's memory, or None.
    The model is built on the meta device first (no memory) to count its parameters; weights,
    gradients and the activations eager attention keeps (its seq x seq scores per head and layer)
    are estimated in fp32 and held to half of the memory available now: a size within the flags'
    bounds (--hidden-size 16M, --seq-len 16M, or a --hf-config of any size) is refused before it
    is allocated, not left to the OOM killer."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager")
    params = sum(p.numel() for p in model.parameters())
    del model
    tokens = batch_size * seq_len
    layers, hidden = max(shape.num_layers, 1), max(shape.hidden_size, 1)
    acts = (tokens * layers * (16 * hidden + 4 * max(shape.intermediate_size, hidden))
            + 2 * batch_size * max(shape.num_heads, 1) * seq_len * seq_len * layers
            + 3 * tokens * max(shape.vocab_size, 1))
    need = 4 * (3 * params + acts)
    try:
        import psutil

        avail = psutil.virtual_memory().available
    except Exception:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > avail // 2:
        return (f"--device cpu would need about {need / 2**30:,.1f} GiB ({params:,} parameters, batch "
                f"{batch_size} x {seq_len} tokens), {avail / 2**30:,.1f} GiB are available: use --device meta "
                f"(the same count, no memory) or a smaller model")
    return None


def count_flops(hf_config: Any, batch_size: int, seq_len: int, device: str = "meta",
                gradient_checkpointing: bool = False) -> dict[str, int]:
    """FlopCounterMode's count, per aten op, of one forward+backward of the causal-LM loss."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"attn_implementation": "eager"}
    if getattr(hf_config, "num_local_experts", None) or getattr(hf_config, "num_experts", None):
        kwargs["experts_implementation"] = "eager"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
    model.train()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    vocab = model.get_output_embeddings().weight.shape[0]
    input_ids = torch.randint(0, vocab, (batch_size, seq_len), device=device)
    # An explicit all-ones mask keeps transformers from probing position_ids for packed rows
    # (a data-dependent .item() that meta tensors cannot answer); no FLOPs change.
    attention_mask = torch.ones_like(input_ids)
    with FlopCounterMode(display=False) as counter:
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss
        loss.backward()
    return {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}


def run(args: argparse.Namespace) -> int:
    import logging
    import warnings

    from telemetry.daemon import mfu

    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        hf_config, config_seq_len = _build_hf_config(args)
        shape = mfu.model_shape(hf_config)
        _check_heads(shape, _source(args))
    except (ValueError, OSError, KeyError) as exc:
        print(f"telemetry mfu-check: {exc}", file=sys.stderr)
        return 2
    seq_len = args.seq_len or config_seq_len or 128
    if args.device == "cpu":
        why = cpu_memory_problem(hf_config, shape, args.batch_size, seq_len)
        if why:
            print(f"telemetry mfu-check: {why}", file=sys.stderr)
            return 2
    num_tokens = args.batch_size * seq_len
    sum_sq = args.batch_size * seq_len * seq_len
    try:
        counted = count_flops(hf_config, args.batch_size, seq_len, args.device)
        hw_counted = (sum(count_flops(hf_config, args.batch_size, seq_len, args.device, True).values())
                      if args.gradient_checkpointing else 0)
    except RuntimeError as exc:    # a shape the checks above let through, an op the device lacks
        print(f"telemetry mfu-check: the model could not run one step on --device {args.device}: "
              f"{_first_words(exc)}", file=sys.stderr)
        return 1
    formula = mfu.training_flops(shape, num_tokens, sum_sq)
    total = sum(counted.values())
    ratio = total / formula if formula else float("nan")
    result: dict[str, Any] = {
        "model_type": shape.model_type, "batch_size": args.batch_size, "seq_len": seq_len,
        "matmul_params": shape.matmul_params, "formula_flops": formula, "counted_flops": total,
        "counted_by_op": counted, "ratio": ratio,
        "formula_flops_per_token": mfu.training_flops_per_token(shape, seq_len),
    }
    ok = abs(ratio - 1) <= TOLERANCE
    if args.gradient_checkpointing:
        hw_formula = mfu.hardware_flops(shape, num_tokens, sum_sq, gradient_checkpointing=True)
        result.update(hardware_formula_flops=hw_formula, hardware_counted_flops=hw_counted,
                      hardware_ratio=hw_counted / hw_formula)
        ok = ok and abs(hw_counted / hw_formula - 1) <= TOLERANCE
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(shape, result)
        print("OK: formula and FlopCounterMode agree" if ok else
              f"MISMATCH: more than {TOLERANCE:.1%} apart; the daemon's MFU for this model is off by this ratio")
    return 0 if ok else 1


def _print_table(shape: Any, r: dict[str, Any]) -> None:
    mlp = (f"MoE {shape.num_experts} experts top-{shape.num_experts_per_tok} x {shape.moe_intermediate_size}"
           if shape.num_experts else f"MLP {shape.intermediate_size} x{shape.num_mlp_matrices}")
    print(f"model    {shape.model_type}: hidden {shape.hidden_size}, {shape.num_layers} layers, "
          f"{shape.num_heads} heads / {shape.num_kv_heads} kv, head_dim {shape.head_dim}, {mlp}, "
          f"vocab {shape.vocab_size}")
    print(f"step     {r['batch_size']} x {r['seq_len']} tokens, eager attention, forward+backward of the LM loss")
    print(f"N        {r['matmul_params']:,} matmul weights (LM head included)")
    print()
    attn = 3 * shape.attn_flops_coeff * r["batch_size"] * r["seq_len"] ** 2
    rows = [("matmuls   6*N*tokens", r["formula_flops"] - attn),
            ("attention 12*L*H*d*sum(L_i^2)", attn),
            ("total (formula)", r["formula_flops"])]
    rows += [(f"counted   {op}", n) for op, n in sorted(r["counted_by_op"].items())]
    rows.append(("total (FlopCounterMode)", r["counted_flops"]))
    for label, n in rows:
        print(f"  {label:<32} {n:>24,}")
    print(f"  {'ratio counted / formula':<32} {r['ratio']:>24.6f}")
    print(f"  {'formula per token':<32} {r['formula_flops_per_token']:>24,}")
    if "hardware_ratio" in r:
        print(f"  {'HFU formula (recompute)':<32} {r['hardware_formula_flops']:>24,}")
        print(f"  {'HFU counted':<32} {r['hardware_counted_flops']:>24,}")
        print(f"  {'HFU ratio':<32} {r['hardware_ratio']:>24.6f}")
