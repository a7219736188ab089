"""What the straggler rule costs the diagnosis stage per aggregated step: the rule at a given
commit against the working tree's, side by side in one run, on a recorded balanced run (tests/data/
straggler_traces/ddp_balanced_beside_a_hog.jsonl: 200 log steps of 2 DDP ranks beside a CPU hog)
fed --passes times in a row, one fresh rule per pass. Reported: µs per step, the median and the
range over --repeats rounds (the two versions alternate within a round), and the events each wrote.

    .venv/bin/python -m benchmarks.straggler_rule_cost [--base 2039329] [--passes 50] [--repeats 7]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "straggler_traces" / "ddp_balanced_beside_a_hog.jsonl"
RULES = "telemetry/daemon/diagnosis/rules/training.py"
CONFIG = "telemetry/daemon/diagnosis/config.py"


def load_at(commit: str):
    """(Straggler, DiagnosisConfig) of `commit`, imported from its own sources under another name."""
    tmp = Path(tempfile.mkdtemp())
    mods = {}
    for name, path in (("config", CONFIG), ("rules", RULES)):
        src = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
        src = src.replace("from telemetry.daemon.diagnosis.config import", "from _base_config import")
        (tmp / f"_base_{name}.py").write_text(src)
    sys.path.insert(0, str(tmp))
    for name in ("config", "rules"):
        spec = importlib.util.spec_from_file_location(f"_base_{name}", tmp / f"_base_{name}.py")
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[f"_base_{name}"] = mods[name]
        spec.loader.exec_module(mods[name])
    return mods["rules"].Straggler, mods["config"].DiagnosisConfig


def timed(rule_cls, cfg_cls, recs: list[dict], passes: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    events = 0
    for _ in range(passes):
        rule = rule_cls(cfg_cls())
        for r in recs:
            events += len(rule.consume(r))
    return (time.perf_counter() - t0) / (passes * len(recs)) * 1e6, events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="2039329", help="the commit to compare with (default: before issue 29's usual excess)")
    ap.add_argument("--passes", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    from telemetry.daemon.diagnosis.config import DiagnosisConfig
    from telemetry.daemon.diagnosis.rules.training import Straggler

    recs = [json.loads(line) for line in TRACE.read_text().splitlines()[1:]]
    recs = [r for r in recs if r["step"] >= DiagnosisConfig().warmup_steps]   # what the stage feeds it
    versions = {f"base {a.base}": load_at(a.base), "working tree": (Straggler, DiagnosisConfig)}
    us = {k: [] for k in versions}
    events = {}
    for _ in range(a.repeats):
        for name, (rule, cfg) in versions.items():
            t, events[name] = timed(rule, cfg, recs, a.passes)
            us[name].append(t)
    for name in versions:
        print(f"{name:>20}: {statistics.median(us[name]):6.2f} µs a step (range {min(us[name]):.2f}-{max(us[name]):.2f}), "
              f"{events[name] // a.passes} events a pass")
    base, new = (statistics.median(v) for v in us.values())
    print(f"ratio (working tree / base): {new / base:.3f}")


if __name__ == "__main__":
    main()
