"""Dense peak FLOP/s of NVIDIA GPUs, looked up by the name NVML (or torch) reports.

The MFU denominator. Every number is the vendor's *dense* tensor-core peak (no 2:4 sparsity:
datasheets print the sparse figure with an asterisk, twice the dense one) at boost clock, per
GPU. "fp32" is the non-tensor FP32 peak (CUDA cores); training in fp32 with TF32 matmuls allowed
should ask for "tf32". GeForce cards are listed at FP16/BF16 with FP32 accumulate (what PyTorch
uses), which is half the FP16-accumulate figure their whitepapers also print.

Name traps this module is built around, all matched on word boundaries of the upper-cased name:
"GH200" contains "H200" and "GB200" contains "B200"; "A100"/"A10G" start with "A10"; "L40S" and
"L40" start with "L4"; H100/H200 come as SXM ("NVIDIA H100 80GB HBM3"), PCIe and NVL boards with
different clocks; "RTX 4090 D" and laptop parts are not the desktop card. A MIG slice
("... MIG 1g.10gb") has a fraction of the SMs and gets no peak: set an override.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger("telemetry.daemon.mfu")

DTYPES = ("bf16", "fp16", "tf32", "fp32")
_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "tf32": "tf32", "tensorfloat32": "tf32",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
}

T = 1e12  # the tables below are in TFLOP/s


@dataclass(frozen=True, slots=True)
class DevicePeak:
    """Dense peak FLOP/s of one GPU model per dtype; None where the hardware has no such path."""

    name: str
    bf16: float | None
    fp16: float | None
    tf32: float | None
    fp32: float | None

    def for_dtype(self, dtype: str) -> float | None:
        return getattr(self, dtype)


def _p(name: str, bf16: float | None, fp16: float | None, tf32: float | None, fp32: float | None) -> DevicePeak:
    scale = lambda v: None if v is None else v * T  # noqa: E731
    return DevicePeak(name, scale(bf16), scale(fp16), scale(tf32), scale(fp32))


# Ordered: the first pattern that matches wins, so the longer/more specific names come first.
# Sources are NVIDIA datasheets/whitepapers; the figure quoted is the one divided by 2 when the
# datasheet only prints the sparse number.
_TABLE: tuple[tuple[str, DevicePeak], ...] = (
    # --- Blackwell -------------------------------------------------------------------------
    # NVIDIA GB200 NVL72 datasheet, per GPU: FP16/BF16 5 PFLOPS sparse -> 2.5 dense,
    # TF32 2.5 PFLOPS sparse -> 1.25 dense, FP32 80 TFLOPS.
    (r"\bGB200\b", _p("GB200", 2500, 2500, 1250, 80)),
    # NVIDIA HGX B200 datasheet, per GPU: FP16/BF16 4.5 PFLOPS sparse -> 2.25 dense,
    # TF32 2.2 PFLOPS sparse -> 1.1 dense, FP32 75 TFLOPS.
    (r"\bB200\b", _p("B200", 2250, 2250, 1100, 75)),
    # --- Hopper ----------------------------------------------------------------------------
    # NVIDIA GH200 Grace Hopper Superchip datasheet: FP16/BF16 1,979 TFLOPS sparse -> 989.4
    # dense, TF32 989 sparse -> 494.7, FP32 67 TFLOPS (same GH100 SXM-class clocks as H100 SXM).
    (r"\bGH200\b", _p("GH200", 989.4, 989.4, 494.7, 67)),
    # NVIDIA H200 datasheet, H200 NVL column: BF16/FP16 1,671 TFLOPS sparse -> 835.5, TF32 835
    # sparse -> 417.5, FP32 60 TFLOPS.
    (r"\bH200\b.*\bNVL\b", _p("H200 NVL", 835.5, 835.5, 417.5, 60)),
    # NVIDIA H200 datasheet, H200 SXM column: BF16/FP16 1,979 sparse -> 989.4, TF32 989 sparse
    # -> 494.7, FP32 67 TFLOPS (the GH100 compute of H100 SXM with more HBM).
    (r"\bH200\b", _p("H200 SXM", 989.4, 989.4, 494.7, 67)),
    # NVIDIA H100 datasheet, H100 NVL column (per GPU): BF16/FP16 1,671 sparse -> 835.5, TF32
    # 835 sparse -> 417.5, FP32 60 TFLOPS.
    (r"\bH100\b.*\bNVL\b", _p("H100 NVL", 835.5, 835.5, 417.5, 60)),
    # NVIDIA H100 datasheet, H100 PCIe column: BF16/FP16 1,513 sparse -> 756.5, TF32 756 sparse
    # -> 378, FP32 51 TFLOPS.
    (r"\bH100\b.*\bPCIE\b", _p("H100 PCIe", 756.5, 756.5, 378, 51)),
    # NVIDIA H100 datasheet, H100 SXM column: BF16/FP16 1,979 sparse -> 989.4 (the 989.4 of
    # the Hopper whitepaper's dense table), TF32 989 sparse -> 494.7, FP32 67 TFLOPS.
    # NVML calls it "NVIDIA H100 80GB HBM3" (no "SXM" in the name).
    (r"\bH100\b", _p("H100 SXM", 989.4, 989.4, 494.7, 67)),
    # H800: H100 with export-limited NVLink; NVIDIA H800 datasheet prints the H100 tensor peaks
    # (SXM: BF16 1,979 sparse; PCIe: 1,513 sparse).
    (r"\bH800\b.*\bPCIE\b", _p("H800 PCIe", 756.5, 756.5, 378, 51)),
    (r"\bH800\b", _p("H800 SXM", 989.4, 989.4, 494.7, 67)),
    # H20 (export part): NVIDIA H20 product brief as reported by OEMs: FP16/BF16 148 TFLOPS
    # dense, TF32 74, FP32 44. Not on a public nvidia.com datasheet: prefer an override.
    (r"\bH20\b", _p("H20", 148, 148, 74, 44)),
    # --- Ampere ----------------------------------------------------------------------------
    # NVIDIA A100 datasheet (SXM and PCIe, 40 and 80 GB alike): BF16/FP16 312 TFLOPS dense
    # (624 sparse), TF32 156 (312 sparse), FP32 19.5 TFLOPS. Names: "NVIDIA A100-SXM4-80GB",
    # "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe".
    (r"\bA100\b", _p("A100", 312, 312, 156, 19.5)),
    # A800: A100 with export-limited NVLink; NVIDIA A800 datasheet prints the A100 peaks.
    (r"\bA800\b", _p("A800", 312, 312, 156, 19.5)),
    # A10G (AWS G5) has no public NVIDIA datasheet; AWS/Baseten spec comparison: FP16/BF16
    # tensor 70 TFLOPS, TF32 35, FP32 35 TFLOPS. Must precede "A10".
    (r"\bA10G\b", _p("A10G", 70, 70, 35, 35)),
    # NVIDIA A10 datasheet: BF16/FP16 125 TFLOPS dense (250 sparse), TF32 62.5 (125 sparse),
    # FP32 31.2 TFLOPS.
    (r"\bA10\b", _p("A10", 125, 125, 62.5, 31.2)),
    # NVIDIA A30 datasheet: BF16/FP16 165 dense (330 sparse), TF32 82 (165 sparse), FP32 10.3.
    (r"\bA30\b", _p("A30", 165, 165, 82, 10.3)),
    # NVIDIA A40 datasheet: BF16/FP16 149.7 dense (299.4 sparse), TF32 74.8 (149.6 sparse),
    # FP32 37.4 TFLOPS.
    (r"\bA40\b", _p("A40", 149.7, 149.7, 74.8, 37.4)),
    # NVIDIA Ampere GA102 whitepaper, RTX 3090: FP16/BF16 tensor with FP32 accumulate 71 TFLOPS
    # dense (142 sparse), TF32 35.6, FP32 35.6. Desktop card only ("... RTX 3090" at the end).
    (r"\bRTX 3090$", _p("GeForce RTX 3090", 71, 71, 35.6, 35.6)),
    # --- Ada Lovelace ----------------------------------------------------------------------
    # NVIDIA L40S datasheet: BF16/FP16 362.05 dense (733 sparse), TF32 183 (366 sparse),
    # FP32 91.6 TFLOPS. Must precede "L40" and "L4".
    (r"\bL40S\b", _p("L40S", 362.05, 362.05, 183, 91.6)),
    # NVIDIA L40 datasheet: BF16/FP16 181.05 dense (362.1 sparse), TF32 90.5 (181 sparse),
    # FP32 90.5 TFLOPS.
    (r"\bL40\b", _p("L40", 181.05, 181.05, 90.5, 90.5)),
    # NVIDIA L4 datasheet: BF16/FP16 121 dense (242 sparse), TF32 60 (120 sparse), FP32 30.3.
    (r"\bL4\b", _p("L4", 121, 121, 60, 30.3)),
    # NVIDIA Ada GPU architecture whitepaper, RTX 4090: FP16/BF16 tensor with FP32 accumulate
    # 165.2 dense (330.4 sparse), TF32 82.6, FP32 82.6 TFLOPS. Not the "4090 D" or laptop part.
    (r"\bRTX 4090$", _p("GeForce RTX 4090", 165.2, 165.2, 82.6, 82.6)),
    # --- Volta / Turing (no BF16 or TF32 tensor cores: those dtypes have no peak) ------------
    # NVIDIA V100S datasheet: tensor 130 TFLOPS, FP32 16.4.
    (r"\bV100S\b", _p("V100S PCIe", None, 130, None, 16.4)),
    # NVIDIA V100 datasheet, PCIe column: tensor 112 TFLOPS, FP32 14 TFLOPS.
    (r"\bV100\b.*\bPCIE\b", _p("V100 PCIe", None, 112, None, 14)),
    # NVIDIA V100 datasheet, SXM2 column: tensor 125 TFLOPS, FP32 15.7 ("Tesla V100-SXM2-32GB";
    # the DGX-2 SXM3 part runs the same 1530 MHz boost).
    (r"\bV100\b", _p("V100 SXM2", None, 125, None, 15.7)),
    # NVIDIA T4 datasheet: FP16 tensor 65 TFLOPS, FP32 8.1 TFLOPS.
    (r"\bT4\b", _p("T4", None, 65, None, 8.1)),
)
_COMPILED = tuple((re.compile(pattern), peak) for pattern, peak in _TABLE)

_warned: set[tuple[str, str]] = set()


def normalize_dtype(dtype: str) -> str | None:
    """'bfloat16', 'torch.bfloat16', 'bf16' -> 'bf16'; None for a name we do not know."""
    return _DTYPE_ALIASES.get(str(dtype).strip().lower())


def lookup_device(device_name: str) -> DevicePeak | None:
    """The table row for an NVML/torch device name, or None (unknown, CPU, or a MIG slice)."""
    name = " ".join(str(device_name).upper().replace("_", " ").split())
    if " MIG " in f" {name} ":
        return None  # a slice has a fraction of the SMs; the full-GPU peak would be wrong
    for pattern, peak in _COMPILED:
        if pattern.search(name):
            return peak
    return None


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of one device for a training dtype, or None when unknown.

    Args:
        device_name: as NVML or torch.cuda.get_device_name() reports it ("NVIDIA H100 80GB HBM3").
        dtype: "bf16", "fp16", "tf32" or "fp32" (torch spellings such as "bfloat16" work too).

    Returns None, with one warning per (device, dtype), for a device not in the table, a MIG
    slice, a dtype the device has no tensor path for (bf16 on V100), or an unknown dtype name.
    """
    canonical = normalize_dtype(dtype)
    row = lookup_device(device_name)
    value = row.for_dtype(canonical) if (row is not None and canonical is not None) else None
    if value is None:
        key = (str(device_name), str(dtype))
        if key not in _warned:
            _warned.add(key)
            if canonical is None:
                why = f"unknown dtype {dtype!r} (use one of {', '.join(DTYPES)})"
            elif row is None:
                why = f"device {device_name!r} is not in the peak table (or is a MIG slice / CPU)"
            else:
                why = f"{row.name} has no dense {canonical} tensor-core peak"
            log.warning("MFU disabled: %s; set a peak override (FLOP/s per device) to enable it", why)
    return value
