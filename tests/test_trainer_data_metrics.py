"""Data (packing, determinism, JSONL) and device-side per-dataset metrics against a direct computation."""
import json

import torch

from trainer.config import DataConfig, DatasetConfig, ModelConfig
from trainer.data import IGNORE_INDEX, PackedDataset, collate, decode, make_loader
from trainer.metrics import DatasetMetrics
from trainer.model import build_model, forward_loss


def _cfg(**kw):
    return DataConfig(seq_len=64, micro_batch_size=3, num_workers=0, **kw)


def test_rows_are_deterministic_packed_and_tagged():
    ds = PackedDataset(_cfg())
    a, b = ds[17], ds[17]
    assert a == b and ds[18] != a
    assert len(a["input_ids"]) == 64 == len(a["labels"]) == len(a["dataset_ids"])
    assert sum(a["doc_lens"]) == 64
    assert set(a["dataset_ids"]) <= {0, 1, 2, 3}
    # Positions restart at every document.
    assert a["position_ids"].count(0) == len(a["doc_lens"])
    # Labels are the next token where the loss is taken (the answer), else ignored.
    for i, lab in enumerate(a["labels"][:-1]):
        if lab != IGNORE_INDEX and a["position_ids"][i + 1] != 0:
            assert lab == a["input_ids"][i + 1]


def test_synthetic_answers_are_right():
    import random
    from trainer.data import BOS_ID, SEP_ID, synthetic_document
    rng = random.Random(0)
    for task, fn in [("copy", lambda s: s), ("reverse", lambda s: s[::-1]), ("sort", lambda s: "".join(sorted(s))),
                     ("add", lambda s: str(sum(int(x) for x in s.split("+"))))]:
        for _ in range(20):
            doc = synthetic_document(task, rng, 1, 6)
            assert doc.tokens[0] == BOS_ID
            sep = doc.tokens.index(SEP_ID)
            prompt = decode(doc.tokens[1:sep]).split(":", 1)[1]
            # The loss is taken exactly on predicting the answer and <eos>.
            target = [t for t, m in zip(doc.tokens[1:], doc.loss_mask) if m]
            assert decode(target) == fn(prompt)
            assert len(target) == len(fn(prompt).encode()) + 1


def test_loader_rows_follow_the_global_layout():
    cfg = _cfg()
    ds = PackedDataset(cfg)
    # rank 1 of 2, grad_accum 2, from step 3: first micro-batch is rows ((3*2+0)*2+1)*3 + 0..2
    loader = make_loader(cfg, rank=1, world_size=2, grad_accum=2, start_step=3, block_mask=False,
                         pin_memory=False, num_steps=1)
    first = next(iter(loader))
    base = ((3 * 2 + 0) * 2 + 1) * 3
    expect = torch.tensor([ds[base + j]["input_ids"] for j in range(3)])
    assert torch.equal(first["input_ids"], expect)
    assert first["num_tokens"] == 3 * 64
    assert first["attn_doc_len_sq"] == sum(L * L for j in range(3) for L in ds[base + j]["doc_lens"])


def test_jsonl_source(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps({"text": f"hello {i}"}) for i in range(5)) + "\n")
    cfg = _cfg(datasets=[DatasetConfig(name="web", kind="jsonl", path=str(p)), DatasetConfig(name="copy", kind="copy")])
    ds = PackedDataset(cfg, only=0)
    assert decode(ds[0]["input_ids"]).startswith("hello ")


def test_dataset_metrics_match_direct_computation():
    torch.manual_seed(0)
    B, S, D = 4, 32, 3
    token_loss = torch.rand(B, S) * 5
    correct = torch.rand(B, S) > 0.5
    valid = torch.rand(B, S) > 0.3
    ds_ids = torch.randint(-1, D, (B, S))
    valid &= ds_ids >= 0
    m = DatasetMetrics(["a", "b", "c"], torch.device("cpu"))
    m.update(token_loss, correct & valid, valid, ds_ids)
    m.update(token_loss * 2, correct & valid, valid, ds_ids)  # a second micro-batch
    vals = m.values()
    for d, name in enumerate("abc"):
        sel = valid & (ds_ids == d)
        n = int(sel.sum())
        want_loss = (token_loss[sel].sum() * 3 / (2 * n)).item()
        want_acc = ((correct & sel).sum() / n).item()
        assert abs(vals[f"dataset/{name}/loss"].item() - want_loss) < 1e-4
        assert abs(vals[f"dataset/{name}/accuracy"].item() - want_acc) < 1e-6
        assert vals[f"dataset/{name}/tokens"].item() == 2 * n
    before = vals["dataset/a/loss"].item()
    m.reset()  # handed-out values are independent of the accumulators
    assert vals["dataset/a/loss"].item() == before


def test_block_mask_isolates_documents_and_metrics_from_real_model():
    """Packed rows with the block mask give each document the loss it gets alone."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(hf_config={"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
                                               "num_hidden_layers": 1, "num_attention_heads": 2,
                                               "num_key_value_heads": 1, "max_position_embeddings": 128}))
    model.eval()
    cfg = _cfg()
    row = PackedDataset(cfg)[5]
    batch = collate([row], block_mask=True)
    with torch.no_grad():
        _, packed_loss, packed_correct = forward_loss(model, batch)
        start = 0
        for L in row["doc_lens"]:
            sub = {k: row[k][start:start + L] for k in ("input_ids", "labels", "position_ids", "dataset_ids")}
            sub.update(doc_ids=[0] * L, doc_lens=[L])
            _, alone, _ = forward_loss(model, collate([sub], block_mask=True))
            assert torch.allclose(packed_loss[0, start:start + L], alone[0], atol=1e-4)
            start += L
    # Metrics from the real model's outputs against a per-dataset recomputation.
    m = DatasetMetrics(["copy", "reverse", "sort", "add"], torch.device("cpu"))
    valid = batch["labels"] != IGNORE_INDEX
    m.update(packed_loss, packed_correct, valid, batch["dataset_ids"])
    vals = m.values()
    for d, name in enumerate(["copy", "reverse", "sort", "add"]):
        sel = valid & (batch["dataset_ids"] == d)
        if sel.any():
            assert abs(vals[f"dataset/{name}/loss"].item() - packed_loss[sel].mean().item()) < 1e-4
            assert abs(vals[f"dataset/{name}/accuracy"].item() - packed_correct[sel].float().mean().item()) < 1e-6


def _jsonl(tmp_path, texts):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    return p


TEXTS = [f"document number {i}" for i in range(200)] + ["document number 7"] * 5  # duplicates stay together


def test_jsonl_eval_documents_are_never_training_documents(tmp_path):
    """What the train and eval datasets draw: complete documents from disjoint sets of lines."""
    cfg = _cfg(datasets=[DatasetConfig(name="web", kind="jsonl", path=str(_jsonl(tmp_path, TEXTS)),
                                       eval_fraction=0.1)])

    def seen(split):
        """The whole documents of 300 packed rows (a document starts where its position ids restart)."""
        ds = PackedDataset(cfg, split=split, only=0)
        docs = set()
        for i in range(300):
            row = ds[i]
            starts = [j for j, q in enumerate(row["position_ids"]) if q == 0] + [len(row["input_ids"])]
            for a, b in zip(starts, starts[1:]):
                docs.add(decode(row["input_ids"][a:b]))
        return docs & set(TEXTS)  # the last document of a row may be cut short

    eval_docs, train_docs = seen("eval"), seen("train")
    assert eval_docs and train_docs
    assert eval_docs.isdisjoint(train_docs)
    assert len(eval_docs) <= 20  # 10 % of the 200 distinct lines


def test_jsonl_split_is_by_hash_of_the_text(tmp_path):
    import random

    from trainer.data import split_lines
    train, held_out = split_lines(TEXTS, 0.1)
    assert set(train).isdisjoint(held_out) and len(set(held_out)) == 20 and len(set(train)) == 180
    assert sorted(train + held_out) == sorted(TEXTS)
    shuffled = TEXTS[:]
    random.Random(1).shuffle(shuffled)
    assert set(split_lines(shuffled, 0.1)[1]) == set(held_out)  # the file's order does not matter


def test_jsonl_needs_two_distinct_documents(tmp_path):
    import pytest
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"text": "only one"}) + "\n")
    with pytest.raises(ValueError, match="at least 2 distinct documents"):
        PackedDataset(_cfg(datasets=[DatasetConfig(name="web", kind="jsonl", path=str(p))]))
