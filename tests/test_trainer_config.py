"""Config loading: defaults, overrides, and clear errors for bad input."""
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config import DEFAULT_CONFIG, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_default_config_loads_and_overrides_apply():
    cfg = load_config(None, ["steps=7", "run_dir=/tmp/x", "optim.lr=1e-4", "engine.zero_stage=1",
                             "model.hf_config.hidden_size=32"])
    assert DEFAULT_CONFIG.is_file()
    assert (cfg.steps, cfg.run_dir, cfg.optim.lr, cfg.engine.zero_stage) == (7, "/tmp/x", 1e-4, 1)
    assert cfg.model.hf_config["hidden_size"] == 32 and cfg.model.hf_config["num_hidden_layers"] == 2
    assert [d.name for d in cfg.data.datasets] == ["copy", "reverse", "sort", "add"]
    assert isinstance(cfg.optim.lr, float)


@pytest.mark.parametrize("override, needle", [
    (["optim.lrr=1"], "unknown config key 'optim.lrr'"),
    (["nope=1"], "unknown config key 'nope'"),
    (["steps=abc"], "config key 'steps' must be int"),
    (["steps=1.5"], "config key 'steps' must be int"),
    (["model.gradient_checkpointing=3"], "'model.gradient_checkpointing' must be bool"),
    (["engine.zero_stage=5"], "engine.zero_stage must be 0, 1, 2 or 3"),
    (["engine.backend=ddp", "engine.zero_stage=2"], "engine.backend=ddp cannot shard"),
    (["data.seq_len=4096"], "exceeds model.hf_config.max_position_embeddings"),
    (["data.datasets=[{name: a, kind: nonsense}]"], "kind must be one of"),
    (["data.datasets=[{name: a, kind: copy}, {name: a, kind: sort}]"], "duplicate names"),
    (["data.datasets=[{name: a, kind: jsonl}]"], "kind jsonl needs a path"),
    (["data.datasets=[{name: a, kind: copy, weight: 0}]"], "weight must be > 0"),
    (["nonfinite_action=explode"], "nonfinite_action must be skip or stop"),
    (["steps"], "is not key=value"),
])
def test_config_errors_name_the_problem(override, needle):
    with pytest.raises(ValueError) as e:
        load_config(None, override)
    assert needle in str(e.value)


def test_flash_attention_refused_when_not_installed():
    pytest.importorskip("torch")
    import importlib.util
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here")
    with pytest.raises(ValueError, match="flash_attn is not installed"):
        load_config(None, ["model.attn_implementation=flash_attention_2"])


def test_cli_reports_config_error_without_traceback(tmp_path):
    p = subprocess.run([sys.executable, "-m", "trainer.train", "optim.bogus=1", f"run_dir={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "unknown config key 'optim.bogus'" in p.stderr
    assert "Traceback" not in p.stderr


def test_every_shipped_config_is_valid():
    for path in sorted((ROOT / "launch" / "configs").glob("*.yaml")):
        try:
            load_config(path)
        except ValueError as e:
            if "flash_attn is not installed" not in str(e) and "deepspeed is not installed" not in str(e):
                raise


def test_the_deepspeed_launchers_local_rank_argument_is_accepted(monkeypatch):
    """`deepspeed --num_gpus N --module trainer.train` passes --local_rank=N before the config."""
    from trainer.train import parse_args

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    args = parse_args(["--local_rank=1", "--config", "launch/configs/tiny.yaml", "steps=3"])
    assert args.overrides == ["steps=3"]
    import os

    assert os.environ["LOCAL_RANK"] == "1"
