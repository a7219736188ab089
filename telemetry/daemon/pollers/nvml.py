"""NvmlPoller: per-GPU state through NVML (pynvml, from the nvidia-ml-py package), in the daemon.

One nvmlInit for the poller's life, device handles cached, nvmlShutdown at close. Where NVML is
absent (no driver, CPU machine) the poller logs that once and turns itself off; nothing fails.
A field the GPU does not support (NVML_ERROR_NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND)
is dropped for that GPU for good after the first try, so unsupported calls cost nothing later.

One record per GPU per poll:
    {"kind": "gpu", "t": <unix s>, "host": str, "gpu": <NVML index>, "values": {...}}
Values (present only where the GPU supports them; GB = 1e9 bytes, MB = 1e6 bytes):
    gpu/util_percent            % of the last sample period a kernel was running
    gpu/mem_util_percent        % of the period device memory was being read or written
    gpu/memory_used_gb          device memory used (all processes; the driver's reserved memory apart,
                                as nvidia-smi shows it, where NVML has nvmlDeviceGetMemoryInfo_v2)
    gpu/memory_total_gb
    gpu/memory_percent          used / total x 100
    gpu/power_w                 board power draw
    gpu/power_limit_w           enforced power limit
    gpu/temperature_c           GPU core temperature
    gpu/sm_clock_mhz            current SM clock
    gpu/mem_clock_mhz           current memory clock
    gpu/throttle_reasons        NVML clocks-event (throttle) reason bitmask
    gpu/throttle_thermal        1 if a SW or HW thermal slowdown is active, else 0
    gpu/throttle_power          1 if the SW power cap or HW power brake is active, else 0
    gpu/throttle_hw_slowdown    1 if HW slowdown (thermal or power-supply) is active, else 0
    gpu/throttle_idle           1 if clocks are low because the GPU is idle, else 0
    gpu/pcie_tx_mb_s            PCIe transmit throughput (NVML ~20 ms window); pollers.nvml_pcie
    gpu/pcie_rx_mb_s            PCIe receive throughput
    gpu/ecc_corrected_errors    volatile (since driver load) corrected ECC errors
    gpu/ecc_uncorrected_errors  volatile uncorrected ECC errors
    gpu/xid_errors              XID critical errors seen since the daemon started
    gpu/last_xid                the most recent XID code (after the first one)
    gpu/num_processes           compute processes on this GPU
    gpu/rank<r>/memory_used_gb  device memory used by training rank r's process (matched by pid)

Per-rank memory needs NVML and psutil to see the same pid namespace: in a container NVML may
report host pids that match no rank, and the per-rank keys are then absent.
"""
from __future__ import annotations

import logging
import socket
import time
from typing import Any, Callable

from protocol.output import GpuRecord
from telemetry.daemon.pollers.base import Poller
from telemetry.daemon.pollers.config import PollersConfig

log = logging.getLogger("telemetry.daemon.pollers")

GB = 1e9

# NVML constants, stable in the C ABI; named here so a fake pynvml in tests needs only functions.
_TEMPERATURE_GPU = 0
_CLOCK_SM = 1
_CLOCK_MEM = 2
_PCIE_TX_BYTES = 0
_PCIE_RX_BYTES = 1
_ECC_CORRECTED = 0
_ECC_UNCORRECTED = 1
_ECC_VOLATILE = 0
_EVENT_XID_CRITICAL = 0x8

_REASON_GPU_IDLE = 0x1
_REASON_SW_POWER_CAP = 0x4
_REASON_HW_SLOWDOWN = 0x8
_REASON_SW_THERMAL = 0x20
_REASON_HW_THERMAL = 0x40
_REASON_HW_POWER_BRAKE = 0x80
THERMAL_MASK = _REASON_SW_THERMAL | _REASON_HW_THERMAL
POWER_MASK = _REASON_SW_POWER_CAP | _REASON_HW_POWER_BRAKE

# Errors that will not go away for this GPU: stop asking.
_ERROR_NOT_SUPPORTED = 3
_ERROR_NO_PERMISSION = 4
_ERROR_FUNCTION_NOT_FOUND = 13
_ERROR_GPU_IS_LOST = 15
_ERROR_ARGUMENT_VERSION_MISMATCH = 25   # a versioned struct (memory v2) this driver does not know
_PERMANENT_ERRORS = frozenset({_ERROR_NOT_SUPPORTED, _ERROR_NO_PERMISSION, _ERROR_FUNCTION_NOT_FOUND,
                               _ERROR_ARGUMENT_VERSION_MISMATCH})
_ERROR_TIMEOUT = 10


class NvmlPoller(Poller):
    """Poll every (or the configured) GPU through NVML; see the module docstring for the fields.

    Args:
        cfg: PollersConfig (nvml_* fields and host).
    """

    name = "nvml"

    def __init__(self, cfg: PollersConfig | None = None) -> None:
        cfg = cfg if cfg is not None else PollersConfig()
        super().__init__(cfg.nvml_interval_s)
        self.cfg = cfg
        self.host = cfg.host or socket.gethostname()
        self.available: bool | None = None  # None: not tried yet
        self.unavailable_reason: str | None = None
        self.gpu_names: dict[int, str] = {}
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._unsupported: set[tuple[int, str]] = set()
        self._event_sets: dict[int, Any] = {}
        self._num_xid: dict[int, int] = {}
        self._last_xid: dict[int, int] = {}
        self._lost: set[int] = set()
        self.num_field_errors = 0

    # ---- lifecycle -----------------------------------------------------------------------------
    def _open(self) -> bool:
        return self._ensure_init()

    def _ensure_init(self) -> bool:
        """nvmlInit once; on failure log once and stay off for the poller's life."""
        if self.available is not None:
            return self.available
        try:
            import pynvml  # lazy: only the daemon imports NVML, and only if GPU polling is on

            pynvml.nvmlInit()
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return self._turn_off(f"{type(e).__name__}: {e}")
        self._nvml = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
            indices = self.cfg.nvml_gpus if self.cfg.nvml_gpus is not None else tuple(range(count))
            missing = [i for i in indices if i >= count]
            if missing:
                log.warning("NVML: GPU indices %s do not exist (%d GPUs); ignoring them", missing, count)
            for i in indices:
                if i < count:
                    self._handles[i] = pynvml.nvmlDeviceGetHandleByIndex(i)
        except Exception as e:
            self._shutdown_quietly()
            return self._turn_off(f"{type(e).__name__}: {e}")
        if not self._handles:
            self._shutdown_quietly()
            return self._turn_off("no GPUs found")
        for i, h in self._handles.items():
            name = self._call(i, "name", pynvml.nvmlDeviceGetName, h)
            self.gpu_names[i] = name.decode() if isinstance(name, bytes) else str(name or "?")
            if self.cfg.nvml_xid:
                self._register_xid(i, h)
        log.info("NVML: polling %d GPU(s) every %.3g s: %s", len(self._handles), self.interval_s,
                 ", ".join(f"{i}: {n}" for i, n in self.gpu_names.items()))
        self.available = True
        return True

    def _turn_off(self, reason: str) -> bool:
        self.available = False
        self.unavailable_reason = reason
        log.info("NVML not available (%s); GPU polling is off", reason)
        return False

    def _register_xid(self, i: int, h: Any) -> None:
        nv = self._nvml
        try:
            es = nv.nvmlEventSetCreate()
        except Exception:
            return
        try:
            nv.nvmlDeviceRegisterEvents(h, _EVENT_XID_CRITICAL, es)
        except Exception:  # not supported on this GPU / no permission: no XID counter for it
            try:
                nv.nvmlEventSetFree(es)
            except Exception:
                pass
            return
        self._event_sets[i] = es
        self._num_xid[i] = 0

    def _release(self) -> None:
        if not self.available:
            return
        for es in self._event_sets.values():
            try:
                self._nvml.nvmlEventSetFree(es)
            except Exception:
                pass
        self._event_sets.clear()
        self._handles.clear()
        self._shutdown_quietly()
        self.available = False
        self.unavailable_reason = "closed"

    def _shutdown_quietly(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass

    # ---- polling -------------------------------------------------------------------------------
    def poll_once(self) -> list[GpuRecord]:
        """One gpu record per polled GPU; [] where NVML is absent."""
        if not self._ensure_init():
            return []
        nv = self._nvml
        t = time.time()
        pid_to_rank = {pid: rank for rank, pid in self._rank_pids_snapshot().items()}
        records = []
        for i, h in self._handles.items():
            values: dict[str, float | int] = {}
            self._poll_core(i, h, values)
            if self.cfg.nvml_pcie:
                tx = self._call(i, "pcie", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_TX_BYTES)
                rx = self._call(i, "pcie", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_RX_BYTES)
                if tx is not None:
                    values["gpu/pcie_tx_mb_s"] = tx / 1e3  # NVML reports KB/s
                if rx is not None:
                    values["gpu/pcie_rx_mb_s"] = rx / 1e3
            if self.cfg.nvml_ecc:
                c = self._call(i, "ecc", nv.nvmlDeviceGetTotalEccErrors, h, _ECC_CORRECTED, _ECC_VOLATILE)
                u = self._call(i, "ecc", nv.nvmlDeviceGetTotalEccErrors, h, _ECC_UNCORRECTED, _ECC_VOLATILE)
                if c is not None:
                    values["gpu/ecc_corrected_errors"] = int(c)
                if u is not None:
                    values["gpu/ecc_uncorrected_errors"] = int(u)
            if i in self._event_sets:
                self._drain_xid(i)
                values["gpu/xid_errors"] = self._num_xid[i]
                if i in self._last_xid:
                    values["gpu/last_xid"] = self._last_xid[i]
            if self.cfg.nvml_process_memory:
                self._poll_processes(i, h, pid_to_rank, values)
            if values:
                records.append(GpuRecord(t, self.host, i, values))
        return records

    def _poll_core(self, i: int, h: Any, values: dict) -> None:
        nv = self._nvml
        util = self._call(i, "util", nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            values["gpu/util_percent"] = util.gpu
            values["gpu/mem_util_percent"] = util.memory
        # v2 where the driver and nvidia-ml-py have it: v1's `used` counts the driver's reserved
        # memory too, so it reads higher than nvidia-smi's figure.
        v2 = getattr(nv, "nvmlMemory_v2", None)
        mem = self._call(i, "memory_v2", nv.nvmlDeviceGetMemoryInfo, h, v2) if v2 is not None else None
        if mem is None and (v2 is None or (i, "memory_v2") in self._unsupported):
            mem = self._call(i, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            values["gpu/memory_used_gb"] = mem.used / GB
            values["gpu/memory_total_gb"] = mem.total / GB
            if mem.total:
                values["gpu/memory_percent"] = 100.0 * mem.used / mem.total
        power_mw = self._call(i, "power", nv.nvmlDeviceGetPowerUsage, h)
        if power_mw is not None:
            values["gpu/power_w"] = power_mw / 1e3
        limit_mw = self._call(i, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
        if limit_mw is not None:
            values["gpu/power_limit_w"] = limit_mw / 1e3
        temp = self._call(i, "temperature", nv.nvmlDeviceGetTemperature, h, _TEMPERATURE_GPU)
        if temp is not None:
            values["gpu/temperature_c"] = temp
        sm = self._call(i, "sm_clock", nv.nvmlDeviceGetClockInfo, h, _CLOCK_SM)
        if sm is not None:
            values["gpu/sm_clock_mhz"] = sm
        memclk = self._call(i, "mem_clock", nv.nvmlDeviceGetClockInfo, h, _CLOCK_MEM)
        if memclk is not None:
            values["gpu/mem_clock_mhz"] = memclk
        reasons = self._call(i, "throttle", self._throttle_fn(), h)
        if reasons is not None:
            reasons = int(reasons)
            values["gpu/throttle_reasons"] = reasons
            values["gpu/throttle_thermal"] = int(bool(reasons & THERMAL_MASK))
            values["gpu/throttle_power"] = int(bool(reasons & POWER_MASK))
            values["gpu/throttle_hw_slowdown"] = int(bool(reasons & _REASON_HW_SLOWDOWN))
            values["gpu/throttle_idle"] = int(bool(reasons & _REASON_GPU_IDLE))

    def _throttle_fn(self) -> Callable:
        # "Clocks event reasons" is the newer name (driver 535+) of the same bitmask.
        nv = self._nvml
        return getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons

    def _poll_processes(self, i: int, h: Any, pid_to_rank: dict[int, int], values: dict) -> None:
        procs = self._call(i, "processes", self._nvml.nvmlDeviceGetComputeRunningProcesses, h)
        if procs is None:
            return
        values["gpu/num_processes"] = len(procs)
        for p in procs:
            rank = pid_to_rank.get(p.pid)
            used = getattr(p, "usedGpuMemory", None)
            # usedGpuMemory is None where the driver cannot attribute memory (MIG, some containers).
            if rank is not None and used is not None:
                values[f"gpu/rank{rank}/memory_used_gb"] = used / GB

    def _drain_xid(self, i: int) -> None:
        nv = self._nvml
        es = self._event_sets[i]
        for _ in range(64):  # bounded: an error storm must not pin the poll thread
            try:
                data = nv.nvmlEventSetWait(es, 0)  # 0 ms: never blocks the poll
            except nv.NVMLError as e:
                if getattr(e, "value", None) != _ERROR_TIMEOUT:
                    self.num_field_errors += 1
                return
            except Exception:
                return
            xid = int(getattr(data, "eventData", 0))
            self._num_xid[i] += 1
            self._last_xid[i] = xid
            log.warning("NVML: GPU %d on %s reported XID %d", i, self.host, xid)

    def _call(self, i: int, field: str, fn: Callable, *args: Any) -> Any:
        """fn(*args), or None if the field is unsupported on GPU i or the call failed."""
        if (i, field) in self._unsupported:
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code in _PERMANENT_ERRORS:
                self._unsupported.add((i, field))
                log.debug("NVML: %s unsupported on GPU %d (%s)", field, i, e)
            elif code == _ERROR_GPU_IS_LOST:
                if i not in self._lost:
                    self._lost.add(i)
                    log.error("NVML: GPU %d on %s has fallen off the bus (GPU_IS_LOST)", i, self.host)
            else:
                self.num_field_errors += 1
                if self.num_field_errors == 1:
                    log.warning("NVML: reading %s of GPU %d failed: %s (further failures are counted)", field, i, e)
            return None

