"""TelemetryCallback in a real transformers.Trainer run (tiny GPT-2 from a config, CPU, 20 steps):
the Trainer's own losses arrive in metrics.jsonl through a real daemon, and W&B never enters the
training process."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from wandb_offline import run_info, summary, user_history, wait_finished  # noqa: E402

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
    d = make_daemon(world_size=1, wandb="offline")
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
        assert "train/learning_rate" in v and "perf/step_time" in v and v["perf/step_time"] > 0
        assert v["train/global_step"] == step          # W&B's callback's names
        assert v["perf/tokens"] == 4 * 16  # include_num_input_tokens_seen: batch 4 x 16 tokens
        assert "perf/tokens_per_second" in v  # derived by the daemon from tokens and step time
    hello = [r for r in recs if r.get("kind") == "hello"][-1]  # the client's identity hello comes first
    assert hello["info"]["config"]["max_steps"] == NUM_STEPS
    # W&B's callback's config: the model's config, the arguments, the parameter count.
    assert hello["info"]["config"]["n_embd"] == 32 and hello["info"]["config"]["model/num_parameters"] > 0
    assert hello["info"]["model"]["hf_config"]["n_embd"] == 32
    events = [r for r in recs if r.get("kind") == "event"]
    saved = [e for e in events if e["name"] == "checkpoint_saved"]
    assert [e["data"]["step"] for e in saved] == [10, 20]
    assert any(e["name"] == "train_end" for e in events)
    # The W&B run is the one W&B's callback opens: project "huggingface", named by run_name; the
    # end-of-training values in its summary, not in its history; rows at their optimizer step.
    assert d.stop(timeout_s=60) == 0
    (path,) = glob.glob(str(d.log_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    path = wait_finished(path)
    info = run_info(path)
    assert (info["project"], info["name"]) == ("huggingface", "hf-callback-test")
    history = user_history(path)
    assert {s: r["train/loss"] for s, r in history.items() if "train/loss" in r} == \
        pytest.approx(trainer_losses, rel=1e-6)
    assert not any("train_runtime" in r or "train/train_runtime" in r for r in history.values())
    summ = summary(path)
    assert summ["train_runtime"] > 0 and "train_loss" in summ and "total_flos" in summ


def test_metric_names_follow_the_contract():
    from telemetry.integrations.hf import metric_name

    # As W&B's callback names them (transformers' rewrite_logs).
    from transformers.integrations.integration_utils import rewrite_logs

    for key in ("loss", "learning_rate", "grad_norm", "eval_loss", "test_acc", "dataset/code/loss", "foo", "epoch"):
        assert {metric_name(key): 1} == rewrite_logs({key: 1}), key
    assert metric_name("learning_rate") == "train/learning_rate"


# -- a step with an evaluation is one record per rank (issue 29 item 6, the Trainer's side) --------
class _Recorder:
    """A client that records what the callback sends."""

    def __init__(self):
        self.logs, self.events = [], []

    def log(self, step, values, parts=1):
        self.logs.append((step, dict(values), parts))

    def event(self, name, data):
        self.events.append((name, data))

    def hello(self, info):
        pass

    def close(self):
        pass


def _step(cb, state, control, step, logs=(), eval_logs=()):
    """What transformers.Trainer calls for one optimizer step (_inner_training_loop, then
    _maybe_log_save_evaluate): a training log when it logs, then one on_log and one on_evaluate
    per eval dataset when it evaluates (CallbackHandler.on_evaluate clears should_evaluate)."""
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir="/nonexistent", report_to=[], use_cpu=True)
    cb.on_step_begin(args, state, control)
    state.global_step = step
    control.should_evaluate = bool(eval_logs)
    cb.on_step_end(args, state, control)
    for log in logs:
        cb.on_log(args, state, control, logs=log)
    for log in eval_logs:
        cb.on_log(args, state, control, logs=log)
        control.should_evaluate = False
        cb.on_evaluate(args, state, control, metrics=log)


def test_a_step_with_an_evaluation_is_one_record():
    from transformers import TrainerControl, TrainerState

    from telemetry.integrations.hf import TelemetryCallback

    rec = _Recorder()
    cb = TelemetryCallback(client=rec)
    state, control = TrainerState(), TrainerControl()
    _step(cb, state, control, 1, logs=[{"loss": 2.0, "learning_rate": 1e-3}])
    # a logged step with two eval datasets: the training log, then each dataset's
    _step(cb, state, control, 2, logs=[{"loss": 1.5, "learning_rate": 1e-3}],
          eval_logs=[{"eval_a_loss": 1.7, "epoch": 0.1}, {"eval_b_loss": 1.9, "epoch": 0.1}])
    # an evaluation at a step that logs nothing else
    _step(cb, state, control, 3, eval_logs=[{"eval_loss": 1.6}])
    _step(cb, state, control, 4, logs=[{"loss": 1.4, "learning_rate": 1e-3}])
    cb.on_train_end(None, state, control)
    steps = [s for s, _, _ in rec.logs]
    assert steps == [1, 2, 3, 4], rec.logs               # one record a step, never a second one
    by_step = {s: v for s, v, _ in rec.logs}
    assert {"train/loss", "eval/a_loss", "eval/b_loss", "perf/step_time"} <= set(by_step[2]), by_step[2]
    assert by_step[2]["train/loss"] == 1.5 and by_step[2]["eval/b_loss"] == 1.9
    assert {"eval/loss", "perf/step_time"} <= set(by_step[3]) and "train/loss" not in by_step[3], by_step[3]
    assert [n for n, _ in rec.events] == ["evaluate", "evaluate", "evaluate"]


TRAIN_EVAL = textwrap.dedent('''
    import sys
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, Trainer, TrainingArguments
    from telemetry.integrations.hf import TelemetryCallback

    endpoint, out_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg)

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n, seed):
            self.n, self.seed = n, seed
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            x = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(self.seed + i))
            return {"input_ids": x, "labels": x.clone()}

    args = TrainingArguments(output_dir=out_dir, max_steps=steps, logging_steps=1, eval_strategy="steps",
                             eval_steps=2, report_to=[], use_cpu=True, ddp_backend="gloo",
                             per_device_train_batch_size=4, per_device_eval_batch_size=4, save_strategy="no",
                             disable_tqdm=True, learning_rate=1e-3)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(256, 0),
                      eval_dataset={"a": Tokens(8, 1000), "b": Tokens(8, 2000)},
                      callbacks=[TelemetryCallback(endpoint=endpoint, model_info={"seq_len": 16})])
    trainer.train()
''')


@pytest.mark.slow
def test_two_ranks_with_two_eval_datasets_write_each_step_once(make_daemon, tmp_path):
    """The Trainer on 2 gloo ranks under torchrun, logging every step, evaluating 2 datasets
    every 2 steps: one aggregate per step, the eval steps holding the training loss and both
    datasets' eval values (the callback sent three records for each of them before)."""
    steps = 6
    d = make_daemon(world_size=2, config={"aggregator": {"step_timeout_s": 600}, "pollers": {"nvml_enabled": False}})
    script = tmp_path / "train_hf_eval.py"
    script.write_text(TRAIN_EVAL)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "WANDB_DIR": str(tmp_path),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), d.ingest, str(tmp_path / "out"), str(steps)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d.drain()
    recs = [json.loads(line) for line in (Path(d.log_dir) / "metrics.jsonl").read_text().splitlines()]
    agg = [r for r in recs if r["kind"] == "metrics" and "rank" not in r]
    assert sorted(r["step"] for r in agg) == list(range(1, steps + 1)), [(r["step"], sorted(r["values"])) for r in agg]
    for r in agg:
        assert "missing_ranks" not in r, r
        evals = {k for k in r["values"] if k.startswith("eval/") and k.endswith("_loss")}
        assert "train/loss" in r["values"], r
        assert evals == ({"eval/a_loss", "eval/b_loss"} if r["step"] % 2 == 0 else set()), (r["step"], evals)
