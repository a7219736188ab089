"""Where a run directory's live daemon is: `<log dir>/endpoints.json`.

A relaunch of a run (the same run directory, resumed) gets a new daemon, and under
`telemetry run` a new private socket directory too: a consumer attached to the first daemon's
sockets would wait on them for ever. So each daemon, once its sockets are bound, writes them
into the run directory it holds (run_lock.py: one live daemon per run directory), replacing
its predecessor's:

    {"pid": 4242, "ingest": "ipc://...", "pub": "ipc://...", "control": "ipc://..."}

`telemetry tail --run-dir DIR` (and a tail that learnt the run directory from the daemon's
status) reads it again when its daemon goes away, and follows the new one. The file is a run
file (the run's mode, written atomically); a reader takes it only as a regular file of ours,
small, whose endpoints are endpoints (endpoints.normalize), and attaches to them only as it
would to one given on its command line (endpoints.check_ipc).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from telemetry.shared.numbers import is_int

FILE_NAME = "endpoints.json"
MAX_BYTES = 4096
KEYS = ("ingest", "pub", "control")


def write(log_dir: Path, eps: dict[str, str]) -> None:
    """Record this daemon's bound endpoints in its run directory (OSError when it cannot)."""
    from telemetry.shared import files

    body = {"pid": os.getpid(), **{k: eps[k] for k in KEYS if isinstance(eps.get(k), str)}}
    files.write_file(Path(log_dir) / FILE_NAME, json.dumps(body).encode() + b"\n")


def read(log_dir: Path) -> dict | None:
    """The endpoints the run directory's latest daemon wrote ({"pid", "ingest", "pub",
    "control"}, each present only when valid), or None: no such file, not a plain file of ours,
    not such an object."""
    from telemetry.shared import files
    from telemetry.shared.endpoints import EndpointError, normalize

    path = Path(log_dir) / FILE_NAME
    try:
        if os.lstat(path).st_uid != os.getuid():
            return None
    except OSError:
        return None
    try:
        body = json.loads(files.read_small(path, MAX_BYTES) or "null")
    except (ValueError, RecursionError):   # 4 kB of "[" is nested past json's recursion limit
        return None
    if not isinstance(body, dict):
        return None
    out: dict = {"pid": body["pid"]} if is_int(body.get("pid")) else {}
    for k in KEYS:
        if isinstance(body.get(k), str):
            try:
                out[k] = normalize(body[k])
            except EndpointError:
                pass
    return out
