"""Diagnosis in the daemon: rules that read the records and say, in a sentence, what they see.

    from telemetry.daemon.diagnosis import Diagnoser, DiagnosisConfig
    diag = Diagnoser(DiagnosisConfig(straggler_ratio=1.3))   # the daemon: its config's `diagnosis:`
    events = diag.consume(record) + diag.tick(time.time())

The rules (telemetry/daemon/diagnosis/rules/) replace the seed guide's advice to watch nvidia-smi, htop
and iotop in other terminals: data-bound, launch-bound, memory leak, allocator pressure, NaN/Inf,
loss spike, throughput drop, straggler, throttling, host RAM, a rank that stopped.
"""
from __future__ import annotations

from telemetry.daemon.diagnosis.config import DiagnosisConfig
from telemetry.daemon.diagnosis.diagnoser import Diagnoser
from telemetry.daemon.diagnosis.rules import RULES, Finding, Rule

__all__ = ["Diagnoser", "DiagnosisConfig", "RULES", "Finding", "Rule"]
