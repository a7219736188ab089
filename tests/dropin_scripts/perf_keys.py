"""A W&B script that logs names the daemon also derives from (perf/step_time, perf/tokens,
perf/samples) and its own perf/steps_per_second and perf/tokens_per_second: its rows are what it
logged, nothing more."""
import wandb

run = wandb.init(project="perf-keys")
for step in range(6):
    wandb.log({"perf/step_time": 0.5 if step < 4 else 0.25, "perf/tokens": 2048, "perf/samples": 16,
               "perf/tokens_per_second": 42.0, "perf/steps_per_second": 7.0, "loss": 1.0 / (step + 1)})
run.finish()
