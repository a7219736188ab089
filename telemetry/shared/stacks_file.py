"""The stacks file a rank keeps open: as the client writes it and the daemon checks it.

    <dir>/stacks-rank<rank>-pid<pid>.txt          0600, in a 0700 directory of the rank's uid
    telemetry-stacks v1 rank=<rank> pid=<pid> signal=<signal, 0 for none>\\n    (written at open)
    <faulthandler's dumps, appended on the signal>

The client (telemetry/client/stacks.py) creates it once and keeps it open for the life of the
process; the first line is written by the process itself. The daemon never takes this file's
path or the signal from the wire: it finds the file among the open descriptors of the process
it verifies (telemetry/daemon/forensics/verify.py), and believes the rank and the signal only
from this first line, of a file the process holds, owned by the daemon's uid.
"""
from __future__ import annotations

import re
import signal

VERSION = 1
# The first line is short; the daemon reads no more than this of it.
HEADER_MAX_BYTES = 128
_HEADER = re.compile(rb"telemetry-stacks v1 rank=(\d{1,9}) pid=(\d{1,9}) signal=(\d{1,3})\n")

# The only signals the daemon ever sends, and only to a process whose /proc/<pid>/status says
# it catches that one: none of them can be mistaken for a request to stop (SIGTERM, SIGINT),
# and none is sent where the default action (the end of the process) would follow.
SAFE_SIGNALS = frozenset({int(signal.SIGUSR1), int(signal.SIGUSR2),
                          *range(int(signal.SIGRTMIN), int(signal.SIGRTMAX) + 1)})


def file_name(rank: int, pid: int) -> str:
    return f"stacks-rank{rank}-pid{pid}.txt"


def header(rank: int, pid: int, sig: int | None) -> bytes:
    return f"telemetry-stacks v{VERSION} rank={rank} pid={pid} signal={sig or 0}\n".encode("ascii")


def parse_header(first: bytes) -> tuple[int, int, int] | None:
    """(rank, pid, signal or 0) from the start of a stacks file, or None if it is not one."""
    m = _HEADER.match(first)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def proc_start_time(pid: int | str = "self") -> int | None:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot. With the
    pid it names one process for good (a pid is reused, a pid and its start time are not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
        return int(stat[stat.rfind(b")") + 2:].split()[19])   # fields 3.. after "pid (comm) "
    except (OSError, ValueError, IndexError):
        return None


def proc_started_at(pid: int | str = "self") -> float | None:
    """When the process started, in unix seconds: now, less the time since then (the system's
    uptime, /proc/uptime, less the process's start in clock ticks since boot); to 0.01 s (btime
    in /proc/stat is whole seconds). The goodput ledger's start-up begins here
    (telemetry/consumers/goodput.py)."""
    import os
    import time

    ticks = proc_start_time(pid)
    if ticks is None:
        return None
    try:
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read(64).split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None
