"""Which inner loops the daemon runs: the C twins (`_hotpath.c`) or the Python ones (`loops.py`).

setup.py builds the C extension when the install finds a C compiler; without one (or with
TELEMETRY_PURE_PYTHON=1 in the environment) the receiver and the aggregator run loops.py,
which gives the same results, more slowly (benchmarks/ingest.py measures by how much:
benchmarks/RESULTS.md). `telemetry status` says which one runs. Both have the same functions with the
same signatures (TWINS below); loops.py is their definition. An extension built from an older
_hotpath.c that lacks one of them counts as not built (rebuild: `python setup.py build_ext --inplace`).
"""
from __future__ import annotations

import os

from telemetry.daemon import loops as python_loops


def chosen_python() -> bool:
    """Whether TELEMETRY_PURE_PYTHON asks for the pure-Python loops."""
    return os.environ.get("TELEMETRY_PURE_PYTHON", "") not in ("", "0")


# The functions each of the two has (loops.py's docstring says what they compute).
# (A loop without a C twin lives with its user: step_values in aggregator.py.)
TWINS = ("read_frames_upto", "read_ring", "decode_frames", "tally", "gather", "reduce_column", "rate_sums", "phase_straggler")

native = None
if not chosen_python():
    try:
        from telemetry.daemon import _hotpath as native
    except ImportError:      # not built: no compiler at install time
        native = None
    if native is not None and not all(hasattr(native, twin) for twin in TWINS):
        native = None        # built from an older _hotpath.c: stale, as if not built

# What the receiver and the aggregator call.
loops = native if native is not None else python_loops


def name() -> str:
    return "c" if native is not None else "python"
