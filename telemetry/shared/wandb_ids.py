"""What both sides of a W&B run derive alike: the W&B run id the daemon's W&B sink gives a run it
names itself (also derived by `telemetry replay`, telemetry/consumers/replay.py, which must find
the same run), and the directory a script's `run.dir` falls back to."""
from __future__ import annotations

import hashlib
import os


def stable_run_id(run_name: str) -> str:
    """The same id for the same name (the sink passes the run's name and its log dir's path)."""
    return "tm-" + hashlib.sha1(run_name.encode()).hexdigest()[:12]


def fallback_files_dirs(root: str, run_id: str) -> list[str]:
    """Where a telemetry.wandb run's own `run.dir` may be, in the order the script tries them:
    under its root, else under the system's temporary directory (W&B's own fallback). The
    daemon's W&B sink looks in the same places."""
    import tempfile

    return list(dict.fromkeys(fallback_files_dir(r, run_id) for r in (root, tempfile.gettempdir())))


def fallback_files_dir(root: str, run_id: str) -> str:
    """A telemetry.wandb run's `run.dir` while the daemon's W&B run directory is not known to the
    script (W&B still starting in the daemon, off there, or refused): `<root>/wandb/telemetry-<id>/files`,
    beside W&B's own run directories under the same root (the script's `dir`, else its working
    directory). The daemon's W&B sink saves what it finds there into the run at its finish, as
    W&B uploads its run directory's files, so both sides derive it from the same two values."""
    return os.path.join(root, "wandb", f"telemetry-{run_id}", "files")
