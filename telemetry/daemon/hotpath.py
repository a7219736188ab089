"""The daemon's optional C inner loops (`_hotpath.c`), or None where they are not available.

setup.py builds them when the install finds a C compiler; without one (or with
TELEMETRY_PURE_PYTHON=1 in the environment) the receiver and the aggregator run their
pure-Python loops, which give the same results at 60-70 % of the records per second
(benchmarks/ingest.py on the 2-core dev box). `telemetry status` says which one runs.
"""
from __future__ import annotations

import os


def chosen_python() -> bool:
    """Whether TELEMETRY_PURE_PYTHON asks for the pure-Python loops."""
    return os.environ.get("TELEMETRY_PURE_PYTHON", "") not in ("", "0")


native = None
if not chosen_python():
    try:
        from telemetry.daemon import _hotpath as native
    except ImportError:      # not built: no compiler at install time
        native = None


def name() -> str:
    return "c" if native is not None else "python"
