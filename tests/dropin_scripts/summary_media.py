"""A script that sets a Histogram on its run's summary (W&B's summary holds its JSON)."""
import numpy as np
import wandb

run = wandb.init(project="summary-media")
run.log({"loss": 1.0})
run.summary["s_hist"] = wandb.Histogram([1, 2, 3, 3, 5], num_bins=4)
run.summary["s_np"] = wandb.Histogram(np_histogram=(np.array([1, 2]), np.array([0.0, 0.5, 1.0])))
run.log({"loss": 0.5})
run.finish()
