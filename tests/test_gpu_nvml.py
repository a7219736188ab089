"""NvmlPoller against a real GPU and the real NVML (skipped without CUDA)."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda", 0)


def test_real_values_on_a_real_gpu(cuda):
    from telemetry.daemon.pollers import PollersConfig
    from telemetry.daemon.pollers.nvml import NvmlPoller

    block = torch.empty(512 * 2**20, dtype=torch.uint8, device=cuda)  # 512 MiB held by this process
    a = torch.randn(4096, 4096, device=cuda)
    for _ in range(50):  # keep the GPU busy so utilization and clocks are non-trivial
        a = a @ a
        a = a / a.norm()
    torch.cuda.synchronize()  # CPU-GPU sync point: test only

    p = NvmlPoller(PollersConfig(host="gpu-test"))
    p.set_rank_pids({0: os.getpid()})
    try:
        records = p.poll_once()
        records = p.poll_once()  # the second poll: XID drain and counters already primed
        assert p.available is True, p.unavailable_reason
        assert len(records) >= torch.cuda.device_count()  # NVML sees every GPU of the node
        v = records[0]["values"]
        assert 0 <= v["gpu/util_percent"] <= 100
        assert 0 < v["gpu/memory_used_gb"] <= v["gpu/memory_total_gb"]
        assert v["gpu/memory_total_gb"] > 1.0
        assert 0 < v["gpu/power_w"] and v["gpu/power_limit_w"] > 0
        assert 0 < v["gpu/temperature_c"] < 120
        assert v["gpu/sm_clock_mhz"] > 0 and v["gpu/mem_clock_mhz"] > 0
        assert v["gpu/throttle_reasons"] >= 0 and v["gpu/throttle_thermal"] in (0, 1)
        if "gpu/pcie_tx_mb_s" in v:
            assert v["gpu/pcie_tx_mb_s"] >= 0 and v["gpu/pcie_rx_mb_s"] >= 0
        nv_pids = {pp.pid for pp in p._nvml.nvmlDeviceGetComputeRunningProcesses(p._handles[0])}
        if os.getpid() in nv_pids:
            assert v["gpu/rank0/memory_used_gb"] >= 0.5  # at least the 512 MiB block
        else:
            # In a container NVML reports host pids: per-rank memory cannot be matched (documented).
            assert "gpu/rank0/memory_used_gb" not in v
        del block
    finally:
        p.close()
    assert p.available is False
