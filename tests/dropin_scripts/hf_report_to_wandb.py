"""An HF Trainer script that reports to W&B the usual way (report_to=["wandb"]): a tiny GPT-2 on
CPU, STEPS optimizer steps (default 8), each one logged. It prints the Trainer's own losses as
`RESULT {step: loss}`. tests/test_telemetry_run.py and tests/test_wandb_parity.py run it
unmodified, with the real wandb and under `telemetry run --as-wandb`.
"""
import json
import os

import torch
from transformers import AutoModelForCausalLM, GPT2Config, Trainer, TrainingArguments

torch.manual_seed(0)
cfg = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0)
model = AutoModelForCausalLM.from_config(cfg)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        x = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x.clone()}


args = TrainingArguments(output_dir="out", max_steps=int(os.environ.get("STEPS", "8")), logging_steps=1,
                         report_to=["wandb"], use_cpu=True, per_device_train_batch_size=4, save_strategy="no",
                         disable_tqdm=True, learning_rate=1e-3, run_name="hf-as-wandb", seed=0, data_seed=0)
trainer = Trainer(model=model, args=args, train_dataset=Tokens())
trainer.train()
print("RESULT " + json.dumps({h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}))
