"""Whether a process of this host still runs: asked by the daemon of the process it watches
(--watch-pid) and by `telemetry drain` of the daemon it waits on."""
from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, ended but not reaped yet, counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:            # another user's: it exists
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return True
