"""Causal, per-document attention for every attention implementation, in training and in eval.

The batches go the trainer's own way (collate -> prepare_batch / Run.prepare), so a mask in the
wrong form for an implementation (a bool mask that eager adds to the scores as 0/1) shows up
here as logits that depend on future tokens or on another packed document.
"""
import importlib.util

import pytest
import torch

from trainer.config import ModelConfig, load_config
from trainer.data import PackedDataset, collate
from trainer.model import build_model, prepare_batch, uses_block_mask

HF = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
CPU_IMPLS = ["eager", "sdpa"]


def _model(impl, device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    model = build_model(ModelConfig(hf_config=HF, attn_implementation=impl))
    return model.to(device=device, dtype=dtype).eval()


def _rows(n=3, seq_len=64):
    cfg = load_config(None, [f"data.seq_len={seq_len}"]).data
    ds = PackedDataset(cfg)
    return [ds[i] for i in range(n)]


def _logits(model, rows, impl, device="cpu", dtype=torch.float32):
    batch = prepare_batch(collate(rows, block_mask=uses_block_mask(impl)), torch.device(device), impl, dtype)
    kwargs = {k: batch[k] for k in ("input_ids", "position_ids")}
    if "attention_mask" in batch:
        kwargs["attention_mask"] = batch["attention_mask"]
    with torch.no_grad():
        return model(**kwargs, use_cache=False).logits


def _edit(rows, positions):
    """The rows with the input tokens at `positions` replaced (labels and positions kept)."""
    out = []
    for r in rows:
        r = dict(r, input_ids=list(r["input_ids"]))
        for i in positions:
            r["input_ids"][i] = (r["input_ids"][i] + 101) % 256
        out.append(r)
    return out


def _check_future_and_documents(impl, device="cpu", dtype=torch.float32):
    model, rows = _model(impl, device, dtype), _rows()
    base = _logits(model, rows, impl, device, dtype)
    # Editing positions >= k leaves every logit before k bit-identical.
    for k in (1, 17, 40, 63):
        edited = _logits(model, _edit(rows, range(k, 64)), impl, device, dtype)
        assert torch.equal(base[:, :k], edited[:, :k]), f"{impl}: a position < {k} saw a token >= {k}"
        assert not torch.equal(base[:, k:], edited[:, k:])  # the edit itself did reach the model
    # Editing the first packed document leaves every later document's logits bit-identical.
    first_len = min(r["doc_lens"][0] for r in rows)
    assert all(len(r["doc_lens"]) >= 2 for r in rows)
    edited = _logits(model, _edit(rows, range(0, first_len)), impl, device, dtype)
    for j, r in enumerate(rows):
        start = r["doc_lens"][0]
        assert torch.equal(base[j, start:], edited[j, start:]), f"{impl}: attention crossed a document boundary"


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_no_position_sees_the_future_or_another_document(impl):
    _check_future_and_documents(impl)


@pytest.mark.gpu
def test_flash_attention_2_is_causal_and_per_document():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash_attn is not installed")
    _check_future_and_documents("flash_attention_2", device="cuda", dtype=torch.bfloat16)


def _run(impl, tmp_path):
    """A real Run (torch engine, one rank, telemetry disabled) as trainer.train.main builds it."""
    from telemetry import TelemetryClient
    from trainer.engine import DistInfo, make_engine
    from trainer.train import Run
    cfg = load_config(None, [f"run_dir={tmp_path}/{impl}", "engine.backend=ddp", "engine.zero_stage=0",
                             f"model.attn_implementation={impl}", "data.seq_len=64", "data.micro_batch_size=2",
                             "data.num_workers=0", "eval.num_batches=1", "telemetry_endpoint="]
                      + [f"model.hf_config.{k}={v}" for k, v in HF.items()])
    torch.manual_seed(cfg.seed)
    info = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    engine = make_engine(cfg, build_model(cfg.model), info)
    return Run(cfg, engine, info, TelemetryClient(endpoint="", rank=0))


@pytest.fixture
def runs(tmp_path):
    made = {impl: _run(impl, tmp_path) for impl in CPU_IMPLS}
    yield made
    for run in made.values():
        run.stop.restore()
        run.tm.close()


def test_training_path_gives_eager_the_numbers_of_sdpa(runs):
    """The same weights and batch through the engine's forward: eager and sdpa agree per position."""
    rows = _rows(n=2)
    token_losses = {}
    for impl, run in runs.items():
        with torch.no_grad():
            _, token_losses[impl], _ = run.engine.forward_loss(run.prepare(collate(rows, run.block_mask)))
    torch.testing.assert_close(token_losses["eager"], token_losses["sdpa"], rtol=1e-5, atol=1e-5)


def test_eval_path_gives_eager_the_numbers_of_sdpa(runs):
    """Run.evaluate (its own loaders, the held-out split): every eval metric agrees."""
    evals = {impl: run.evaluate() for impl, run in runs.items()}
    assert evals["eager"].keys() == evals["sdpa"].keys() and evals["eager"]
    # Each rank's eval figures come with their token counts, for the daemon to weight ranks by.
    assert all(evals["sdpa"][f"eval/{name}/tokens"] > 0 for name in ("copy", "reverse", "sort", "add"))
    for key, value in evals["sdpa"].items():
        torch.testing.assert_close(evals["eager"][key], value, rtol=1e-5, atol=1e-5, msg=key)
