"""Peak FLOP/s lookup by NVML device name, name traps included."""
from __future__ import annotations

import logging

import pytest

from telemetry.daemon import peaks
from telemetry.daemon.mfu import peak_flops

T = 1e12


@pytest.mark.parametrize("name,dtype,tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),          # SXM, no "SXM" in the NVML name
    ("NVIDIA H100 80GB HBM3", "tf32", 494.7),
    ("NVIDIA H100 80GB HBM3", "fp32", 67),
    ("NVIDIA H100 PCIe", "bf16", 756.5),
    ("NVIDIA H100 NVL", "fp16", 835.5),
    ("NVIDIA H200", "bf16", 989.4),
    ("NVIDIA H200 NVL", "bf16", 835.5),
    ("NVIDIA GH200 480GB", "bf16", 989.4),             # contains "H200"
    ("NVIDIA GH200 144G HBM3e", "fp32", 67),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312),
    ("NVIDIA A100-SXM4-40GB", "tf32", 156),
    ("NVIDIA A100-PCIE-40GB", "bf16", 312),
    ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
    ("NVIDIA A10G", "bf16", 70),                      # starts with "A10"
    ("NVIDIA A10", "bf16", 125),
    ("NVIDIA L4", "bf16", 121),
    ("NVIDIA L40S", "bf16", 362.05),                  # starts with "L4"
    ("NVIDIA L40", "bf16", 181.05),
    ("Tesla V100-SXM2-32GB", "fp16", 125),
    ("Tesla V100-PCIE-16GB", "fp16", 112),
    ("Tesla V100S-PCIE-32GB", "fp16", 130),
    ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
    ("NVIDIA GeForce RTX 3090", "fp16", 71),
    ("NVIDIA B200", "bf16", 2250),
    ("NVIDIA GB200", "bf16", 2500),                   # contains "B200"
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4),      # torch dtype spellings
    ("NVIDIA H100 80GB HBM3", "torch.float16", 989.4),
])
def test_known_devices(name, dtype, tflops):
    assert peak_flops(name, dtype) == pytest.approx(tflops * T)


def test_traps_resolve_to_different_rows():
    rows = {n: peaks.lookup_device(n).name for n in (
        "NVIDIA GH200 480GB", "NVIDIA H200", "NVIDIA GB200", "NVIDIA B200", "NVIDIA A10",
        "NVIDIA A10G", "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA L40", "NVIDIA L40S",
        "NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL")}
    assert len(set(rows.values())) == len(rows), rows


@pytest.mark.parametrize("name,dtype", [
    ("cpu", "bf16"),
    ("NVIDIA GeForce RTX 4090 D", "bf16"),             # the export part, not the 4090
    ("NVIDIA GeForce RTX 3090 Ti", "bf16"),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "bf16"),      # a slice of the GPU
    ("Tesla V100-SXM2-32GB", "bf16"),                  # no bf16 tensor cores
    ("NVIDIA H100 80GB HBM3", "int8"),                 # not a training dtype we know
    ("Some Future Accelerator", "bf16"),
])
def test_unknown_is_none_with_one_warning(name, dtype, caplog):
    peaks._warned.discard((name, dtype))
    with caplog.at_level(logging.WARNING, logger="telemetry.daemon.mfu"):
        assert peak_flops(name, dtype) is None
        assert peak_flops(name, dtype) is None
    warnings = [r for r in caplog.records if "MFU disabled" in r.getMessage()]
    assert len(warnings) == 1
    assert "override" in warnings[0].getMessage()


def test_every_row_is_dense_and_ordered():
    for _, row in peaks._TABLE:
        tensor = [v for v in (row.bf16, row.fp16, row.tf32) if v is not None]
        # tensor-core paths are never slower than plain fp32 on these parts
        assert all(v >= row.fp32 for v in tensor), row
        assert row.fp16 is not None and row.fp32 is not None, row
