"""The registry of diagnosis rules: name -> Rule class. One small class per rule, one job each.

    data_bound      low GPU utilization while data loading takes a large share of the step
    launch_bound    low GPU utilization with little data time: CPU/launch-bound or a small batch
    memory_leak     device memory (memory/allocated_gb) growing step over step
    allocator       allocator retries (cudaMalloc retries) or OOMs rising
    nonfinite       NaN/Inf loss or grad norm
    loss_spike      loss far above its recent median
    throughput_drop tokens/s well under the run's own median for several log steps
    straggler       one rank consistently slower than the fastest
    throttle        a GPU's clocks held down by temperature or power
    host_memory     host RAM near full
    rank_stopped    a rank that reported before has gone silent or is missing from aggregated steps
"""
from __future__ import annotations

from telemetry.daemon.diagnosis.rules.base import Finding, Rule
from telemetry.daemon.diagnosis.rules.hardware import HostMemory, Throttle
from telemetry.daemon.diagnosis.rules.liveness import RankStopped
from telemetry.daemon.diagnosis.rules.memory import AllocatorPressure, MemoryLeak
from telemetry.daemon.diagnosis.rules.training import LossSpike, NonFinite, Straggler, ThroughputDrop
from telemetry.daemon.diagnosis.rules.utilization import DataBound, LaunchBound

RULES: dict[str, type[Rule]] = {cls.name: cls for cls in (
    DataBound, LaunchBound, MemoryLeak, AllocatorPressure, NonFinite, LossSpike, ThroughputDrop,
    Straggler, Throttle, HostMemory, RankStopped)}

__all__ = ["RULES", "Finding", "Rule"]
