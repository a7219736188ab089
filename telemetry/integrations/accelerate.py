"""Accelerate -> telemetry sidecar, one line:

    from telemetry.integrations.accelerate import TelemetryTracker
    accelerator = Accelerator(log_with=[TelemetryTracker(project="my-project", name="run-1")])
    accelerator.init_trackers("my-project", config=cfg)
    accelerator.log({"train/loss": loss}, step=step)     # tensors: no host-device sync

A GeneralTracker over the run behind telemetry.wandb (telemetry/integrations/wandb_run.py), so
`accelerator.log(values, step)` has the semantics it has with Accelerate's W&B tracker: W&B's step
and commit rules, nested keys, media refused by name. The daemon's W&B sink opens the run with
the project, name, group and tags given here and the config given to `init_trackers`.

Accelerate calls trackers on the main process only (`Accelerator.log` and `init_trackers` run
there). To send from every process, keep the tracker and call its `log` on each rank: the
tracker starts itself on first use, and the daemon then waits for every rank at each step and
means their values.
"""
from __future__ import annotations

from typing import Any

from accelerate.tracking import GeneralTracker

from telemetry.integrations.wandb_run import Run


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
            self.run = Run(**self._run_args, client=self._client, endpoint=self._endpoint, framework="accelerate")

    @property
    def tracker(self) -> Run:
        self.start()
        return self.run

    def store_init_configuration(self, values: dict) -> None:
        self.tracker.config.update(values, allow_val_change=True)

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Values as `wandb.log` takes them (numbers, tensors on any device, nested dicts)."""
        self.tracker.log(values, step=step, **kwargs)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
