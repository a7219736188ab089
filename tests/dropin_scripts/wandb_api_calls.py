"""A script that calls W&B's API beyond log, config and summary: artifacts (built from files, a
directory and new_file), log_model, save, log_code, alert, mark_preempting, use_artifact offline,
the run's attributes set after init, and `summary.get` after a log (of a flat key, and of nested
dicts logged and set: read back nested, as W&B's summary holds them; keys with a define_metric
summary: {"max": ...}). What it reads back is printed
as one JSON line (the test compares the real W&B's with the drop-in's)."""
import json
import os

import wandb

seen = {"login": wandb.login(), "WANDB_MODE": os.environ.get("WANDB_MODE")}
run = wandb.init(project="parity", name="api-calls", tags=["a"], notes="first")
seen.update(resumed=run.resumed, start_time=isinstance(run.start_time, float), project_url=run.project_url)
run.log({"train/loss": 1.5})
seen["summary_get"] = run.summary.get("train/loss")
run.log({"eval": {"loss": 0.25, "per_task": {"a": 0.5}}, "eval/acc": 0.75})
run.summary["best"] = {"epoch": 2, "scores": {"f1": 0.5}}
seen["summary_nested"] = {k: run.summary.get(k) for k in ("eval", "eval/loss", "eval/acc", "best", "best/epoch")}
run.define_metric("acc", summary="max")
run.define_metric("val/*", summary="min,last")
for acc, val_loss in ((0.5, 2.0), (0.875, 1.0), (0.75, 3.0)):
    run.log({"acc": acc, "val/loss": val_loss})
seen["summary_metrics"] = {k: run.summary.get(k) for k in ("acc", "val/loss")}
seen["summary_keys"] = sorted(k for k in run.summary.keys() if not k.startswith("_"))
with open("weights.bin", "wb") as f:
    f.write(b"\x01\x02" * 1000)
os.makedirs("ckpt/inner", exist_ok=True)
with open("ckpt/config.json", "w") as f:
    f.write('{"layers": 2}')
with open("ckpt/inner/state.txt", "w") as f:
    f.write("state")
art = wandb.Artifact("my-data", type="dataset", description="tiny", metadata={"rows": 3})
art.add_file("weights.bin")
with open("weights.bin", "r+b") as f:      # rewritten in place after add_file: W&B logs what was added
    f.write(b"\x03" * 2000)
art.add_dir("ckpt", name="checkpoint")
with art.new_file("notes.txt", mode="w") as f:
    f.write("written into the artifact")
run.log_artifact(art, aliases=["best"])
wandb.log_artifact("weights.bin", name="raw-weights", type="model")
try:
    run.use_artifact("my-data:latest")
except Exception as exc:
    seen["use_artifact"] = f"{type(exc).__name__}: {exc}"
run.log_model("ckpt", name="my-model", aliases=["final"])
wandb.save("weights.bin", policy="now")
with open("model_def.py", "w") as f:
    f.write("LAYERS = 2\n")
run.log_code(".", name="source-code")
run.alert(title="loss", text="loss is high", level=wandb.AlertLevel.WARN)
wandb.alert("done", "finished")
run.mark_preempting()
run.log({"train/loss": 0.5})
run.name = "api-calls-renamed"
run.tags = ("a", "b")
run.notes = "second"
seen["alert_level"] = str(wandb.AlertLevel.ERROR.value)
print(json.dumps(seen, sort_keys=True))
run.finish()
