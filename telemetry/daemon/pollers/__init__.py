"""Pollers that run in the daemon (never in the trainer): GPUs through NVML, the host through psutil.

    from telemetry.daemon.pollers import PollersConfig, make_pollers
    pollers = make_pollers(PollersConfig(nvml_interval_s=2.0))   # the daemon: its config's `pollers:`
    for p in pollers:
        p.start(emit)            # emit(record_dict), thread-safe, provided by the daemon
    ...
    p.set_rank_pids({rank: pid})  # from the hello records of this host's ranks
    p.close()

Record fields: telemetry/daemon/pollers/nvml.py (kind "gpu") and telemetry/daemon/pollers/host.py (kind "system").
"""
from __future__ import annotations

from telemetry.daemon.pollers.base import Poller
from telemetry.daemon.pollers.config import PollersConfig

__all__ = ["Poller", "PollersConfig", "make_pollers"]


def make_pollers(cfg: PollersConfig | None = None) -> list[Poller]:
    """The enabled pollers, built but not started (NVML is only initialised by start/poll_once)."""
    cfg = cfg if cfg is not None else PollersConfig()
    pollers: list[Poller] = []
    if cfg.nvml_enabled:
        from telemetry.daemon.pollers.nvml import NvmlPoller

        pollers.append(NvmlPoller(cfg))
    if cfg.host_enabled:
        from telemetry.daemon.pollers.host import HostPoller

        pollers.append(HostPoller(cfg))
    return pollers
