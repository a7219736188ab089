"""`import telemetry.wandb as wandb` in an unmodified W&B training script: the W&B offline run the
daemon writes holds the same history, config and summary as the same script with the real wandb.

The whole history by `_step` is compared, and the summary: the daemon's own series are in the
run's system metrics, not in the script's history. The script (tests/dropin_scripts/nanogpt_wandb.py) runs on 2 CPU ranks (gloo, torchrun's
environment) with W&B's step and commit rules in use: commit=False then a commit, nested dicts,
an explicit step= ahead of the current one, one below it (dropped), tensors, run.summary and
wandb.summary, wandb.config.update. The reference is the same file with the real wandb
(offline), every rank writing its own run: where only rank 0 logs, ours must equal rank 0's
run; where every rank logs, ours holds the mean of the ranks' runs at each step.
"""
from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from wandb_offline import config, history_key_paths, history_rows, run_info, summary, user_summary, wait_finished

pytest.importorskip("wandb")
pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parent / "dropin_scripts" / "nanogpt_wandb.py"
ROOT = Path(__file__).resolve().parent.parent
IMPORT_LINE = "import wandb\n"
# Keys W&B adds to every row: not the script's.
WANDB_ROW_KEYS = {"_step", "_timestamp", "_runtime"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_ranks(script: Path, env: dict[str, str], timeout_s: float = 240.0) -> list[str]:
    port = str(_free_port())
    procs = []
    for rank in range(2):
        e = {**os.environ, **env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WANDB_SILENT": "true",
             "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=e, cwd=str(script.parent),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(out)
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank}:\n{out}"
    return outs


def dropin_copy(script: Path, dest: Path) -> Path:
    """The script with its `import wandb` line, and nothing else, changed."""
    text = script.read_text()
    assert text.count(IMPORT_LINE) == 1
    out = dest / script.name
    out.write_text(text.replace(IMPORT_LINE, "import telemetry.wandb as wandb\n"))
    return out


def offline_runs(wandb_dir: Path) -> list[Path]:
    return [Path(wait_finished(p)) for p in sorted(glob.glob(str(wandb_dir / "wandb" / "offline-run-*" / "run-*.wandb")))]


def script_rows(path: Path) -> dict[int, dict]:
    """A real run's rows by W&B step, without W&B's own keys."""
    return {r["_step"]: {k: v for k, v in r.items() if k not in WANDB_ROW_KEYS} for r in history_rows(path)}


def mean_rows(runs: list[dict[int, dict]]) -> dict[int, dict]:
    steps = set().union(*runs)
    out = {}
    for s in steps:
        rows = [r[s] for r in runs if s in r]
        assert len(rows) == len(runs), f"step {s} not in every rank's run"
        out[s] = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    return out


def assert_same_history(ours: dict[int, dict], expected: dict[int, dict]) -> None:
    assert sorted(ours) == sorted(expected)
    for s, row in expected.items():
        assert set(ours[s]) == set(row), f"step {s}"
        for k, v in row.items():
            assert ours[s][k] == pytest.approx(v, rel=1e-6), f"step {s} {k}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The script with the real wandb, every rank logging to its own offline run."""
    tmp = tmp_path_factory.mktemp("real")
    _run_two_ranks(SCRIPT, {"LOG_ON": "all", "WANDB_MODE": "offline", "WANDB_DIR": str(tmp)})
    files = offline_runs(tmp)
    assert len(files) == 2
    by_rank = {}
    for f in files:
        rows = script_rows(f)
        by_rank[int(rows[0]["extra/rank/plus_iter"])] = f     # rank + iter, at iter 0
    return by_rank


@pytest.mark.slow
@pytest.mark.parametrize("log_on", ["rank0", "all"])
def test_dropin_script_matches_real_wandb(log_on, reference, tmp_path, make_daemon):
    d = make_daemon(wandb="offline", run_name="daemon-name")
    script = dropin_copy(SCRIPT, tmp_path)
    outs = _run_two_ranks(script, {"LOG_ON": log_on, "WANDB_DIR": str(tmp_path / "files"),
                                   "TELEMETRY_ENDPOINT": d.ingest})
    # The dropped step=1: W&B says so on stderr, but not with $WANDB_SILENT (set here).
    assert "less than the current step" not in outs[0]
    assert d.stop(timeout_s=60) == 0
    (ours,) = offline_runs(tmp_path / "files")                  # where $WANDB_DIR says, as W&B
    real0 = reference[0]
    keys = set().union(*script_rows(real0).values())
    if log_on == "rank0":
        expected = script_rows(real0)
    else:
        expected = mean_rows([script_rows(reference[0]), script_rows(reference[1])])
    # The whole history, by _step: the script's rows at the script's steps, nothing else.
    assert_same_history(script_rows(ours), expected)
    real_paths = {p for p in history_key_paths(real0) if "/".join(p) in keys}
    assert ("extra", "rank", "plus_iter") in real_paths           # nested dicts stay nested, as in W&B
    assert {p for p in history_key_paths(ours) if "/".join(p) in keys} == real_paths
    # The run the daemon opened is the one the script's init named, with its config and summary.
    info = run_info(ours)
    assert (info["project"], info["name"], info["group"], sorted(info["tags"])) == \
        ("dropin", f"nano-{log_on}", "ddp", ["cpu", "test"])
    real_cfg, our_cfg = config(real0), config(ours)
    for k in ("learning_rate", "max_iters", "batch_size", "model", "world"):
        assert our_cfg[k] == real_cfg[k], k
    assert summary(ours)["final_iter"] == summary(real0)["final_iter"] == 8
    if log_on == "rank0":
        assert user_summary(ours) == pytest.approx(user_summary(real0), rel=1e-6)
    assert summary(ours)["best_loss"] == pytest.approx(summary(real0)["best_loss"]) or log_on == "all"
    # Every step went out with every rank that logs: no waiting for a rank that never logs.
    metrics = d.read_jsonl(kind="metrics", aggregated=True)
    assert metrics and not any(r.get("missing_ranks") for r in metrics)
