"""Checkpoints: model, optimizer, scheduler, data position and RNG state; latest-first resume; retention.

Layout under <run_dir>/checkpoints/:
    step_00000020/
        state.pt          torch engine: model, optimizer, scheduler (rank 0; DDP replicas are equal)
        ds/               deepspeed engine: DeepSpeed's own sharded files (every rank writes)
        rank_00000.pt     per rank: RNG states, the data position and the documents seen (train/epoch)
        config.yaml       the resolved config
        meta.json         written last (atomically), by rank 0, once every rank's part is on disk:
                          marks it complete
A checkpoint is complete when meta.json and the engine's state (state.pt or ds/) are there; only
a complete one is announced (checkpoint_saved) or resumed from. Anything else (a save cut short,
a rank that wrote its part alone) is skipped on resume, which says so and takes the newest
complete one. A save from one rank alone (an exception there) is refused unless that rank holds
the whole state: rank 0 of the torch engine (DDP replicas are equal); the others' RNG and data
position are then not in it (they resume with fresh RNG, their position from the step).
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

_STEP_DIR = re.compile(r"^step_(\d{8})$")


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np
        np.random.set_state(state["numpy"])


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def save(engine, *, run_dir: str | Path, step: int, rank: int, config_yaml: str, keep_last: int,
         collective: bool = True, reason: str = "periodic", rank_state: dict | None = None) -> Path:
    """Save a checkpoint of the state after `step` completed optimizer steps.

    collective=False (an exception on one rank): only this rank writes, which is a complete
    checkpoint for the torch engine on rank 0 (replicated state) and is refused otherwise.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    if not collective and world > 1:
        # Alone, a rank can write a loadable checkpoint only if it holds the whole state; any
        # other part written here would be a directory that looks like a checkpoint and is not.
        if engine.name == "deepspeed":
            raise RuntimeError("a DeepSpeed checkpoint needs every rank; cannot save from one rank")
        if rank != 0:
            raise RuntimeError(f"rank {rank} alone holds no model state to save (rank 0 writes it); "
                               f"no checkpoint written")
    path = checkpoint_root(run_dir) / f"step_{step:08d}"
    path.mkdir(parents=True, exist_ok=True)
    if engine.name == "deepspeed":
        engine.save(str(path / "ds"), client_state={"step": step})
    elif rank == 0:
        _atomic_torch_save(engine.state_dict(), path / "state.pt")
    _atomic_torch_save({"rng": rng_state(), "step": step, "state": rank_state or {}}, path / f"rank_{rank:05d}.pt")
    if collective:
        _barrier()
    if rank == 0:
        ranks_saved = list(range(world)) if collective else [rank]
        missing = [r for r in ranks_saved if not (path / f"rank_{r:05d}.pt").is_file()]
        if missing:    # never marked complete without every part
            raise RuntimeError(f"{path}: no part from rank(s) {missing}; not marked complete")
        (path / "config.yaml").write_text(config_yaml)
        meta = {"step": step, "world_size": world, "engine": engine.name, "reason": reason,
                "ranks_saved": ranks_saved, "time": time.time()}
        tmp = path / "meta.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, path / "meta.json")
        prune(run_dir, keep_last)
    if collective:
        _barrier()
    return path


def _atomic_torch_save(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def incomplete_reason(path: Path) -> str:
    """Why the checkpoint at `path` cannot be loaded ("" when it is complete)."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except FileNotFoundError:
        return "no meta.json (a save that did not finish, or one rank's part alone)"
    except (OSError, ValueError) as exc:
        return f"meta.json unreadable ({exc})"
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
        return "meta.json holds no step"
    state = path / ("ds" if meta.get("engine") == "deepspeed" else "state.pt")
    if not state.exists():
        return f"no {state.name} (the model state)"
    return ""


def _step_dirs(run_dir: str | Path) -> list[Path]:
    """Every step_NNNNNNNN directory, complete or not, oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """Completed checkpoints, oldest first."""
    return [p for p in _step_dirs(run_dir) if not incomplete_reason(p)]


def latest(run_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint (None if there is none), and the newer incomplete ones
    passed over, each with why."""
    skipped = []
    for p in reversed(_step_dirs(run_dir)):
        why = incomplete_reason(p)
        if not why:
            return p, skipped
        skipped.append((p, why))
    return None, skipped


def prune(run_dir: str | Path, keep_last: int) -> None:
    """Keep the newest `keep_last` complete checkpoints; incomplete ones older than them go too."""
    found = complete_checkpoints(run_dir)
    if len(found) <= keep_last:
        return
    oldest_kept = int(_STEP_DIR.match(found[-keep_last].name).group(1))
    for p in checkpoint_root(run_dir).iterdir():
        m = _STEP_DIR.match(p.name)
        if m and int(m.group(1)) < oldest_kept:
            shutil.rmtree(p, ignore_errors=True)


def rank_state(path: Path, rank: int) -> dict:
    """What this rank saved beside its RNG (e.g. its document count); {} when it saved nothing."""
    rank_file = path / f"rank_{rank:05d}.pt"
    if not rank_file.is_file():
        return {}
    return torch.load(rank_file, weights_only=False).get("state", {})


def load(engine, path: Path, rank: int) -> int:
    """Restore engine state and this rank's RNG from `path`; return the step to continue from.
    Raises ValueError for a checkpoint that is not complete."""
    why = incomplete_reason(path)
    if why:
        raise ValueError(f"checkpoint {path} is incomplete: {why}")
    meta = json.loads((path / "meta.json").read_text())
    if engine.name != meta["engine"]:
        raise ValueError(f"{path} was written by the {meta['engine']} engine, this run uses {engine.name}")
    if engine.name == "deepspeed":
        engine.load(str(path / "ds"))
    else:
        engine.load_state_dict(torch.load(path / "state.pt", map_location="cpu", weights_only=False))
    rank_file = path / f"rank_{rank:05d}.pt"
    if rank_file.is_file():  # absent when resuming on more ranks than saved: fresh RNG is fine
        set_rng_state(torch.load(rank_file, weights_only=False)["rng"])
    return int(meta["step"])
