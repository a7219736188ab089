"""The daemon's NVML poller beside nvidia-smi, read at the same moment while the GPU is loaded.

    python -m benchmarks.gpu.nvml_compare [--samples 5] [--interval-s 1] [--json]

Each sample starts `nvidia-smi --query-gpu=...` and, while it runs, calls
NvmlPoller.poll_once() (the very object the daemon polls with); both timestamps are kept.
A bf16 matmul loop in a child process keeps the GPU busy meanwhile, so utilization, power
and clocks are not idle readings. Without NVML (a CPU machine) it reports why, and nothing fails.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time

SMI_FIELDS = ("index", "utilization.gpu", "memory.used", "power.draw", "temperature.gpu", "clocks.sm")
# nvidia-smi column -> (poller key, factor from nvidia-smi's unit to the poller's)
MATCH = {
    "utilization.gpu": ("gpu/util_percent", 1.0),               # %
    "memory.used": ("gpu/memory_used_gb", 1024 ** 2 / 1e9),     # MiB -> GB (1e9 bytes)
    "power.draw": ("gpu/power_w", 1.0),                         # W
    "temperature.gpu": ("gpu/temperature_c", 1.0),              # C
    "clocks.sm": ("gpu/sm_clock_mhz", 1.0),                     # MHz
}
LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def _smi_cmd() -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"]


def _parse_smi(text: str) -> dict[int, dict[str, float | None]]:
    out = {}
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(SMI_FIELDS):
            continue
        row = {}
        for name, cell in zip(SMI_FIELDS[1:], cells[1:]):
            try:
                row[name] = float(cell)
            except ValueError:  # "[N/A]", "[Not Supported]"
                row[name] = None
        out[int(cells[0])] = row
    return out


def compare(num_samples: int = 5, interval_s: float = 1.0, load: bool = True) -> dict:
    """Side-by-side samples, or {"available": False, "reason": ...} without NVML."""
    from telemetry.daemon.pollers.config import PollersConfig
    from telemetry.daemon.pollers.nvml import NvmlPoller

    poller = NvmlPoller(PollersConfig(nvml_pcie=False, nvml_xid=False))  # the fields compared only
    first = poller.poll_once()
    smi = shutil.which("nvidia-smi")
    if not first or smi is None:
        reason = poller.unavailable_reason or ("nvidia-smi not found" if smi is None else "no GPU records")
        poller.close()
        return {"available": False, "reason": f"no NVML: {reason}"}
    load_proc = None
    if load:
        load_proc = subprocess.Popen([sys.executable, "-c", LOAD, str(num_samples * interval_s + 8)])
        time.sleep(4.0)  # CUDA start-up and clocks ramping
    samples = []
    try:
        for _ in range(num_samples):
            t_smi = time.time()
            proc = subprocess.Popen(_smi_cmd(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            records = poller.poll_once()  # while nvidia-smi reads the same counters
            out, err = proc.communicate(timeout=30)
            t_smi_done = time.time()
            smi_rows = _parse_smi(out)
            for rec in records:
                row = smi_rows.get(rec["gpu"], {})
                fields = {}
                for name, (key, factor) in MATCH.items():
                    s = row.get(name)
                    fields[key] = {"poller": rec["values"].get(key), "nvidia_smi": None if s is None else s * factor}
                samples.append({"gpu": rec["gpu"], "t_poller": rec["t"], "t_smi_start": t_smi,
                                "t_smi_end": t_smi_done, "fields": fields})
            time.sleep(interval_s)
    finally:
        if load_proc is not None:
            load_proc.terminate()
            load_proc.wait(timeout=30)
        names = dict(poller.gpu_names)
        poller.close()
    return {"available": True, "gpu_names": names, "samples": samples, "summary": summarize(samples)}


def summarize(samples: list[dict]) -> dict:
    """Per field: the median poller and nvidia-smi values and the median |difference|."""
    import statistics

    out = {}
    for key in (k for k, _ in MATCH.values()):
        pairs = [(s["fields"][key]["poller"], s["fields"][key]["nvidia_smi"]) for s in samples
                 if s["fields"][key]["poller"] is not None and s["fields"][key]["nvidia_smi"] is not None]
        if pairs:
            out[key] = {"poller": statistics.median(p for p, _ in pairs),
                        "nvidia_smi": statistics.median(q for _, q in pairs),
                        "median_abs_diff": statistics.median(abs(p - q) for p, q in pairs), "n": len(pairs)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--interval-s", type=float, default=1.0)
    args = ap.parse_args(argv)
    print(json.dumps(compare(args.samples, args.interval_s), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
