"""Data: a byte-level tokenizer, named sources mixed by weight, packed rows, a resumable loader.

Every packed row is a pure function of (seed, row index): the row draws documents from the
sources (a source chosen by weight for each document) until `seq_len` is full. So the data
position is one integer, the number of optimizer steps consumed, and resuming is exact.

A row holds, per token: input id, label (-100 where no loss is taken: prompts, padding),
position id (restarting at each document) and the index of the dataset the token came from
(-1 for padding). Documents never attend across each other: the collate function builds a
boolean block-diagonal causal mask (sdpa; eager gets it in additive form from
trainer.model.prepare_batch) or relies on position ids (flash-attention varlen).

Layout of the global row index, for optimizer step s, micro-step m, rank r, row j:
    ((s * grad_accum + m) * world_size + r) * micro_batch_size + j
"""
from __future__ import annotations

import atexit
import hashlib
import json
import random
import weakref
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from trainer.config import DataConfig, DatasetConfig

# Byte-level tokenizer: ids 0..255 are bytes, then the specials.
PAD_ID, BOS_ID, EOS_ID, SEP_ID = 256, 257, 258, 259
VOCAB_SIZE = 260
IGNORE_INDEX = -100


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@dataclass(slots=True)
class Document:
    tokens: list[int]
    loss_mask: list[bool]     # True where the next-token loss is taken (the answer)


_ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def synthetic_document(task: str, rng: random.Random, min_len: int, max_len: int) -> Document:
    """One example of a task a tiny model can learn: `<bos>task:x<sep>answer<eos>`."""
    if task == "add":
        a = rng.randrange(10 ** rng.randint(min_len, max_len))
        b = rng.randrange(10 ** rng.randint(min_len, max_len))
        prompt, answer = f"{a}+{b}", str(a + b)
    else:
        s = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(min_len, max_len)))
        answer = {"copy": s, "reverse": s[::-1], "sort": "".join(sorted(s))}[task]
        prompt = s
    head = [BOS_ID] + encode(f"{task}:{prompt}") + [SEP_ID]
    tail = encode(answer) + [EOS_ID]
    # The label of position i is token i+1, so the mask marks positions whose *next* token is
    # part of the answer: from the separator up to the last answer byte.
    mask = [False] * (len(head) - 1) + [True] * len(tail) + [False]
    return Document(head + tail, mask)


def split_lines(lines: list[str], eval_fraction: float) -> tuple[list[str], list[str]]:
    """(train, eval) lines of a JSONL source: disjoint, and the same whatever the order of the file.

    The distinct texts are ranked by the SHA-256 of their UTF-8 bytes; the first
    ceil(eval_fraction * distinct) of them (at least one) are held out for eval. Every copy of a
    text lands in the same split, so no eval document is ever a training document.
    """
    import math
    ranked = sorted(set(lines), key=lambda t: hashlib.sha256(t.encode("utf-8")).digest())
    if len(ranked) < 2:
        raise ValueError("a jsonl dataset needs at least 2 distinct documents to hold one out for eval")
    held_out = set(ranked[:min(len(ranked) - 1, max(1, math.ceil(eval_fraction * len(ranked))))])
    return [t for t in lines if t not in held_out], [t for t in lines if t in held_out]


class Source:
    """Draws documents of one named dataset (for a JSONL file: from its train or its eval lines)."""

    def __init__(self, cfg: DatasetConfig, split: str = "train") -> None:
        self.cfg = cfg
        self._lines: list[str] | None = None
        if cfg.kind == "jsonl":
            self._lines = []
            with open(cfg.path) as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        obj = json.loads(line)
                        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                            raise ValueError(f"{cfg.path}:{n}: expected an object with a string 'text'")
                        self._lines.append(obj["text"])
            if not self._lines:
                raise ValueError(f"{cfg.path}: no documents")
            try:
                train, held_out = split_lines(self._lines, cfg.eval_fraction)
            except ValueError as e:
                raise ValueError(f"{cfg.path}: {e}") from None
            self._lines = held_out if split == "eval" else train

    def draw(self, rng: random.Random) -> Document:
        if self._lines is None:
            return synthetic_document(self.cfg.kind, rng, self.cfg.min_len, self.cfg.max_len)
        toks = [BOS_ID] + encode(rng.choice(self._lines)) + [EOS_ID]
        return Document(toks, [True] * (len(toks) - 1) + [False])


class PackedDataset(Dataset):
    """Row i: documents drawn from the weighted mixture until seq_len tokens are filled."""

    def __init__(self, cfg: DataConfig, split: str = "train", only: int | None = None) -> None:
        self.cfg = cfg
        self.sources = [Source(d, split) for d in cfg.datasets]
        self.names = [d.name for d in cfg.datasets]
        self.weights = [d.weight for d in cfg.datasets]
        self.only = only           # eval: draw from one dataset only
        # Train and eval draw from disjoint random streams (and, for JSONL, disjoint lines).
        self._salt = {"train": 0, "eval": 1}[split]

    def __len__(self) -> int:
        return 2 ** 62  # indexed by the sampler; effectively infinite

    def __getitem__(self, index: int) -> dict:
        # A string seed: hashed with SHA-512, the same in every process (hash() of None is not).
        rng = random.Random(f"{self.cfg.seed}:{self._salt}:{self.only}:{index}")
        S = self.cfg.seq_len
        # One extra token so inputs and labels both have length S.
        ids: list[int] = []
        labels: list[int] = []
        pos: list[int] = []
        ds: list[int] = []
        doc: list[int] = []
        doc_lens: list[int] = []
        while len(ids) < S:
            k = self.only if self.only is not None else rng.choices(range(len(self.sources)), self.weights)[0]
            d = self.sources[k].draw(rng)
            toks = d.tokens[: S - len(ids) + 1]
            n = min(len(toks) - 1, S - len(ids))
            if n <= 0:
                break
            ids += toks[:n]
            labels += [t if m else IGNORE_INDEX for t, m in zip(toks[1:n + 1], d.loss_mask[:n])]
            pos += list(range(n))
            ds += [k] * n
            doc += [len(doc_lens)] * n
            doc_lens.append(n)
        return {"input_ids": ids, "labels": labels, "position_ids": pos, "dataset_ids": ds,
                "doc_ids": doc, "doc_lens": doc_lens}


def collate(rows: list[dict], block_mask: bool) -> dict:
    """Stack rows into tensors; count tokens and Σ L² here, on the host, before any device copy."""
    out = {k: torch.tensor([r[k] for r in rows], dtype=torch.long)
           for k in ("input_ids", "labels", "position_ids", "dataset_ids")}
    out["num_tokens"] = sum(len(r["input_ids"]) for r in rows)          # packed: no padding
    out["num_loss_tokens"] = sum(sum(1 for t in r["labels"] if t != IGNORE_INDEX) for r in rows)
    out["num_samples"] = sum(len(r["doc_lens"]) for r in rows)
    out["attn_doc_len_sq"] = sum(L * L for r in rows for L in r["doc_lens"])
    if block_mask:
        doc = torch.tensor([r["doc_ids"] for r in rows], dtype=torch.long)
        S = doc.shape[1]
        causal = torch.ones(S, S, dtype=torch.bool).tril_()
        # [B, 1, S, S], True = may attend: same document and not in the future.
        out["attention_mask"] = ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]
    return out


class StepSampler(Sampler):
    """Yields the global row indices of this rank, micro-batch by micro-batch, from `start_step`."""

    def __init__(self, micro_batch_size: int, grad_accum: int, rank: int, world_size: int,
                 start_step: int = 0, num_steps: int | None = None) -> None:
        self.mbs, self.accum, self.rank, self.world = micro_batch_size, grad_accum, rank, world_size
        self.start_step, self.num_steps = start_step, num_steps

    def __iter__(self) -> Iterator[int]:
        s = self.start_step
        while self.num_steps is None or s < self.start_step + self.num_steps:
            for m in range(self.accum):
                base = ((s * self.accum + m) * self.world + self.rank) * self.mbs
                yield from range(base, base + self.mbs)
            s += 1


def _worker_init(worker_id: int) -> None:
    # A scheduler's SIGTERM / a Ctrl-C reaches the whole process group: workers must survive it
    # so the trainer can finish its emergency checkpoint; the trainer shuts them down after.
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ExitSafeLoader(DataLoader):
    """A DataLoader whose worker processes never hold the interpreter's exit.

    Workers ignore SIGTERM (_worker_init), and multiprocessing's exit hook ends daemonic children
    with SIGTERM and then joins them: an iterator still alive when the interpreter exits (held
    past the loop by a frame, a traceback, a cycle) left the process waiting for its worker
    forever, after its last step. Each iterator is shut down by an exit hook of ours, registered
    after multiprocessing's and torch's and so run before them: the workers get their sentinel
    and exit; one that does not (stuck in a dataset read) is killed.
    """

    def _get_iterator(self):
        it = super()._get_iterator()
        if self.num_workers > 0:
            global _exit_hook_registered
            _live_iterators.add(it)
            if not _exit_hook_registered:
                atexit.register(_shut_down_live_iterators)
                _exit_hook_registered = True
        return it


_live_iterators: "weakref.WeakSet" = weakref.WeakSet()
_exit_hook_registered = False


def _shut_down_live_iterators() -> None:
    for it in list(_live_iterators):
        try:
            it._shutdown_workers()
        except Exception:  # the process is exiting: what is left is killed below
            pass
        for w in getattr(it, "_workers", ()):
            try:
                if w.is_alive():
                    w.kill()
                    w.join(5)
            except Exception:
                pass


def _collate_fn(block_mask: bool):
    import functools
    return functools.partial(collate, block_mask=block_mask)


def make_loader(cfg: DataConfig, *, rank: int, world_size: int, grad_accum: int, start_step: int,
                block_mask: bool, pin_memory: bool, split: str = "train", only: int | None = None,
                num_steps: int | None = None, num_workers: int | None = None) -> DataLoader:
    """A DataLoader over this rank's rows from `start_step` on."""
    ds = PackedDataset(cfg, split=split, only=only)
    sampler = StepSampler(cfg.micro_batch_size, grad_accum, rank, world_size, start_step, num_steps)
    workers = cfg.num_workers if num_workers is None else num_workers
    kwargs = {}
    if workers > 0:
        kwargs = {"prefetch_factor": cfg.prefetch_factor, "persistent_workers": False,
                  "worker_init_fn": _worker_init}
    return ExitSafeLoader(ds, batch_size=cfg.micro_batch_size, sampler=sampler, num_workers=workers,
                          collate_fn=_collate_fn(block_mask), pin_memory=pin_memory, **kwargs)


def to_device(batch: dict, device: torch.device) -> dict:
    """Copy the tensors of a batch to `device` without waiting (pinned source on CUDA)."""
    return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
