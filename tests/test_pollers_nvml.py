"""NvmlPoller against a fake pynvml (logic) and against this machine's missing NVML (absence path)."""
from __future__ import annotations

import logging
import os
import sys
import threading
import time

import pytest

from telemetry.daemon.pollers import PollersConfig, make_pollers
from testkit.fake_nvml import GPU_IS_LOST, UNKNOWN, make_fake_pynvml
from telemetry.daemon.pollers.nvml import NvmlPoller


@pytest.fixture
def fake(monkeypatch):
    mod = make_fake_pynvml(num_gpus=2)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def _by_gpu(records):
    return {r["gpu"]: r for r in records}


def test_records_carry_every_field_with_units(fake):
    fake.gpus[1].processes = [(4242, 3 * 10**9), (999_999, 10**9)]
    p = NvmlPoller(PollersConfig(host="nodeA"))
    p.set_rank_pids({0: 1111, 5: 4242})
    recs = _by_gpu(p.poll_once())
    assert sorted(recs) == [0, 1]
    r = recs[1]
    assert r["kind"] == "gpu" and r["host"] == "nodeA" and isinstance(r["t"], float)
    v = r["values"]
    assert v["gpu/util_percent"] == 97 and v["gpu/mem_util_percent"] == 40
    assert v["gpu/memory_used_gb"] == pytest.approx(60.0) and v["gpu/memory_total_gb"] == pytest.approx(80.0)
    assert v["gpu/memory_percent"] == pytest.approx(75.0)
    assert v["gpu/power_w"] == pytest.approx(650.0) and v["gpu/power_limit_w"] == pytest.approx(700.0)
    assert v["gpu/temperature_c"] == 71
    assert v["gpu/sm_clock_mhz"] == 1980 and v["gpu/mem_clock_mhz"] == 2619
    assert v["gpu/throttle_reasons"] == 0 and v["gpu/throttle_thermal"] == 0 and v["gpu/throttle_power"] == 0
    assert v["gpu/pcie_tx_mb_s"] == pytest.approx(1500.0) and v["gpu/pcie_rx_mb_s"] == pytest.approx(2500.0)
    assert v["gpu/ecc_corrected_errors"] == 0 and v["gpu/ecc_uncorrected_errors"] == 0
    assert v["gpu/xid_errors"] == 0 and "gpu/last_xid" not in v
    assert v["gpu/num_processes"] == 2
    # pid 4242 is rank 5; the unknown pid is counted but not named
    assert v["gpu/rank5/memory_used_gb"] == pytest.approx(3.0)
    assert [k for k in v if k.startswith("gpu/rank")] == ["gpu/rank5/memory_used_gb"]
    assert not any(k.startswith("gpu/rank") for k in recs[0]["values"])
    p.close()


def test_one_init_cached_handles_and_shutdown_at_close(fake):
    p = NvmlPoller()
    for _ in range(5):
        p.poll_once()
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2
    assert fake.initialised == 1
    p.close()
    p.close()  # idempotent
    assert fake.calls["nvmlShutdown"] == 1 and fake.initialised == 0
    assert fake.calls["nvmlEventSetFree"] == 2


def test_throttle_flags_decode_the_bitmask(fake):
    fake.gpus[0].throttle_reasons = 0x40 | 0x4  # HW thermal + SW power cap
    fake.gpus[1].throttle_reasons = 0x1  # idle
    recs = _by_gpu(NvmlPoller().poll_once())
    v0, v1 = recs[0]["values"], recs[1]["values"]
    assert (v0["gpu/throttle_thermal"], v0["gpu/throttle_power"], v0["gpu/throttle_idle"]) == (1, 1, 0)
    assert v0["gpu/throttle_reasons"] == 0x44
    assert (v1["gpu/throttle_thermal"], v1["gpu/throttle_power"], v1["gpu/throttle_idle"]) == (0, 0, 1)


def test_unsupported_field_is_dropped_and_never_asked_again(fake):
    fake.gpus[0].unsupported = {"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPcieThroughput"}
    p = NvmlPoller()
    for _ in range(3):
        recs = _by_gpu(p.poll_once())
    assert "gpu/ecc_uncorrected_errors" not in recs[0]["values"]
    assert "gpu/pcie_tx_mb_s" not in recs[0]["values"]
    assert "gpu/ecc_uncorrected_errors" in recs[1]["values"]  # GPU 1 supports it
    # GPU 0 asked once (then remembered), GPU 1 twice per poll (corrected + uncorrected)
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 1 + 3 * 2
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 1 + 3 * 2


def test_memory_used_leaves_out_the_drivers_reserved_memory_as_nvidia_smi_does(monkeypatch):
    """NVML's v1 memory info counts the driver's reserved memory as used (an H200, driver 580:
    0.65 GB over nvidia-smi); v2 reports it apart. v2 where nvidia-ml-py and the driver have it,
    v1 where not (older nvidia-ml-py, FUNCTION_NOT_FOUND), never both in one poll."""
    new, old = make_fake_pynvml(num_gpus=3), make_fake_pynvml(num_gpus=1, memory_v2=False)
    for g in new.gpus + old.gpus:
        g.memory_used_bytes, g.memory_reserved_bytes = 10**9, 650 * 10**6
    new.gpus[1].unsupported = {"nvmlDeviceGetMemoryInfo_v2"}   # a driver without the v2 call
    new.gpus[2].failing = {"nvmlDeviceGetMemoryInfo_v2": 25}  # one that refuses the v2 struct
    monkeypatch.setitem(sys.modules, "pynvml", new)
    p = NvmlPoller()
    for _ in range(2):
        recs = _by_gpu(p.poll_once())
    assert recs[0]["values"]["gpu/memory_used_gb"] == pytest.approx(1.0)     # nvidia-smi's figure
    assert recs[0]["values"]["gpu/memory_percent"] == pytest.approx(100 * 1.0 / 80)
    for i in (1, 2):
        assert recs[i]["values"]["gpu/memory_used_gb"] == pytest.approx(1.65)  # v1: all NVML has
    assert new.calls["nvmlDeviceGetMemoryInfo_v2"] == 2 + 1 + 1              # GPUs 1 and 2 asked once
    assert new.calls["nvmlDeviceGetMemoryInfo"] == 2 + 2                     # their fallbacks only
    assert p.num_field_errors == 0
    p.close()
    monkeypatch.setitem(sys.modules, "pynvml", old)
    p = NvmlPoller()
    assert _by_gpu(p.poll_once())[0]["values"]["gpu/memory_used_gb"] == pytest.approx(1.65)
    p.close()


def test_transient_error_skips_the_field_for_one_poll_only(fake):
    fake.gpus[0].failing = {"nvmlDeviceGetPowerUsage": UNKNOWN}
    p = NvmlPoller()
    assert "gpu/power_w" not in _by_gpu(p.poll_once())[0]["values"]
    fake.gpus[0].failing = {}
    assert _by_gpu(p.poll_once())[0]["values"]["gpu/power_w"] == pytest.approx(650.0)
    assert p.num_field_errors == 1


def test_lost_gpu_is_logged_once_and_does_not_break_the_others(fake, caplog):
    fake.gpus[1].failing = {n: GPU_IS_LOST for n in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo")}
    p = NvmlPoller()
    with caplog.at_level(logging.ERROR, logger="telemetry.daemon.pollers"):
        for _ in range(3):
            recs = _by_gpu(p.poll_once())
    assert recs[0]["values"]["gpu/util_percent"] == 97
    assert "gpu/util_percent" not in recs[1]["values"]
    assert sum("fallen off the bus" in r.message for r in caplog.records) == 1


def test_xid_events_are_counted_per_gpu(fake):
    p = NvmlPoller()
    p.poll_once()
    fake.gpus[1].xids += [79, 48]
    recs = _by_gpu(p.poll_once())
    assert recs[1]["values"]["gpu/xid_errors"] == 2 and recs[1]["values"]["gpu/last_xid"] == 48
    assert recs[0]["values"]["gpu/xid_errors"] == 0
    assert _by_gpu(p.poll_once())[1]["values"]["gpu/xid_errors"] == 2  # cumulative, not re-counted


def test_selected_gpus_and_disabled_optional_fields(fake):
    cfg = PollersConfig(nvml_gpus=[1, 7], nvml_pcie=False, nvml_ecc=False, nvml_xid=False,
                        nvml_process_memory=False)
    recs = NvmlPoller(cfg).poll_once()
    assert [r["gpu"] for r in recs] == [1]  # 7 does not exist: warned and ignored
    v = recs[0]["values"]
    assert not any(k.startswith(("gpu/pcie", "gpu/ecc", "gpu/xid", "gpu/num_processes")) for k in v)
    assert "nvmlDeviceGetPcieThroughput" not in fake.calls


def test_thread_emits_records_until_closed(fake):
    got, lock, two = [], threading.Lock(), threading.Event()

    def emit(rec):
        with lock:
            got.append(rec)
            if len(got) >= 4:
                two.set()

    p = NvmlPoller(PollersConfig(nvml_interval_s=0.1))
    p.start(emit)
    assert p.running
    assert two.wait(10), "the poll thread emitted nothing"
    p.close()
    assert not p.running and fake.initialised == 0
    n = len(got)
    assert {r["gpu"] for r in got} == {0, 1}
    assert p.stats()["num_polls"] >= 2
    time.sleep(0.3)  # three intervals: a thread that outlived close() would have emitted by now
    assert len(got) == n


def test_fake_library_missing_turns_off_once(monkeypatch, caplog):
    fake = make_fake_pynvml(library_missing=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    p = NvmlPoller()
    with caplog.at_level(logging.INFO, logger="telemetry.daemon.pollers"):
        p.start(lambda r: None)
        assert p.poll_once() == [] and p.poll_once() == []
    assert not p.running and p.available is False
    assert fake.calls["nvmlInit"] == 1
    assert sum("NVML not available" in r.message for r in caplog.records) == 1
    p.close()
    assert "nvmlShutdown" not in fake.calls


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="this machine has an NVIDIA driver")
def test_real_pynvml_absent_on_this_machine_is_quiet(caplog):
    """The real nvidia-ml-py, no driver: one log line, no thread, no records, close is clean."""
    sys.modules.pop("pynvml", None)
    pollers = make_pollers(PollersConfig(host_enabled=False))
    assert [type(p).__name__ for p in pollers] == ["NvmlPoller"]
    p = pollers[0]
    with caplog.at_level(logging.INFO, logger="telemetry.daemon.pollers"):
        p.start(lambda r: pytest.fail("no records expected"))
        assert p.poll_once() == []
    assert not p.running
    msgs = [r.message for r in caplog.records if "NVML not available" in r.message]
    assert len(msgs) == 1 and ("NotFound" in msgs[0] or "No module" in msgs[0] or "Driver" in msgs[0])
    p.close()
    p.close()
