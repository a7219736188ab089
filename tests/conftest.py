"""Shared fixtures and settings. `daemon`: a real daemon subprocess (ipc sockets in a private dir, W&B
disabled) that is stopped after the test; `make_daemon(**kwargs)`: the same with options
(see daemon_util.start_daemon: transport="tcp", world_size=, per_rank=, config={...}, wandb=)."""
from __future__ import annotations

import os

import pytest

# No test starts a daemon of its own by accident (client/autostart.py: the integrations would, in
# the repo's directory and the shared default runtime directory): the tests that try it set
# TELEMETRY_AUTOSTART=1 with a runtime directory and a run directory of their own.
os.environ["TELEMETRY_AUTOSTART"] = "0"
# One intra-op thread in every process the tests start (torchrun sets it for its ranks already; a
# value of your own wins): three workers and their ranks share two cores, and torch's pool, a
# thread per core in each process, spinning beside the training thread cost ~3x the CPU for the
# same run (a guarded 6-step trainer run: ~20 CPU-s, ~7 with one thread).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from daemon_util import DaemonProc, start_daemon   # tests/ is on the path: pyproject's pytest `pythonpath`


@pytest.fixture
def make_daemon(tmp_path):
    started: list[DaemonProc] = []

    def make(**kwargs) -> DaemonProc:
        sub = kwargs.pop("tmp_path", None) or tmp_path / f"d{len(started)}"
        sub.mkdir(parents=True, exist_ok=True)
        d = start_daemon(sub, **kwargs)
        started.append(d)
        return d

    yield make
    for d in started:
        d.cleanup()


@pytest.fixture
def daemon(make_daemon) -> DaemonProc:
    return make_daemon()
