"""The W&B run id the daemon's W&B sink gives a run it names itself, derived the same way by
`telemetry replay` (telemetry/consumers/replay.py), which must find the same run."""
from __future__ import annotations

import hashlib


def stable_run_id(run_name: str) -> str:
    """The same id for the same name (the sink passes the run's name and its log dir's path)."""
    return "tm-" + hashlib.sha1(run_name.encode()).hexdigest()[:12]
