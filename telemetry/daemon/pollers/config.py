"""PollersConfig: what the daemon polls and how often (the `pollers:` key of the daemon config).

    pollers:
      nvml_interval_s: 1.0     # GPU poll period
      host_interval_s: 1.0     # host poll period
      nvml_pcie: false         # PCIe counters cost ~20 ms of driver time per GPU per poll
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# Faster than this the pollers' own CPU cost stops being negligible and NVML's utilization
# counters (sampled by the driver every ~1/6 s to 1 s) carry no new information anyway.
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 3600.0


@dataclass(kw_only=True, slots=True)
class PollersConfig:
    """Poller settings, loaded with the daemon config (telemetry.daemon.config), which checks
    every value's type and names a bad key; here only what the values may be.

    Attributes:
        nvml_enabled: poll GPUs through NVML (turns itself off where NVML is absent).
        nvml_interval_s: seconds between GPU polls.
        nvml_gpus: NVML indices to poll; None = every GPU on the node. NVML indices are the
            driver's order, not CUDA_VISIBLE_DEVICES order.
        nvml_pcie: read PCIe TX/RX throughput. NVML measures it over a ~20 ms window per call,
            so it costs 2 x 20 ms of poll-thread wall time per GPU per poll.
        nvml_ecc: read volatile ECC error counts (where the GPU has ECC).
        nvml_xid: watch for XID (critical driver/hardware) errors through an NVML event set.
        nvml_process_memory: per-rank GPU memory from the GPU's process list, matched by pid.
        host_enabled: poll the host through psutil.
        host_interval_s: seconds between host polls.
        host_per_core: emit system/cpu_percent_core<i> (one key per core).
        host_per_rank: emit system/rank<r>/* for each training rank's process.
        host: host name written into records; None = socket.gethostname().
    """

    nvml_enabled: bool = True
    nvml_interval_s: float = 1.0
    nvml_gpus: tuple[int, ...] | None = None
    nvml_pcie: bool = True
    nvml_ecc: bool = True
    nvml_xid: bool = True
    nvml_process_memory: bool = True
    host_enabled: bool = True
    host_interval_s: float = 1.0
    host_per_core: bool = True
    host_per_rank: bool = True
    host: str | None = None

    def __post_init__(self) -> None:
        for name in ("nvml_interval_s", "host_interval_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and MIN_INTERVAL_S <= v <= MAX_INTERVAL_S):
                raise ValueError(f"pollers.{name} must be a number of seconds in "
                                 f"[{MIN_INTERVAL_S}, {MAX_INTERVAL_S}], got {v!r}")
        if self.nvml_gpus is not None and (not self.nvml_gpus or min(self.nvml_gpus) < 0):
            raise ValueError(f"pollers.nvml_gpus must be a non-empty list of indices >= 0 or null, "
                             f"got {list(self.nvml_gpus)!r}")
        if self.host is not None and not self.host.strip():
            raise ValueError(f"pollers.host must be a non-empty string or null, got {self.host!r}")
