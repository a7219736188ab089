"""PyTorch Lightning -> telemetry sidecar (optional extra: `pip install .[lightning]`):

    from telemetry.integrations.lightning import TelemetryCallback, TelemetryLogger
    trainer = lightning.Trainer(logger=TelemetryLogger(), callbacks=[TelemetryCallback()], ...)

A Lightning Logger over TelemetryClient: log_metrics(metrics, step) -> client.log, hyperparameters
-> the hello's "config", finalize -> close. What it sends is what Lightning's WandbLogger would
log: the keys as the module logged them ("loss", "val/loss", no prefix added) with
"trainer/global_step", and the W&B run the daemon makes is WandbLogger's (project $WANDB_PROJECT or
"lightning_logs", the logger's name, the hyperparameters as its config, every key against
trainer/global_step). Its `version` increases from run to run, so a second run's checkpoints
never land in the first one's directory: with a `save_dir`, as the CSV and TensorBoard loggers',
the next free `version_N` under save_dir/name (the directory made then); without one (Lightning
then puts checkpoints under the Trainer's default_root_dir, which a logger does not see), the
run's start time and pid ("20261127-051800-4242"), so nothing is made in the working directory. Lightning is imported only when TelemetryLogger
or TelemetryCallback is first used, so importing this module never requires it (accessing them
without it raises ImportError). Lightning calls a logger on every rank (its own loggers make themselves
rank-zero-only); every rank should log for the daemon's per-step aggregation, so this one does.

One record per step, as W&B keeps one history row per step: Lightning calls log_metrics more than
once for a step (at a val_check_interval step, the training values, then the validation values
with the same step). Each call sent as a record of its own was written as a second point of the
step, neither holding everything. So the values of one step are merged (a later call's value of
a name wins) and sent as one record when a different step is logged, or at finalize, which
Lightning calls at the end of every fit/validate/test, after an exception or interrupt too. A
step's record so goes out one logging interval after it was logged (its `t` is when it was sent);
log_metrics never blocks. save(), which Lightning calls after every log_metrics, sends nothing: it
would split the step again.

With TelemetryCallback beside it (a Callback: a logger sees no batches), every optimizer step
also gets what the goodput ledger (telemetry/shared/goodput.py) books, named as the repo's own
trainer sends them (trainer/train.py): perf/data_loading_time, perf/eval_time and perf/step_time
(without the evaluation). Lightning fetches a batch ahead of the one it trains on, on the
training thread, so each step's record is sent when the next step's first batch starts
(on_train_batch_start), and holds the time since the record before: its data loading is the
wait for data then (from the loop's last work for the step, its last on_train_batch_end, its
logging or its validation, to that on_train_batch_start: synchronous data loading; a DataLoader
worker's work that overlapped compute is in no bucket, as it cost the step nothing), its eval
the validation run in it (from the step's last work before it, the validation loop's setup
included, to on_validation_end; the sanity check before training is start-up), its step time
the rest with the wait. The wait for the first batch (the DataLoader's start, the prefetched
first batches) is start-up; the last step's record goes out at the end of training. The logger
then sends a step's values when the callback closes the step (values logged for a later step,
such as an epoch's end, wait for theirs), or at finalize. A checkpoint save is in its step's time
(no hook says when it began).

The rank is the Trainer's: Lightning's DDP launcher sets $LOCAL_RANK and $WORLD_SIZE but not
$RANK, so the client is opened on first use (after the Trainer has set up its strategy) with
the strategy's global rank, which Lightning publishes as `rank_zero_only.rank`, and the hello
carries the strategy's world size. Without that every process reported as rank 0: the daemon
waited for a rank 1 that never came and warned that it "may be hung".
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from telemetry.integrations._client import LazyClient, process_rank

_cls: Any = None
_callback_cls: Any = None
# Steps a timed logger holds at most (their values logged, no callback closing them): the oldest
# goes out beyond it.
MAX_HELD_STEPS = 64


def trainer_rank() -> int | None:
    """The global rank the Lightning Trainer's strategy set (None before it did: $RANK then)."""
    for mod in ("lightning.pytorch.utilities.rank_zero", "pytorch_lightning.utilities.rank_zero",
                "lightning.fabric.utilities.rank_zero"):
        rank_zero_only = getattr(sys.modules.get(mod), "rank_zero_only", None)
        rank = getattr(rank_zero_only, "rank", None)
        if isinstance(rank, int):
            return rank
    return None


def _build() -> Any:
    try:
        from lightning.pytorch.loggers.logger import Logger
    except ImportError:
        from pytorch_lightning.loggers.logger import Logger  # the older package name

    class TelemetryLogger(Logger):
        """Lightning logger that sends to the telemetry daemon.

        Args:
            endpoint: the daemon's ingest endpoint (None = $TELEMETRY_ENDPOINT or the default).
            client: a TelemetryClient to use instead (its owner closes it).
            name: the run name reported in the hello.
        """

        def __init__(self, endpoint: str | None = None, client: Any = None, name: str = "lightning",
                     save_dir: str | None = None, version: int | str | None = None,
                     project: str | None = None) -> None:
            super().__init__()
            self._client = LazyClient(client, endpoint, rank=trainer_rank)
            self._name = name
            self._save_dir = save_dir
            self._version = version
            self._project = project or os.environ.get("WANDB_PROJECT") or "lightning_logs"
            self._config: dict[str, Any] = {}
            self._pending: dict[str, Any] = {}   # the values logged so far for _pending_step
            self._pending_step: int | None = None
            self._said_hello = False
            # With a TelemetryCallback (timed): step -> its values logged so far, sent when the
            # callback closes the step; when log_metrics was last called (time.perf_counter()).
            self._timed = False
            self._callback: Any = None
            self._held: dict[int, dict[str, Any]] = {}
            self._logged_at: float | None = None

        @property
        def client(self) -> Any:
            return self._client.get()

        @property
        def name(self) -> str:
            return self._name

        @property
        def save_dir(self) -> str | None:
            return self._save_dir

        @property
        def root_dir(self) -> str | None:
            return os.path.join(self._save_dir, self._name) if self._save_dir else None

        @property
        def version(self) -> int | str:
            """Decided once: the next free version_N under save_dir/name (its directory made, so
            the next run takes the next number), or without a save_dir the start time and pid."""
            if self._version is None:
                root = self.root_dir
                if root is None:
                    self._version = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
                else:
                    self._version = next_version(root)
                    if (trainer_rank() or 0) == 0:
                        os.makedirs(os.path.join(root, f"version_{self._version}"), exist_ok=True)
            return self._version

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            params = dict(params) if not isinstance(params, dict) else params
            self._config.update({k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
                                 for k, v in params.items()})
            self._hello()

        def _hello(self) -> None:
            """The W&B run as WandbLogger opens it (see the module docstring)."""
            self._said_hello = True
            wandb_info = {"project": self._project, "name": self._name, "metrics": [
                {"name": "trainer/global_step"},
                {"name": "*", "step_metric": "trainer/global_step", "step_sync": True}]}
            self.client.hello({"framework": "lightning", "run_name": self._name, "config": dict(self._config),
                               "wandb": wandb_info, "world_size": process_rank()[1]})

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            # Tensors go as they are: the client reads them off this thread, without a sync. One
            # held for a later send is a copy (an async device op, no sync), so what is sent is
            # its value at this call, as with client.log.
            if not self._said_hello:
                self._hello()
            values = {k: v.detach().clone() if hasattr(v, "detach") else float(v)
                      for k, v in metrics.items()
                      if isinstance(v, (int, float)) or hasattr(v, "detach") or hasattr(v, "__float__")}
            step = int(step or 0)
            values["trainer/global_step"] = step
            if self._timed:
                self._held.setdefault(step, {}).update(values)
                if len(self._held) > MAX_HELD_STEPS:     # steps no callback closes: the oldest goes
                    old = min(self._held)
                    self.client.log(old, self._held.pop(old))
                self._logged_at = time.perf_counter()
                return
            if step != self._pending_step:
                self._flush()
                self._pending_step = step
            self._pending.update(values)

        def close_step(self, step: int, values: dict[str, Any]) -> None:
            """TelemetryCallback's: the step is over; its values, these with them, go out as one
            record (after any earlier step's still held), later steps' wait."""
            for s in sorted(x for x in self._held if x < step):
                self.client.log(s, self._held.pop(s))
            out = self._held.pop(step, {})
            out.update(values)
            out.setdefault("trainer/global_step", step)
            self.client.log(step, out)

        def _flush(self) -> None:
            """Send the pending step's values as one record (nothing if there are none), and
            the held ones, in order."""
            if self._pending_step is not None and self._pending:
                self.client.log(self._pending_step, self._pending)
            self._pending = {}
            self._pending_step = None
            for s in sorted(self._held):
                self.client.log(s, self._held.pop(s))

        def finalize(self, status: str) -> None:
            callback = self._callback
            if callback is not None:
                callback.finish()          # the last step's record, before the held values
            self._flush()
            if self._client.opened:
                self._client.get().event("train_end", {"status": status})
                self._client.close()

    return TelemetryLogger


def _build_callback() -> Any:
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        from pytorch_lightning.callbacks import Callback  # the older package name

    class TelemetryCallback(Callback):
        """Times each optimizer step's data loading, validation and the rest for the goodput
        ledger, and hands them to the Trainer's TelemetryLogger (module docstring). Without a
        TelemetryLogger among the Trainer's loggers it says so once and does nothing."""

        def __init__(self) -> None:
            super().__init__()
            self._logger: Any = None
            self._open: int | None = None        # the step whose record is being timed
            self._since: float | None = None     # when its record's time began (the last one sent)
            self._mark: float | None = None      # when the loop last did the step's own work
            self._data = self._eval = 0.0
            self._eval_from: float | None = None

        def on_train_start(self, trainer: Any, *_: Any) -> None:
            cls = __getattr__("TelemetryLogger")
            self._logger = next((lg for lg in getattr(trainer, "loggers", ()) if isinstance(lg, cls)), None)
            if self._logger is None:
                import warnings

                warnings.warn("TelemetryCallback: no TelemetryLogger among the Trainer's loggers; "
                              "nothing is timed", stacklevel=2)
                return
            self._logger._timed = True
            self._logger._callback = self
            self._open = self._since = self._mark = self._eval_from = None
            self._data = self._eval = 0.0

        def _last_work(self) -> float | None:
            """When the loop last did the step's work: a hook of ours or the logger's log call."""
            logged = self._logger._logged_at
            if self._mark is None:
                return logged
            return self._mark if logged is None else max(self._mark, logged)

        def on_train_batch_start(self, trainer: Any, *_: Any) -> None:
            if self._logger is None:
                return
            now = time.perf_counter()
            last = self._last_work()
            if self._open is not None and last is not None:
                self._data += max(0.0, now - last)      # the wait for this batch
            if self._open is not None and _log_step(trainer) != self._open:
                self._close(now)
            if self._since is None:
                self._since = now

        def on_train_batch_end(self, trainer: Any, *_: Any) -> None:
            if self._logger is None:
                return
            self._open = _log_step(trainer)
            self._mark = time.perf_counter()

        def on_validation_start(self, trainer: Any, *_: Any) -> None:
            if self._logger is not None and self._open is not None and not trainer.sanity_checking:
                self._eval_from = self._last_work() or time.perf_counter()

        def on_validation_end(self, *_: Any) -> None:
            if self._eval_from is not None:
                now = time.perf_counter()
                self._eval += now - self._eval_from
                self._eval_from = None
                self._mark = now

        def _close(self, end: float) -> None:
            """The open step's record, timed from the last one's end to `end`."""
            since = self._since if self._since is not None else end
            values = {"perf/step_time": max(0.0, end - since - self._eval), "perf/data_loading_time": self._data}
            if self._eval:
                values["perf/eval_time"] = self._eval
            self._logger.close_step(self._open, values)
            self._open, self._since = None, end
            self._data = self._eval = 0.0

        def finish(self) -> None:
            """The end of training (the logger's finalize): the last step's record, to the loop's
            last work for it."""
            if self._logger is not None and self._open is not None:
                self._close(self._last_work() or time.perf_counter())

        def on_train_end(self, *_: Any) -> None:
            self.finish()

    return TelemetryCallback


def _log_step(trainer: Any) -> int:
    """The step Lightning's logger connector logs the current batch's values at (its count of
    optimizer steps before the batch's, `_batches_that_stepped`)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    step = getattr(loop, "_batches_that_stepped", None)
    return step if isinstance(step, int) else max(0, int(getattr(trainer, "global_step", 0)) - 1)


def next_version(root: str) -> int:
    """One more than the highest version_N directory under `root` (0 when there is none)."""
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    found = [int(n[len("version_"):]) for n in names
             if n.startswith("version_") and n[len("version_"):].isdigit() and os.path.isdir(os.path.join(root, n))]
    return max(found) + 1 if found else 0


def __getattr__(name: str) -> Any:
    global _cls, _callback_cls
    if name == "TelemetryLogger":
        if _cls is None:
            _cls = _build()
        return _cls
    if name == "TelemetryCallback":
        if _callback_cls is None:
            _callback_cls = _build_callback()
        return _callback_cls
    raise AttributeError(name)
