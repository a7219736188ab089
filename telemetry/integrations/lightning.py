"""PyTorch Lightning -> telemetry sidecar (optional extra: `pip install .[lightning]`):

    from telemetry.integrations.lightning import TelemetryLogger
    trainer = lightning.Trainer(logger=TelemetryLogger(), ...)

A Lightning Logger over TelemetryClient: log_metrics(metrics, step) -> client.log, hyperparameters
-> the hello's "config", finalize -> close. Lightning is imported only when TelemetryLogger is
first used, so importing this module never requires it (accessing TelemetryLogger without it
raises ImportError). Lightning calls loggers on rank 0 only by default; every rank should log
for the daemon's per-step aggregation, so the logger itself is not rank-zero-only.
"""
from __future__ import annotations

from typing import Any

_cls: Any = None


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

        def __init__(self, endpoint: str | None = None, client: Any = None, name: str = "lightning") -> None:
            super().__init__()
            self._endpoint = endpoint
            self._client = client
            self._own_client = client is None
            self._name = name

        @property
        def client(self) -> Any:
            if self._client is None:
                from telemetry.client import TelemetryClient

                self._client = TelemetryClient(self._endpoint)
            return self._client

        @property
        def name(self) -> str:
            return self._name

        @property
        def version(self) -> str:
            return "0"

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            params = dict(params) if not isinstance(params, dict) else params
            config = {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v) for k, v in params.items()}
            self.client.hello({"framework": "lightning", "run_name": self._name, "config": config})

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            values = {k if "/" in k else f"train/{k}": float(v) for k, v in metrics.items()
                      if isinstance(v, (int, float)) or hasattr(v, "__float__")}
            self.client.log(int(step or 0), values)

        def finalize(self, status: str) -> None:
            if self._client is not None:
                self._client.event("train_end", {"status": status})
                if self._own_client:
                    self._client.close()
                    self._client = None

    return TelemetryLogger


def __getattr__(name: str) -> Any:
    global _cls
    if name == "TelemetryLogger":
        if _cls is None:
            _cls = _build()
        return _cls
    raise AttributeError(name)
