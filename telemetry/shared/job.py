"""Which job a process is part of: the key of the daemon a client starts for its job (a bare
client with $TELEMETRY_AUTOSTART=1, an integration's; endpoints.job_runtime_dir,
telemetry/client/autostart.py).

Two scripts of one user started side by side (from one shell, one session, one process group)
are two jobs; the ranks a launcher starts, the children a rank forks or spawns, are one. The
launcher's environment and the process tree say which, and both are known before any daemon:

    a launcher's rank (its environment, as the launcher gave it, names a rank: $RANK,
    $LOCAL_RANK, $WORLD_SIZE, or MPI's and Slurm's: torchrun, DeepSpeed's launcher, accelerate,
    mpirun, srun)                                       is part of its parent's job
    a multiprocessing child (spawn or forkserver)       is part of its parent's job
    a fork (the same command line as its parent)        is part of its parent's job
    any other process                                   is a job of its own

So torchrun's ranks meet at their agent (one per node and launch), a DataLoader worker at its
rank, and a script started from a shell is its own job whatever else that shell runs. The job's
key is its first process's pid and start time (a pid is reused; a pid and its start time are not).
An id a launcher gives its ranks (TORCHELASTIC_RUN_ID is "none" unless --standalone or
--rdzv-id; SLURM_JOB_ID is one for every script of a batch job) does not tell jobs apart.
"""
from __future__ import annotations

import os

from telemetry.shared.stacks_file import proc_start_time

# The launchers' names for a rank, its local rank and the world (the client's own lists,
# telemetry/client/core.py, read from the process's environment here).
RANK_ENV = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                      "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID",
                      "SLURM_LOCALID", "SLURM_NTASKS"})
# How far up the tree a job's first process is looked for (a rank's spawned worker's fork: 3).
MAX_DEPTH = 16


def job_key() -> str:
    """`<pid>-<start time>` of this process's job's first process (job_root)."""
    root = job_root()
    return f"{root}-{proc_start_time(root) or 0}"


def job_root(pid: int | None = None) -> int:
    """The pid of the first process of `pid`'s job (default: this process's); see the module's
    docstring. A parent that cannot be read (another user's, gone) ends the search."""
    pid = pid or os.getpid()
    for _ in range(MAX_DEPTH):
        parent = _ppid(pid)
        if parent <= 1:
            break
        cmdline = _read(pid, "cmdline")
        if not (_names_a_rank(pid) or b"multiprocessing" in cmdline or cmdline == _read(parent, "cmdline")):
            break
        pid = parent
    return pid


def _names_a_rank(pid: int) -> bool:
    """Whether the environment the process was started with names a rank."""
    names = {entry.partition(b"=")[0].decode(errors="replace") for entry in _read(pid, "environ").split(b"\0")}
    return not names.isdisjoint(RANK_ENV)


def _ppid(pid: int) -> int:
    stat = _read(pid, "stat")
    try:
        return int(stat[stat.rfind(b")") + 2:].split()[1])    # field 4, after "pid (comm) state"
    except (ValueError, IndexError):
        return 0


def _read(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return b""
