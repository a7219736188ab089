"""transformers Trainer -> telemetry sidecar, one line:

    from telemetry.integrations.hf import TelemetryCallback
    trainer = Trainer(..., args=TrainingArguments(..., report_to=[]), callbacks=[TelemetryCallback()])

Every rank sends its own records through a TelemetryClient (endpoint from $TELEMETRY_ENDPOINT or
the default ipc socket; rank from $RANK); the daemon aggregates, writes metrics.jsonl and talks
to W&B, so with report_to=[] (or "none") wandb is never imported in the training processes.

The W&B run the daemon makes of it is the one W&B's own callback (report_to="wandb") makes:
project $WANDB_PROJECT or "huggingface", named by `run_name`, the config the model's config and
the TrainingArguments (credentials left out) with "model/num_parameters", the Trainer's log keys
named as W&B's callback names them (`rewrite_logs`: eval_x -> eval/x, test_x -> test/x, anything
else -> train/x: loss -> train/loss, learning_rate -> train/learning_rate) with
"train/global_step", and the end-of-training values (train_runtime, train_loss, ...) in the
summary, not in the history. Each row is at its optimizer step (`_step` = global step).

What is sent:
- at train begin, a hello with that config and run name, and the model's config as "model" (so
  the daemon can compute MFU once tokens are known);
- per optimizer step (on_step_end), the Trainer's own values: perf/step_time, perf/data_loading_time,
  train/epoch and, with include_num_input_tokens_seen, perf/tokens (tokens this rank consumed in
  the step); they go out with that step's on_log values when it has them;
- what the goodput ledger (telemetry/shared/goodput.py) books, as the repo's own trainer sends it
  (trainer/train.py): perf/data_loading_time, what the step waited for its batches (synchronous
  data loading: the Trainer fetches a step's micro-batches before on_step_begin, so it is the time
  from the end of what the step before did (its log, evaluation and save) to on_step_begin; a
  DataLoader worker's work that overlapped the step before is not in it), perf/step_time from
  then to on_step_end (the evaluation and save after a step are not in the next one's time), and
  perf/eval_time, the step's evaluation (from the hook before its first on_prediction_step to its
  last on_evaluate, every eval dataset's), with the step's record; checkpoint_saved says its
  duration_s (from the hook before the save to on_save);
- a step with an evaluation is one record per rank: its training logs and the eval logs of every
  eval dataset (one on_log each) are held together. A record goes out as soon as nothing more of
  its step can come (the ledger takes a record's time for its step's end): at on_step_end when the
  Trainer will not log, evaluate or end the epoch there, at its on_log when it does not evaluate,
  at the last eval dataset's on_evaluate (one dataset; of several, the last of the names the first
  evaluation had: that first one goes out when the next step begins), before a save's event; else
  when the next step begins or training ends;
- on_save and on_evaluate as events (checkpoint_saved, evaluate); the end-of-training values as
  the run's summary (a wandb/summary event) and a train_end event.
Nothing here reads a device tensor: the Trainer has already turned its logs into floats.
"""
from __future__ import annotations

import os
import time
from typing import Any

from transformers import TrainerCallback

from telemetry.integrations._client import LazyClient

# Keys of the Trainer's end-of-training log: the run's summary, as W&B's callback keeps them.
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss")
SUMMARY_EVENT = "wandb/summary"


def metric_name(key: str) -> str:
    """A Trainer log key as W&B's callback names it (transformers' rewrite_logs)."""
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_"):]
    if key.startswith("test_"):
        return "test/" + key[len("test_"):]
    return "train/" + key


def _number(v: Any) -> float | int | None:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    try:
        f = float(v)  # numpy scalars, 0-dim tensors already on the host
    except (TypeError, ValueError):
        return None
    return f


class TelemetryCallback(TrainerCallback):
    """Send a transformers Trainer's metrics and events to the telemetry daemon.

    Args:
        client: a TelemetryClient to use (its owner closes it); default: one made at train
            begin on `endpoint`, closed at train end.
        endpoint: the daemon's ingest endpoint; None = $TELEMETRY_ENDPOINT or the default.
        model_info: extra keys for the hello's "model" map (e.g. {"seq_len": 2048,
            "dtype": "bf16", "causal": True}); seq_len and dtype are what MFU needs.
    """

    def __init__(self, client: Any = None, endpoint: str | None = None,
                 model_info: dict[str, Any] | None = None) -> None:
        self._client = LazyClient(client, endpoint)
        self._model_info = dict(model_info or {})
        self._pending: dict[str, Any] = {}
        self._pending_step: int | None = None
        self._held_step: int | None = None    # a step whose evaluation runs: its logs are held
        self._tokens_seen = 0
        # Times (perf_counter) for the goodput ledger (module docstring): when the Trainer last
        # finished something a hook tells (train or epoch begin, a step's end, its log, its
        # evaluation, its save); when this step's wait for data began, and how long it was;
        # when the evaluation under way began (None: none is).
        self._mark: float | None = None
        self._step_from: float | None = None
        self._data_s = 0.0
        self._eval_from: float | None = None
        # The eval datasets' names in the order the first evaluation of several had them (their
        # metrics' prefix, eval_<name>_runtime), the ones this evaluation has had so far.
        self._eval_names: list[str] | None = None
        self._eval_seen: list[str] = []

    # -- the client ---------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        return self._client.get()

    def _flush(self) -> None:
        if self._pending_step is not None and self._pending:
            self.client.log(self._pending_step, self._pending)
        if self._eval_seen and self._eval_names is None:
            self._eval_names = self._eval_seen       # the first evaluation of several: now known
        self._eval_seen = []
        self._pending = {}
        self._pending_step = None
        self._held_step = None

    # -- Trainer hooks ------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        config = _training_args(args)
        run_name = getattr(args, "run_name", None)
        model_map: dict[str, Any] = {}
        cfg = getattr(model, "config", None)
        if cfg is not None and hasattr(cfg, "to_dict"):
            model_map["hf_config"] = cfg.to_dict()
            config = {**_plain(model_map["hf_config"]), **config}       # W&B's callback: model config, then args
        if model is not None and hasattr(model, "parameters"):
            model_map["num_params"] = sum(p.numel() for p in model.parameters())
            config["model/num_parameters"] = model_map["num_params"]
        # The W&B run as W&B's callback opens it (trial runs aside).
        wandb_info = {"project": os.environ.get("WANDB_PROJECT") or "huggingface", "metrics": [
            {"name": "train/global_step"}, {"name": "*", "step_metric": "train/global_step", "step_sync": True}]}
        if run_name:
            wandb_info["name"] = run_name
        info: dict[str, Any] = {"framework": "transformers", "config": config, "wandb": wandb_info}
        if run_name and not os.environ.get("TELEMETRY_RUN_NAME"):
            info["run_name"] = run_name
        model_map["gradient_checkpointing"] = bool(getattr(args, "gradient_checkpointing", False))
        model_map["dtype"] = "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"
        model_map.update(self._model_info)
        info["model"] = model_map
        try:
            import torch

            if torch.cuda.is_available() and not getattr(args, "use_cpu", False):
                info["device_name"] = torch.cuda.get_device_name()
        except Exception:
            pass
        self.client.hello(info)
        self._tokens_seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        self._mark = time.perf_counter()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()
        self._mark = time.perf_counter()    # the epoch's data loader starts (its workers): data loading

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        self._flush()  # the previous step's record, if nothing sent it yet
        # The Trainer fetched this step's batches since what it did last (get_batch_samples).
        self._step_from = self._mark if self._mark is not None else now
        self._data_s = now - self._step_from

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        values: dict[str, Any] = {}
        if self._step_from is not None:
            values["perf/step_time"] = now - self._step_from
            values["perf/data_loading_time"] = self._data_s
        self._step_from = None
        if state.epoch is not None:
            values["train/epoch"] = float(state.epoch)
        seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        if seen > self._tokens_seen:
            # num_input_tokens_seen is gathered across ranks by the Trainer: this rank's share.
            values["perf/tokens"] = (seen - self._tokens_seen) / max(1, int(getattr(args, "world_size", 1) or 1))
            self._tokens_seen = seen
        self._pending_step = state.global_step
        self._pending = values
        # The flags the Trainer's flow callback (called before this one) set for this step: with
        # none, no log or evaluation of this step follows, and its record goes now. At an
        # epoch's end (a whole epoch) or training's, the epoch's log and evaluation may follow.
        epoch_end = state.epoch is not None and float(state.epoch).is_integer()
        if not (getattr(control, "should_log", False) or getattr(control, "should_evaluate", False)
                or getattr(control, "should_training_stop", False) or epoch_end):
            self._flush()
        self._mark = time.perf_counter()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not (getattr(control, "should_log", False) or getattr(control, "should_evaluate", False)):
            self._flush()    # the epoch's end logs and evaluates nothing: the last step's record is whole
        self._mark = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        self._log(state, control, logs or {})
        if self._eval_from is None:     # (an evaluation's own log: the evaluation goes on to on_evaluate)
            self._mark = time.perf_counter()

    def _log(self, state: Any, control: Any, logs: dict[str, Any]) -> None:
        scalars = {k: n for k in SUMMARY_KEYS if k in logs and (n := _number(logs[k])) is not None}
        if scalars:
            # The run's summary, as W&B's callback keeps them (some transformers versions put
            # train_runtime in every log: the summary then holds the last one, as in W&B).
            self.client.event(SUMMARY_EVENT, scalars)
        if "train_loss" in logs:
            # The end-of-training log. Its other keys (the epoch) are the last step's, already
            # sent: a second record of that step would be a second point of it.
            self.client.event("train_end", scalars)
            return
        values = {metric_name(k): n for k, v in logs.items() if k not in SUMMARY_KEYS and (n := _number(v)) is not None}
        if not values:
            return
        values["train/global_step"] = state.global_step
        if self._pending_step == state.global_step:
            # This step's on_step_end values and its logs, one record. While the step's evaluation
            # runs or is about to (the Trainer logs the training values, then each eval dataset's
            # in an on_log of its own), the record waits for them all: a second record of the
            # step would be written as a second point (and, across ranks, split the step).
            self._pending.update(values)
            if getattr(control, "should_evaluate", False) or self._eval_from is not None:
                self._held_step = state.global_step
            if self._held_step != state.global_step:
                self._flush()
        else:
            self._flush()
            self.client.log(state.global_step, values)  # e.g. an evaluation between steps

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._eval_from is None:     # an evaluation's first batch: it began after what came last
            self._eval_from = self._mark if self._mark is not None else time.perf_counter()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        self._flush()     # the step's record before the save's event (the ledger books them in order)
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        data: dict[str, Any] = {"step": state.global_step, "path": path}
        if self._mark is not None:
            data["duration_s"] = now - self._mark
        self.client.event("checkpoint_saved", data)
        self._mark = time.perf_counter()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None,
                    **kwargs: Any) -> None:
        now = time.perf_counter()
        began = self._eval_from if self._eval_from is not None else self._mark
        self._eval_from = None
        data = {metric_name(k): n for k, v in (metrics or {}).items() if (n := _number(v)) is not None}
        self.client.event("evaluate", {"step": state.global_step, **data})
        if self._pending_step == state.global_step:
            if began is not None:
                self._pending["perf/eval_time"] = self._pending.get("perf/eval_time", 0.0) + (now - began)
            # Which eval dataset this was (its metrics' prefix): with one, or the last of the
            # names the first evaluation of several had, the step's record is whole.
            name = next((k[:-len("_runtime")] for k in (metrics or {}) if k.endswith("_runtime")), None)
            self._eval_seen.append(name or "")
            if name == "eval" or (self._eval_names is not None and self._eval_seen == self._eval_names):
                self._flush()
            else:
                self._held_step = state.global_step   # more eval datasets may log at this step
        self._mark = time.perf_counter()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()
        self._client.close()  # an own client only; bounded: never holds up the trainer's exit


def _plain(d: dict) -> dict[str, Any]:
    """A config's values as JSON-able ones (nested maps kept; anything else as text)."""
    return {k: v if isinstance(v, (int, float, str, bool, type(None), dict, list)) else str(v) for k, v in d.items()}


def _training_args(args: Any) -> dict[str, Any]:
    """TrainingArguments as JSON-able values (enums and paths as text; the client does the rest)."""
    try:
        d = args.to_dict()
    except Exception:
        return {}
    out = {}
    for k, v in d.items():
        if k.endswith("_token") or k in ("hub_token", "push_to_hub_token"):
            continue  # never ship credentials to a log
        out[k] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
    return out
