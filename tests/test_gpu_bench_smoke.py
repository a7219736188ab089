"""The GPU benchmark (benchmarks/gpu/) in its reduced CPU form, and its pieces.

No timings are asserted: the figures belong in benchmarks/RESULTS.md. What is checked is that
every part runs end to end on CPU and that the zero-sync check can fail.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import stats
from benchmarks.gpu.syncguard import SyncWindow

ROOT = Path(__file__).resolve().parent.parent


def _env(tmp_path: Path) -> dict:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    env.pop("TELEMETRY_DISABLED", None)
    env.pop("OUT", None)
    return env


def test_sync_window_counts_project_reads_and_lists_library_reads():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()  # creates the optimizer's host-side step counters
    w = SyncWindow(cuda=False)
    w.start()
    try:
        x = torch.ones(3)
        x.sum().item()             # a read made by this (project) file
        bool(x.sum() > 0)          # and another
        model(torch.randn(2, 4)).sum().backward()
        opt.step()                 # torch.optim reads its step counters itself
    finally:
        w.stop()
    s = w.summary()
    assert s["num_reads"] == 2
    assert {r["what"] for r in s["reads"]} == {"item", "__bool__"}
    assert all("test_gpu_bench_smoke.py" in r["site"] for r in s["reads"])
    assert s["num_library_reads"] >= 1
    assert all(r["site"].startswith("torch/") for r in s["library_reads"])
    # stop() restored the real methods: reads after the window are not counted.
    torch.ones(1).item()
    assert w.summary()["num_reads"] == 2
    assert "item" not in torch.Tensor.__dict__


def test_ratio_ci_brackets_the_ratio_of_medians():
    base = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95] * 5
    other = [2 * x for x in base]
    lo, hi = stats.ratio_ci(base, other)
    assert lo <= 2.0 <= hi
    assert stats.pct([3.0, 1.0, 2.0], 1.0) == 3.0


def test_nvml_compare_reports_why_without_nvml():
    from benchmarks.gpu.nvml_compare import compare

    res = compare(num_samples=1, interval_s=0.1, load=False)
    if res["available"]:
        pytest.skip("NVML is present on this machine")
    assert res["reason"].startswith("no NVML")


def test_mfu_count_matches_formula_for_tiny_config():
    from benchmarks.gpu.mfu_compare import counted_step
    from trainer.config import load_config

    res = counted_step(load_config(ROOT / "launch/configs/tiny.yaml", []))
    assert res["counted_flops"] > 0
    assert res["ratio"] == pytest.approx(1.0, abs=0.005)


def _run_bench(tmp_path: Path, *args: str, timeout: int = 400) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    p = subprocess.run(["bash", str(ROOT / "benchmarks/gpu/run.sh"), "--cpu-smoke", "--out", str(out), *args],
                       cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=timeout)
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else {}
    return p, results


@pytest.mark.slow
def test_cpu_smoke_runs_every_part_end_to_end(tmp_path):
    p, results = _run_bench(tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    parts = results["parts"]
    assert set(parts) == {"overhead", "nosync", "mfu", "nvml"}
    assert not [k for k, v in parts.items() if "error" in v]
    ov = parts["overhead"]
    assert not ov["failed"]
    for v in ("off", "ours", "seed"):
        assert ov["variants"][v]["num_steps"] == results["meta"]["preset"]["measure"]
        assert ov["variants"][v]["median_s"] > 0
    ours = [r for r in ov["runs"] if r["variant"] == "ours"][0]
    assert ours["client_stats"]["sent"] > 0 and ours["client_stats"]["dropped"] == 0
    jsonl = (tmp_path / "out" / ours["metrics_jsonl"]).read_text().splitlines()
    steps = {json.loads(l)["step"] for l in jsonl if json.loads(l)["kind"] == "metrics"}
    assert max(steps) == results["meta"]["preset"]["warmup"] + results["meta"]["preset"]["measure"]
    assert parts["nosync"]["ok"] is True
    assert parts["nosync"]["checks"][0]["num_log_steps_checked"] >= 1
    assert parts["mfu"]["counted"]["ratio"] == pytest.approx(1.0, abs=0.005)
    assert parts["mfu"]["analytic"]["perf/model_flops_per_second"] > 0
    assert parts["mfu"]["matmul"]["flops_per_second"] > 0
    md = (tmp_path / "out" / "results.md").read_text()
    assert "CPU SMOKE" in md and "NOT GPU figures" in md
    assert md.strip() in p.stdout


@pytest.mark.slow
def test_nosync_check_fails_when_a_sync_is_added(tmp_path):
    p, results = _run_bench(tmp_path, "--parts", "nosync", "--inject-sync")
    assert p.returncode == 1
    check = results["parts"]["nosync"]["checks"][0]
    assert check["ok"] is False
    assert check["num_reads"] >= 1
    assert any("benchmarks/gpu/child.py" in r["site"] for r in check["reads"])
