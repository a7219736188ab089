"""Accelerate -> telemetry sidecar, one line:

    from telemetry.integrations.accelerate import TelemetryTracker
    accelerator = Accelerator(log_with=[TelemetryTracker(project="my-project", name="run-1")])
    accelerator.init_trackers("my-project", config=cfg)
    accelerator.log({"train/loss": loss}, step=step)     # tensors: no host-device sync

A GeneralTracker over the run behind telemetry.wandb (telemetry/integrations/wandb_run.py), so
`accelerator.log(values, step)` has the semantics it has with Accelerate's W&B tracker: W&B's step
and commit rules, nested keys, media refused by name. The daemon's W&B sink opens the run with
the project, name, group and tags given here and the config given to `init_trackers`.

As with Accelerate's W&B tracker, `init_trackers(project_name, config, init_kwargs)` names the
project (unless the tracker was given one), and `init_kwargs["wandb"]` (or ["telemetry"]) gives
wandb.init's arguments (name, group, tags, notes, entity, id, job_type). Accelerate hands a tracker
instance nothing of these: the tracker reads them from the `init_trackers` call that starts it.
`log_images` and `log_table` log a list of `wandb.Image`s and a `wandb.Table`, as Accelerate's W&B
tracker does (the daemon's W&B sink logs the real objects).

The goodput ledger (telemetry/shared/goodput.py): a tracker sees only what the script logs
(Accelerate has no hooks for batches or evaluation, and `accelerator.log` is the script's call),
so the ledger takes a step's time from its records' own times (the time between them), all of
it productive. Data loading and evaluation buckets come from values the script logs with the
step, as the repo's trainer sends them: `perf/data_loading_time` (seconds the step waited for its
batch), `perf/step_time` (the step's own time, without its evaluation) and `perf/eval_time` (the
evaluation after the step), e.g. `accelerator.log({"train/loss": loss, "perf/data_loading_time":
wait_s, "perf/step_time": step_s}, step=step)`; they go through as they are named. A row goes
out when the next step is logged (W&B's rule for `log(step=)`, which Accelerate's tracker uses),
so its record's time is the next step's end: the ledger books each step within the time between
its record and the one before, and the last step's, or an evaluation longer than the step after
it, only in part.

Accelerate calls trackers on the main process only (`Accelerator.log` and `init_trackers` run
there). To send from every process, keep the tracker and call its `log` on each rank: the
tracker starts itself on first use, and the daemon then waits for every rank at each step and
means their values.
"""
from __future__ import annotations

import sys
from typing import Any

from accelerate.tracking import GeneralTracker

from telemetry.integrations.wandb_media import Image, Table
from telemetry.integrations.wandb_run import Run

# What Accelerate's W&B tracker passes on to wandb.init from init_kwargs, that a Run takes.
_INIT_KEYS = ("name", "group", "tags", "entity", "notes", "job_type", "id", "dir", "config")


class TelemetryTracker(GeneralTracker):
    """An Accelerate tracker that sends to the telemetry daemon.

    Args:
        project, name, group, tags, entity: what the daemon's W&B run is opened with.
        endpoint: the daemon's ingest endpoint (None: $TELEMETRY_ENDPOINT or the default).
        client: a TelemetryClient to use instead (its owner closes it).
    """

    name = "telemetry"
    requires_logging_directory = False
    main_process_only = False    # Accelerate's own gate (the Accelerator's) still applies

    def __init__(self, project: str | None = None, name: str | None = None, group: str | None = None,
                 tags: Any = None, entity: str | None = None, endpoint: str | None = None,
                 client: Any = None) -> None:
        super().__init__()
        self._run_args = {"project": project, "name": name, "group": group, "tags": tags, "entity": entity}
        self._endpoint = endpoint
        self._client = client
        self.run: Run | None = None

    def start(self) -> None:
        if self.run is None:
            args = {k: v for k, v in self._run_args.items() if v is not None}
            project, kwargs = _init_trackers_call()
            for k, v in kwargs.items():
                if k in _INIT_KEYS:
                    args.setdefault(k, v)
            if project and "project" not in args:
                args["project"] = project
            self.run = Run(**args, client=self._client, endpoint=self._endpoint, framework="accelerate")

    @property
    def tracker(self) -> Run:
        self.start()
        return self.run

    def store_init_configuration(self, values: dict) -> None:
        self.tracker.config.update(values, allow_val_change=True)

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Values as `wandb.log` takes them (numbers, tensors on any device, nested dicts)."""
        self.tracker.log(values, step=step, **kwargs)

    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Each value a list of images (arrays, tensors, PIL images): logged as W&B images."""
        for k, v in values.items():
            self.log({k: [Image(image) for image in v]}, step=step, **kwargs)

    def log_table(self, table_name: str, columns: list | None = None, data: list | None = None,
                  dataframe: Any = None, step: int | None = None, **kwargs: Any) -> None:
        """A table from columns and rows, or from a pandas DataFrame: logged as a W&B table."""
        if dataframe is not None:
            columns, data = list(dataframe.columns), dataframe.values.tolist()
        self.log({table_name: Table(columns=columns, data=data)}, step=step, **kwargs)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()


def _init_trackers_call() -> tuple[str | None, dict]:
    """(project_name, wandb.init arguments) of the `Accelerator.init_trackers` call that is
    starting this tracker, if that is who calls start(); (None, {}) otherwise."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            break
        if frame.f_code.co_name == "init_trackers" and "project_name" in frame.f_locals:
            kwargs = frame.f_locals.get("init_kwargs") or {}
            mine = kwargs.get("telemetry") or kwargs.get("wandb") or {}
            project = frame.f_locals.get("project_name")
            return (project if isinstance(project, str) else None), (mine if isinstance(mine, dict) else {})
        frame = frame.f_back
    return None, {}
