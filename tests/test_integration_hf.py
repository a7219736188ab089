"""TelemetryCallback in a real transformers.Trainer run (tiny GPT-2 from a config, CPU, 20 steps):
the Trainer's own losses arrive in metrics.jsonl through a real daemon, and W&B never enters the
training process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

ROOT = Path(__file__).resolve().parent.parent
NUM_STEPS = 20

TRAIN = textwrap.dedent('''
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, Trainer, TrainingArguments
    from telemetry.integrations.hf import TelemetryCallback

    endpoint, out_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 256
        def __getitem__(self, i):
            x = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": x, "labels": x.clone()}

    args = TrainingArguments(output_dir=out_dir, max_steps=steps, logging_steps=1, report_to=[], use_cpu=True,
                             per_device_train_batch_size=4, save_strategy="steps", save_steps=10,
                             disable_tqdm=True, include_num_input_tokens_seen=True, learning_rate=1e-3,
                             run_name="hf-callback-test")
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(),
                      callbacks=[TelemetryCallback(endpoint=endpoint, model_info={"seq_len": 16})])
    trainer.train()
    losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    print("RESULT " + json.dumps({"wandb_imported": "wandb" in sys.modules, "losses": losses}))
''')


@pytest.mark.slow
def test_trainer_losses_arrive_in_metrics_jsonl(make_daemon, tmp_path):
    d = make_daemon(world_size=1)
    script = tmp_path / "train_hf.py"
    script.write_text(TRAIN)
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_DIR": str(tmp_path), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(script), d.ingest, str(tmp_path / "out"), str(NUM_STEPS)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT "):])
    assert result["wandb_imported"] is False  # report_to=[]: W&B stays in the daemon
    trainer_losses = {int(k): v for k, v in result["losses"].items()}
    assert sorted(trainer_losses) == list(range(1, NUM_STEPS + 1))

    recs = d.wait_for(lambda rs: sum(1 for r in rs if r.get("kind") == "metrics"
                                     and "train/loss" in r.get("values", {})) >= NUM_STEPS)
    steps = {r["step"]: r["values"] for r in recs if r.get("kind") == "metrics" and "rank" not in r}
    for step, loss in trainer_losses.items():
        v = steps[step]
        assert v["train/loss"] == pytest.approx(loss, rel=1e-6), step  # the Trainer's own value
        assert "train/lr" in v and "perf/step_time" in v and v["perf/step_time"] > 0
        assert v["perf/tokens"] == 4 * 16  # include_num_input_tokens_seen: batch 4 x 16 tokens
        assert "perf/tokens_per_second" in v  # derived by the daemon from tokens and step time
    hello = [r for r in recs if r.get("kind") == "hello"][-1]  # the client's identity hello comes first
    assert hello["info"]["config"]["max_steps"] == NUM_STEPS
    assert hello["info"]["model"]["hf_config"]["n_embd"] == 32
    events = [r for r in recs if r.get("kind") == "event"]
    saved = [e for e in events if e["name"] == "checkpoint_saved"]
    assert [e["data"]["step"] for e in saved] == [10, 20]
    assert any(e["name"] == "train_end" for e in events)


def test_metric_names_follow_the_contract():
    from telemetry.integrations.hf import metric_name

    assert metric_name("loss") == "train/loss"
    assert metric_name("learning_rate") == "train/lr"
    assert metric_name("grad_norm") == "train/grad_norm"
    assert metric_name("eval_loss") == "eval/loss"
    assert metric_name("dataset/code/loss") == "dataset/code/loss"
    assert metric_name("foo") == "train/foo"
