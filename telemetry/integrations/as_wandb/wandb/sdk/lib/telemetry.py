"""`wandb.sdk.lib.telemetry` under the drop-in: W&B's record of which features a run used
(`with telemetry.context(run=run) as tel: tel.feature.x = True`, as W&B's integrations write
it). The drop-in keeps nothing of it: the daemon's W&B run records its own."""
from __future__ import annotations

import contextlib
from typing import Any


class _Anything:
    """Takes any attribute set or read (a feature flag, a nested message)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Anything()
        object.__setattr__(self, name, value)
        return value


@contextlib.contextmanager
def context(run: Any = None, obj: Any = None):
    yield _Anything()
