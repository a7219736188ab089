"""`telemetry mfu-check`: the calibration tool prints the formula beside FlopCounterMode."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from telemetry import cli  # noqa: E402
from telemetry.daemon.mfu import training_flops  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
         "max_position_embeddings": 64, "tie_word_embeddings": True}


def run_json(argv: list[str], capsys) -> tuple[int, dict]:
    rc = cli.main(["mfu-check", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_hf_config_file_on_cpu(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN2))
    rc, out = run_json(["--hf-config", str(path), "--seq-len", "16", "--batch-size", "2", "--device", "cpu"], capsys)
    assert rc == 0
    assert out["counted_flops"] == out["formula_flops"] == training_flops(QWEN2, 32, 2 * 16 * 16)
    assert out["counted_by_op"]["aten.bmm"] == 3 * 4 * 2 * 4 * 16 * 2 * 16 * 16  # attention only


def test_trainer_yaml_with_gradient_checkpointing(tmp_path, capsys):
    pytest.importorskip("yaml")
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps({"model": {"hf_config": QWEN2}, "data": {"seq_len": 32}}))  # JSON is YAML
    rc, out = run_json(["--config", str(path), "--gradient-checkpointing"], capsys)
    assert rc == 0
    assert out["seq_len"] == 32 and out["ratio"] == 1.0 and out["hardware_ratio"] == 1.0


def test_flags_table_and_exit_code():
    cmd = [sys.executable, "-m", "telemetry", "mfu-check", "--model-type", "gemma", "--hidden-size", "64",
           "--num-layers", "2", "--num-heads", "4", "--num-kv-heads", "1", "--head-dim", "24",
           "--intermediate-size", "96", "--vocab-size", "128", "--seq-len", "16"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "ratio counted / formula" in res.stdout and "1.000000" in res.stdout
    assert "OK: formula and FlopCounterMode agree" in res.stdout


def test_unreadable_config_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5", "is_encoder_decoder": True}))
    assert cli.main(["mfu-check", "--hf-config", str(path)]) == 2
    assert "encoder-decoder" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--model-type", "llama", "--hidden-size", "65536", "--num-layers", "64", "--num-heads", "64",
     "--intermediate-size", "262144", "--vocab-size", "32000"],
    ["--model-type", "llama", "--hidden-size", "64", "--num-layers", "2", "--num-heads", "4",
     "--intermediate-size", "128", "--vocab-size", "256", "--seq-len", "16000000"],
], ids=["1.2T-parameters", "seq-len-16M"])
def test_real_tensors_beyond_this_machines_memory_are_refused_before_allocation(argv, capsys):
    """Not in the issue's list, the same class as --world-size 10^9: sizes within the flags'
    bounds (each <= 2^24) on --device cpu were allocated until the OOM killer came. Refused with
    the estimate, exit 2; --device meta (no memory) still counts them."""
    assert cli.main(["mfu-check", *argv, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--device cpu would need about" in err and "use --device meta" in err and len(err.splitlines()) == 1, err


_LLAMA = ["--model-type", "llama", "--hidden-size", "64", "--num-layers", "2", "--intermediate-size", "128",
          "--vocab-size", "100"]


@pytest.mark.parametrize("argv, said", [
    (_LLAMA + ["--num-heads", "4", "--num-kv-heads", "8"], "--num-kv-heads 8 must divide --num-heads 4"),
    (_LLAMA + ["--num-heads", "4", "--num-kv-heads", "3"], "--num-kv-heads 3 must divide --num-heads 4"),
    (_LLAMA + ["--num-heads", "3"], "--hidden-size 64 is not a multiple of --num-heads 3"),
    (_LLAMA + ["--num-heads", "3", "--num-kv-heads", "3", "--head-dim", "16"],
     "--model-type llama: transformers refused it: The hidden size (64) is not a multiple of the number of "
     "attention heads (3)."),
    (["--model-type", "llama", "--hidden-size", "64"],
     "--model-type llama needs --num-layers, --num-heads, --intermediate-size, --vocab-size too"),
    ({**QWEN2, "num_attention_heads": 0}, "num_attention_heads = 0 is not a positive integer"),
    ({**QWEN2, "hidden_size": "big"}, "hidden_size = 'big' is not a positive integer"),
    ({**QWEN2, "num_key_value_heads": 3}, "num_key_value_heads = 3 must divide num_attention_heads = 4"),
], ids=["kv-heads-beyond-heads", "kv-heads-not-dividing", "hidden-not-multiple", "the-familys-own-check",
        "shape-flags-left-out", "hf-zero-heads", "hf-hidden-size-text", "hf-kv-heads-not-dividing"])
def test_an_impossible_model_shape_is_refused_naming_it(tmp_path, argv, said):
    """Shapes no model has raised transformers' ValueError, a ZeroDivisionError or a tensor-size
    RuntimeError deep in the forward pass (tracebacks); --model-type with shape flags left out
    ran transformers' defaults for the family (32 layers of head_dim 2 for a hidden size of 64)
    with exit 0. Each is one line naming the flag or key, exit 2, before any model is built."""
    if isinstance(argv, dict):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(argv))
        argv, said = ["--hf-config", str(path)], f"--hf-config {path}: {said}"
    p = subprocess.run([sys.executable, "-m", "telemetry", "mfu-check", *argv], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout, p.stderr[-3000:])
    line, = p.stderr.splitlines()
    assert line.startswith(f"telemetry mfu-check: {said}"), line
