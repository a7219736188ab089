"""Diagnosis in the daemon: rules that read the records and say, in a sentence, what they see.

    from telemetry.diagnosis import Diagnoser, DiagnosisConfig
    diag = Diagnoser(DiagnosisConfig(**yaml_dict))
    events = diag.consume(record) + diag.tick(time.time())

The rules (telemetry/diagnosis/rules/) replace the seed guide's advice to watch nvidia-smi, htop
and iotop in other terminals: data-bound, launch-bound, memory leak, allocator pressure, NaN/Inf,
loss spike, throughput drop, straggler, throttling, host RAM, a rank that stopped.
"""
from __future__ import annotations

from telemetry.diagnosis.config import DiagnosisConfig
from telemetry.diagnosis.diagnoser import Diagnoser
from telemetry.diagnosis.rules import RULES, Finding, Rule

__all__ = ["Diagnoser", "DiagnosisConfig", "RULES", "Finding", "Rule"]
