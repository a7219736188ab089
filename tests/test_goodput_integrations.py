"""The goodput ledger of a run through the framework integrations (telemetry/integrations/hf.py,
lightning.py): a real transformers Trainer and a real Lightning fit on CPU, each with a slow
training data set (a sleep in __getitem__) and an evaluation of a slow eval data set, under a
real daemon. The ledger's data loading and evaluation buckets are checked against the truth timed
from outside the integration (the sleeps as slept, the evaluations as the script timed them):
within 1 % of the wall time, unexplained at most 2 %, no bucket below zero."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from telemetry.shared.goodput import BUCKETS, ledger

ROOT = Path(__file__).resolve().parent.parent

HF_SCRIPT = textwrap.dedent('''
    import json, sys, time
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, Trainer, TrainingArguments
    from telemetry.integrations.hf import TelemetryCallback

    endpoint, out_dir, steps, data_s, eval_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg)
    slept = {"train": 0.0}

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n, seed, sleep_s, train):
            self.n, self.seed, self.sleep_s, self.train = n, seed, sleep_s, train
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            t0 = time.perf_counter()
            time.sleep(self.sleep_s)
            if self.train:
                slept["train"] += time.perf_counter() - t0
            x = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(self.seed + i))
            return {"input_ids": x, "labels": x.clone()}

    class Timed(Trainer):
        evaluated = fetched = 0.0
        def get_batch_samples(self, *a, **k):      # a step's batches, fetched before it begins
            t0 = time.perf_counter()
            try:
                return super().get_batch_samples(*a, **k)
            finally:
                Timed.fetched += time.perf_counter() - t0
        def evaluate(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return super().evaluate(*a, **k)
            finally:
                Timed.evaluated += time.perf_counter() - t0

    args = TrainingArguments(output_dir=out_dir, max_steps=steps, logging_steps=4, eval_strategy="steps",
                             eval_steps=8, save_strategy="steps", save_steps=12, report_to=[], use_cpu=True,
                             per_device_train_batch_size=2, per_device_eval_batch_size=2, disable_tqdm=True,
                             learning_rate=1e-3, dataloader_num_workers=0)
    trainer = Timed(model=model, args=args, train_dataset=Tokens(512, 0, data_s, True),
                    eval_dataset=Tokens(4, 1000, eval_s, False), callbacks=[TelemetryCallback(endpoint=endpoint)])
    trainer.train()
    print("RESULT " + json.dumps({"data_s": Timed.fetched, "slept_s": slept["train"], "eval_s": Timed.evaluated}))
''')


def _result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])


def _check(led: dict, truth: dict) -> None:
    """The data and eval buckets against the truth within 1 % of the wall, the rest sound."""
    b, wall = led["buckets_s"], led["wall_s"]
    print(f"ledger {b}, wall {wall:.3f} s, truth {truth}")
    assert set(b) == set(BUCKETS) and sum(b.values()) == pytest.approx(wall, abs=1e-6)
    assert all(v >= 0.0 for v in b.values()), b
    # Booked at all, whatever the wall (a loaded box stretches the start-up, not the injected
    # sleeps): an integration that sends no timing books 0 here.
    assert b["data_loading"] >= 0.5 * truth["data_s"] > 0 and b["eval"] >= 0.5 * truth["eval_s"] > 0, (b, truth)
    assert abs(b["data_loading"] - truth["data_s"]) <= 0.01 * wall, (b, truth, wall)
    assert abs(b["eval"] - truth["eval_s"]) <= 0.01 * wall, (b, truth, wall)
    assert b["unexplained"] <= 0.02 * wall, (b, wall)
    assert b["productive"] > 0 and b["startup"] > 0


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", WANDB_DIR=str(tmp_path))
    return env


@pytest.mark.slow
def test_a_transformers_trainers_data_loading_and_evaluation_are_booked_as_timed(make_daemon, tmp_path):
    """The Trainer (24 steps, 2 samples a step that sleep 30 ms each, an evaluation of 4 samples
    that sleep 50 ms each every 8 steps, a save every 12): data loading is the Trainer's fetches
    of its batches (get_batch_samples) as timed around them, at least the sleeps (num_workers=0:
    the training thread waits for all of it), eval the Trainer's evaluate() calls as timed around
    them, and a save is a save (checkpoint_saved says its duration), not unexplained."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    d = make_daemon(world_size=1, config={"pollers": {"nvml_enabled": False}})
    script = tmp_path / "train_hf.py"
    script.write_text(HF_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), d.ingest, str(tmp_path / "out"), "24", "0.03", "0.05"],
                          cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    truth = _result(proc)
    d.drain()
    led = ledger(d.read_jsonl())
    assert led["steps"] == 24 and led["launches"] == 1 and led["steps_missing"] == 0, led
    _check(led, truth)
    assert led["buckets_s"]["data_loading"] >= truth["slept_s"] and led["buckets_s"]["checkpoint_save"] > 0.0


LIGHTNING_SCRIPT = textwrap.dedent('''
    import json, sys, time
    import lightning
    import torch
    from lightning.pytorch.loops.fetchers import _PrefetchDataFetcher
    from telemetry.integrations.lightning import TelemetryCallback, TelemetryLogger

    endpoint, out_dir, steps, data_s, eval_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
    torch.manual_seed(0)
    truth = {"data_s": 0.0, "slept_s": 0.0, "eval_s": 0.0}
    first = []        # when the first training batch began (its module hook)

    class Slow(torch.utils.data.Dataset):
        def __init__(self, n, sleep_s, train):
            self.n, self.sleep_s, self.train = n, sleep_s, train
            self.x, self.y = torch.randn(n, 4), torch.randn(n, 1)
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            t0 = time.perf_counter()
            time.sleep(self.sleep_s)
            if self.train and first:
                truth["slept_s"] += time.perf_counter() - t0
            return self.x[i], self.y[i]

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)
        def on_train_batch_start(self, batch, i):
            if not first:
                first.append(time.perf_counter())
        def training_step(self, batch, i):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.lin(x), y)
            self.log("loss", loss)
            return loss
        def validation_step(self, batch, i):
            x, y = batch
            self.log("val/loss", torch.nn.functional.mse_loss(self.lin(x), y))
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = lightning.Trainer(max_steps=steps, logger=TelemetryLogger(endpoint=endpoint), callbacks=[TelemetryCallback()],
                                log_every_n_steps=4, val_check_interval=8, accelerator="cpu", devices=1,
                                enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                                default_root_dir=out_dir)
    # The truth, timed around Lightning's own calls: the training loop's fetches of its batches
    # once training began (the first fetches, before its first batch, are start-up) and each
    # validation run (the sanity check's is start-up).
    fetch = _PrefetchDataFetcher.__next__
    def timed_fetch(self):
        t0 = time.perf_counter()
        try:
            return fetch(self)
        finally:
            if first and self is trainer.fit_loop._data_fetcher:
                truth["data_s"] += time.perf_counter() - t0
    _PrefetchDataFetcher.__next__ = timed_fetch
    val_loop = trainer.fit_loop.epoch_loop.val_loop
    run = val_loop.run
    def timed_run():
        t0 = time.perf_counter()
        try:
            return run()
        finally:
            if not trainer.sanity_checking:
                truth["eval_s"] += time.perf_counter() - t0
    val_loop.run = timed_run
    trainer.fit(Tiny(), torch.utils.data.DataLoader(Slow(512, data_s, True), batch_size=2),
                torch.utils.data.DataLoader(Slow(4, eval_s, False), batch_size=2))
    print("RESULT " + json.dumps(truth))
''')


@pytest.mark.slow
def test_a_lightning_fits_data_loading_and_validation_are_booked_as_timed(make_daemon, tmp_path):
    """Lightning (24 steps, 2 samples a step that sleep 30 ms each, a validation of 4 samples that
    sleep 50 ms each every 8 steps, the sanity check's too) with TelemetryLogger and
    TelemetryCallback: data loading is the training loop's fetches (timed around Lightning's data
    fetcher), at least the sleeps in them; eval is the validation runs (timed around the
    validation loop's run), not the sanity check's."""
    pytest.importorskip("lightning")
    d = make_daemon(world_size=1, config={"pollers": {"nvml_enabled": False}})
    script = tmp_path / "train_lightning.py"
    script.write_text(LIGHTNING_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), d.ingest, str(tmp_path / "out"), "24", "0.03", "0.05"],
                          cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    truth = _result(proc)
    d.drain()
    recs = d.read_jsonl()
    led = ledger(recs)
    # Lightning's logger steps count from 0: one record a step, the logged values in them.
    steps = {r["step"]: r["values"] for r in recs if r["kind"] == "metrics" and "rank" not in r}
    assert sorted(steps) == list(range(24)), sorted(steps)
    assert all("loss" in steps[s] for s in (3, 7, 11)) and all("val/loss" in steps[s] for s in (7, 15, 23)), steps
    assert led["steps"] == 24 and led["launches"] == 1 and led["steps_missing"] == 0, led
    _check(led, truth)
    assert led["buckets_s"]["data_loading"] >= truth["slept_s"]


def test_an_accelerate_scripts_own_timing_values_reach_the_ledger(make_daemon):
    """Accelerate's tracker sees only what the script logs: the perf/data_loading_time,
    perf/step_time and perf/eval_time a script logs through `accelerator.log` (here the tracker's
    own log, as Accelerate calls it) reach the step records by those names, and the ledger books
    them, each step within the time between its record and the one before (a row goes out when
    the next step is logged, W&B's rule: the last step's and an evaluation's longer than the next
    step are booked in part)."""
    pytest.importorskip("accelerate")
    import time

    from telemetry.integrations.accelerate import TelemetryTracker

    d = make_daemon(world_size=1, config={"pollers": {"nvml_enabled": False}})
    tracker = TelemetryTracker(project="p", name="goodput", endpoint=d.ingest)
    tracker.start()
    logged = {}
    for step in range(1, 11):
        t0 = time.perf_counter()
        time.sleep(0.02)                           # the wait for the batch
        wait = time.perf_counter() - t0
        time.sleep(0.01)                           # the step's compute
        values = {"train/loss": 1.0 / step, "perf/data_loading_time": wait, "perf/step_time": time.perf_counter() - t0}
        if step == 5:
            t1 = time.perf_counter()
            time.sleep(0.01)                       # an evaluation after the step, shorter than a step
            values["perf/eval_time"] = time.perf_counter() - t1
        logged[step] = values
        tracker.log(values, step=step)
    tracker.finish()
    d.drain()
    recs = d.read_jsonl()
    steps = {r["step"]: r["values"] for r in recs if r["kind"] == "metrics" and "rank" not in r}
    for step, values in logged.items():
        for k, v in values.items():
            assert steps[step][k] == pytest.approx(v), (step, k)
    led = ledger(recs)
    b = led["buckets_s"]
    assert led["steps"] == 10 and set(b) == set(BUCKETS), led
    data = sum(v["perf/data_loading_time"] for v in logged.values())
    # In part: the last step's (no record after it), the eval step's (its record's room is the next step's).
    part = logged[10]["perf/data_loading_time"] + logged[5]["perf/data_loading_time"]
    assert data - part - 1e-3 <= b["data_loading"] <= data + 1e-9, (b, data)
    assert b["eval"] == pytest.approx(logged[5]["perf/eval_time"], abs=1e-3), b
