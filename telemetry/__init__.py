"""Asynchronous telemetry sidecar for LLM training.

    from telemetry import TelemetryClient
    tm = TelemetryClient()
    tm.log(step, {"train/loss": loss})   # never blocks, never syncs
"""
from __future__ import annotations

import atexit

from telemetry.shared.signals import keep_sigint_exit

__version__ = "0.1.0"      # the source tree's; `telemetry --version` prefers the installed one
# The distribution's name (pyproject.toml's [project] name): what `pip install` and its extras take.
DIST_NAME = "llm-telemetry-sidecar"
__all__ = ["TelemetryClient", "DisabledClient"]

# First of telemetry's exit hooks, so the last to run: what the others import cannot turn a
# Ctrl-C'd script's exit into 1.
atexit.register(keep_sigint_exit)


def __getattr__(name: str):
    # Lazy, so `python -m telemetry status` and the daemon don't import the client's deps twice.
    if name in ("TelemetryClient", "DisabledClient"):
        from telemetry import client

        return getattr(client, name)
    raise AttributeError(name)
