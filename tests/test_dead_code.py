"""No dead code in the product: vulture over protocol/, telemetry/, trainer/ (and the benchmarks
and testkit/ that use them) finds nothing
that is not in tests/vulture_allow.py (names used by name from outside: framework hooks,
W&B's API, atexit). A method only tests call is dead too: the tests use what production uses."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("vulture")


def test_vulture_finds_no_dead_code():
    # benchmarks/ and testkit/ are read as users of the product (a benchmark waits for a sink to
    # start; the GPU comparison prints why NVML is off); tests/ is not: a method only tests call is dead.
    out = subprocess.run([sys.executable, "-m", "vulture", "protocol", "telemetry", "trainer", "benchmarks",
                          "testkit", "tests/vulture_allow.py", "--min-confidence", "60"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and not out.stdout.strip(), \
        "dead code (remove it, or, if something outside the product uses it by name, say who in " \
        "tests/vulture_allow.py):\n" + out.stdout + out.stderr
