"""The daemon's optional C inner loops (`_hotpath.c`), or None where they are not available.

setup.py builds them when the install finds a C compiler; without one (or with
TELEMETRY_PURE_PYTHON=1 in the environment) the receiver and the aggregator run their
pure-Python loops, which give the same results, a little under half as fast per record
(benchmarks/ingest.py). `telemetry status` says which one runs.
"""
from __future__ import annotations

import os

native = None
if os.environ.get("TELEMETRY_PURE_PYTHON", "") in ("", "0"):
    try:
        from telemetry.daemon import _hotpath as native
    except ImportError:      # not built: no compiler at install time
        native = None


def name() -> str:
    return "c" if native is not None else "python"
