"""A stand-in pynvml module for tests and the pollers' cost benchmark (never used in production).

    fake = make_fake_pynvml(num_gpus=8)
    monkeypatch.setitem(sys.modules, "pynvml", fake)   # NvmlPoller imports it lazily
    fake.gpus[0].util_percent = 12                     # steer what the poller reads
    fake.gpus[0].xids.append(79)                       # queue an XID event

It implements only the NVML calls NvmlPoller makes, with the real module's error shape:
NVMLError(value) with per-code subclasses, NOT_SUPPORTED = 3, TIMEOUT = 10, LIBRARY_NOT_FOUND = 12.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

NOT_SUPPORTED = 3
NO_PERMISSION = 4
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
GPU_IS_LOST = 15
UNKNOWN = 999


class NVMLError(Exception):
    """Same shape as pynvml.NVMLError: the NVML return code in .value."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {NOT_SUPPORTED: "Not Supported", TIMEOUT: "Timeout", LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
                GPU_IS_LOST: "GPU is lost", NO_PERMISSION: "Insufficient Permissions"}.get(self.value, "Unknown Error")


class NVMLError_NotSupported(NVMLError):
    def __init__(self, value: int = NOT_SUPPORTED) -> None:
        super().__init__(value)


class NVMLError_Timeout(NVMLError):
    def __init__(self, value: int = TIMEOUT) -> None:
        super().__init__(value)


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self, value: int = LIBRARY_NOT_FOUND) -> None:
        super().__init__(value)


@dataclass
class FakeGpu:
    """One fake GPU's state; tests change the fields between polls."""

    name: str = "NVIDIA H100 80GB HBM3"
    util_percent: int = 97
    mem_util_percent: int = 40
    memory_used_bytes: int = 60 * 10**9       # by processes: what nvidia-smi shows (NVML's v2 `used`)
    memory_reserved_bytes: int = 600 * 2**20  # the driver's own; NVML's v1 `used` counts it too
    memory_total_bytes: int = 80 * 10**9
    power_mw: int = 650_000
    power_limit_mw: int = 700_000
    temperature_c: int = 71
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    throttle_reasons: int = 0
    pcie_tx_kb_s: int = 1_500_000
    pcie_rx_kb_s: int = 2_500_000
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    xids: list[int] = field(default_factory=list)  # queued XID events, oldest first
    unsupported: set[str] = field(default_factory=set)  # function names that raise NOT_SUPPORTED
    failing: dict[str, int] = field(default_factory=dict)  # function name -> error code raised


NVML_MEMORY_V2 = 0x2000028  # pynvml.nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24


def make_fake_pynvml(num_gpus: int = 8, *, library_missing: bool = False, memory_v2: bool = True) -> types.ModuleType:
    """A module object with pynvml's names; `.gpus` holds the FakeGpu states, `.calls` counts calls.
    memory_v2=False: an nvidia-ml-py without nvmlMemory_v2 (before 11.5xx)."""
    m = types.ModuleType("pynvml")
    if memory_v2:
        m.nvmlMemory_v2 = NVML_MEMORY_V2
    m.NVMLError = NVMLError
    m.NVMLError_NotSupported = NVMLError_NotSupported
    m.NVMLError_Timeout = NVMLError_Timeout
    m.NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    m.gpus = [FakeGpu() for _ in range(num_gpus)]
    m.calls = {}
    m.initialised = 0  # nvmlInit minus nvmlShutdown

    def count(name: str) -> None:
        m.calls[name] = m.calls.get(name, 0) + 1

    def gpu_call(name: str, handle: Any) -> FakeGpu:
        count(name)
        if m.initialised <= 0:
            raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED
        g = m.gpus[handle]
        if name in g.unsupported:
            raise NVMLError_NotSupported()
        if name in g.failing:
            raise NVMLError(g.failing[name])
        return g

    def nvmlInit() -> None:
        count("nvmlInit")
        if library_missing:
            raise NVMLError_LibraryNotFound()
        m.initialised += 1

    def nvmlShutdown() -> None:
        count("nvmlShutdown")
        m.initialised -= 1

    def nvmlDeviceGetCount() -> int:
        count("nvmlDeviceGetCount")
        return len(m.gpus)

    def nvmlDeviceGetHandleByIndex(i: int) -> int:
        count("nvmlDeviceGetHandleByIndex")
        if not 0 <= i < len(m.gpus):
            raise NVMLError(2)  # INVALID_ARGUMENT
        return i

    def nvmlDeviceGetName(h: int) -> str:
        return gpu_call("nvmlDeviceGetName", h).name

    def nvmlDeviceGetUtilizationRates(h: int) -> Any:
        g = gpu_call("nvmlDeviceGetUtilizationRates", h)
        return types.SimpleNamespace(gpu=g.util_percent, memory=g.mem_util_percent)

    def nvmlDeviceGetMemoryInfo(h: int, version: int | None = None) -> Any:
        # As the driver answers: v1 (no version) counts the driver's reserved memory as used;
        # v2 (nvmlDeviceGetMemoryInfo_v2) reports it apart, `used` being what processes hold.
        if version is None:
            g = gpu_call("nvmlDeviceGetMemoryInfo", h)
            used = g.memory_used_bytes + g.memory_reserved_bytes
            return types.SimpleNamespace(used=used, total=g.memory_total_bytes, free=g.memory_total_bytes - used)
        assert version == NVML_MEMORY_V2, version
        g = gpu_call("nvmlDeviceGetMemoryInfo_v2", h)
        return types.SimpleNamespace(used=g.memory_used_bytes, reserved=g.memory_reserved_bytes,
                                     total=g.memory_total_bytes,
                                     free=g.memory_total_bytes - g.memory_used_bytes - g.memory_reserved_bytes)

    def nvmlDeviceGetPowerUsage(h: int) -> int:
        return gpu_call("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(h: int) -> int:
        return gpu_call("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    def nvmlDeviceGetTemperature(h: int, sensor: int) -> int:
        return gpu_call("nvmlDeviceGetTemperature", h).temperature_c

    def nvmlDeviceGetClockInfo(h: int, clock_type: int) -> int:
        g = gpu_call("nvmlDeviceGetClockInfo", h)
        return g.sm_clock_mhz if clock_type == 1 else g.mem_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(h: int) -> int:
        return gpu_call("nvmlDeviceGetCurrentClocksEventReasons", h).throttle_reasons

    def nvmlDeviceGetPcieThroughput(h: int, counter: int) -> int:
        g = gpu_call("nvmlDeviceGetPcieThroughput", h)
        return g.pcie_tx_kb_s if counter == 0 else g.pcie_rx_kb_s

    def nvmlDeviceGetTotalEccErrors(h: int, error_type: int, counter_type: int) -> int:
        g = gpu_call("nvmlDeviceGetTotalEccErrors", h)
        return g.ecc_corrected if error_type == 0 else g.ecc_uncorrected

    def nvmlDeviceGetComputeRunningProcesses(h: int) -> list:
        g = gpu_call("nvmlDeviceGetComputeRunningProcesses", h)
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in g.processes]

    def nvmlEventSetCreate() -> dict:
        count("nvmlEventSetCreate")
        return {"gpus": []}

    def nvmlDeviceRegisterEvents(h: int, event_types: int, event_set: dict) -> None:
        gpu_call("nvmlDeviceRegisterEvents", h)
        event_set["gpus"].append(h)

    def nvmlEventSetWait(event_set: dict, timeout_ms: int) -> Any:
        count("nvmlEventSetWait")
        for h in event_set["gpus"]:
            if m.gpus[h].xids:
                return types.SimpleNamespace(device=h, eventType=0x8, eventData=m.gpus[h].xids.pop(0))
        raise NVMLError_Timeout()

    def nvmlEventSetFree(event_set: dict) -> None:
        count("nvmlEventSetFree")

    for fn in (nvmlInit, nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetName,
               nvmlDeviceGetUtilizationRates, nvmlDeviceGetMemoryInfo, nvmlDeviceGetPowerUsage,
               nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetTemperature, nvmlDeviceGetClockInfo,
               nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetPcieThroughput,
               nvmlDeviceGetTotalEccErrors, nvmlDeviceGetComputeRunningProcesses, nvmlEventSetCreate,
               nvmlDeviceRegisterEvents, nvmlEventSetWait, nvmlEventSetFree):
        setattr(m, fn.__name__, fn)
    return m
