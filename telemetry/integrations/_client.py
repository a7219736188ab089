"""The one TelemetryClient an integration uses, made on first use and closed only if it made it.

Every integration (the HF callback, the Lightning logger, the Accelerate tracker, the
wandb-compatible module) needs the same thing: a client given by the caller, or one of its own
opened lazily, once the rank is known (Lightning knows its rank only after the Trainer has set
up its strategy, long after the logger was built), and closed at the end if it is its own.
"""
from __future__ import annotations

import sys
from typing import Any, Callable


class LazyClient:
    """Holds a TelemetryClient: the caller's, or one opened on first `get()`.

    Args:
        client: a TelemetryClient to use (its owner closes it); None: open one on first use.
        endpoint: the daemon's ingest endpoint for an own client (None: $TELEMETRY_ENDPOINT or
            the default).
        rank: the global rank for an own client, or a function returning it, called when the
            client is opened (None: the client reads $RANK).
        send_hello: whether an own client sends its automatic hello when opened.
    """

    def __init__(self, client: Any = None, endpoint: str | None = None,
                 rank: int | Callable[[], int | None] | None = None, send_hello: bool = True) -> None:
        self._client = client
        self.owned = client is None
        self.endpoint = endpoint
        self._rank = rank
        self._send_hello = send_hello

    @property
    def opened(self) -> bool:
        return self._client is not None

    def get(self) -> Any:
        if self._client is None:
            from telemetry.client import TelemetryClient

            rank = self._rank() if callable(self._rank) else self._rank
            endpoint = self.endpoint
            if endpoint is None:
                # No daemon for this job: start one (telemetry/client/autostart.py), never silence,
                # in the job's own directory (two jobs of one user never share one), and send there.
                from telemetry.client import autostart
                from telemetry.shared import endpoints

                autostart.ensure_daemon("telemetry")
                job = endpoints.job_runtime_dir(default_on=True)
                if job is not None:
                    endpoint = f"ipc://{job}/ingest.sock"
            self._client = TelemetryClient(endpoint, rank=rank, send_hello=self._send_hello)
        return self._client

    def close(self) -> None:
        """Close an own client (bounded time; safe twice); a caller's client is left open."""
        if self._client is not None and self.owned:
            self._client.close()
            self._client = None


def process_rank() -> tuple[int, int]:
    """(global rank, world size) of this process: torch.distributed's once it is initialized
    (launchers that set no $RANK: Lightning's, mp.spawn), else the launcher's environment
    ($RANK/$WORLD_SIZE and the mpirun/srun equivalents). Never imports torch."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    from telemetry.client.core import _RANK_ENV, _WORLD_SIZE_ENV, _env_int

    return _env_int(_RANK_ENV, 0), _env_int(_WORLD_SIZE_ENV, 1)
