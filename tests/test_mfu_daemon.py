"""MFU end to end: a real daemon, two synthetic ranks, perf/mfu in metrics.jsonl by hand."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from telemetry.client import TelemetryClient

ROOT = Path(__file__).resolve().parent.parent
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": None, "intermediate_size": 96, "vocab_size": 128,
         "tie_word_embeddings": False}
N = 69_632                # matmul weights incl. LM head (tests/test_mfu.py::test_llama_by_hand)
ATTN = 4 * 2 * 4 * 16     # forward attention FLOPs per unit of sum L_i^2 (4 * L * H * d)
H100_BF16 = 989.4e12


def start_daemon(tmp_path: Path) -> tuple[subprocess.Popen, dict[str, str], list[str]]:
    eps = {k: f"ipc://{tmp_path}/{k}.sock" for k in ("ingest", "pub", "control")}
    cmd = [sys.executable, "-m", "telemetry", "daemon", "--log-dir", str(tmp_path / "telemetry"),
           "--wandb", "disabled", "--world-size", "2",
           "--ingest", eps["ingest"], "--pub", eps["pub"], "--control", eps["control"]]
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_DIR": str(tmp_path)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready = threading.Event()
    lines: list[str] = []

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line)
            if "telemetry daemon ready" in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(90):  # generous: the CPU is shared with other test runs
        proc.kill()
        pytest.fail("daemon never said ready:\n" + "".join(lines))
    return proc, eps, lines


def read_step(jsonl: Path, step: int, log_lines: list[str], timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if jsonl.exists():
            for line in jsonl.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("kind") == "metrics" and rec.get("step") == step and "rank" not in rec:
                    return rec
        time.sleep(0.05)
    found = jsonl.read_text() if jsonl.exists() else "(no file)"
    pytest.fail(f"no aggregated step {step} in {jsonl}:\n{found}\ndaemon output:\n{''.join(log_lines)}")


def test_daemon_reports_mfu_from_rank_records(tmp_path):
    proc, eps, log_lines = start_daemon(tmp_path)
    try:
        # (tokens, sum L_i^2, step_time_s) per rank: packed rows, gradient accumulation folded in
        ranks = {0: (2048, 2048 * 10, 0.50), 1: (1536, 1536 * 12, 0.40)}
        clients = [TelemetryClient(eps["ingest"], rank=r) for r in ranks]
        for rank, client in enumerate(clients):
            client.hello({"world_size": 2, "device_name": "NVIDIA H100 80GB HBM3",
                          "model": {"hf_config": LLAMA, "num_params": 1, "seq_len": 16,
                                    "gradient_checkpointing": False, "dtype": "bf16", "causal": True}})
        for rank, client in enumerate(clients):
            tokens, doc_sq, step_time_s = ranks[rank]
            client.log(1, {"perf/tokens": tokens, "perf/attn_doc_len_sq": doc_sq,
                           "perf/step_time": step_time_s, "train/loss": 1.0})
        for client in clients:
            client.close()
        rec = read_step(tmp_path / "telemetry" / "metrics.jsonl", 1, log_lines)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    # PaLM/Megatron convention (the daemon's default): attention counted whole, causal or not
    rate = sum((6 * N * t + 3 * ATTN * sq) / s for t, sq, s in ranks.values())
    values = rec["values"]
    assert "perf/mfu" in values, rec
    assert values["perf/mfu"] == pytest.approx(rate / (2 * H100_BF16), rel=1e-9)
    assert values["perf/mfu_percent"] == pytest.approx(100 * rate / (2 * H100_BF16), rel=1e-9)
    assert values["perf/hfu"] == pytest.approx(values["perf/mfu"], rel=1e-9)
