"""Hang and crash forensics, from outside the training processes.

When no step completes for `diagnosis.hang_factor` x the recent median step time (at least
`diagnosis.hang_min_s`), or a rank's process is gone without a bye, the daemon collects for each
rank on its host: every thread's Python stack (the client's faulthandler dump on a signal, see
telemetry/client/stacks.py), `py-spy dump --native` where installed and permitted, the last
records the rank sent, its last step, and its process state; writes them to
`<log_dir>/forensics/<time>/` (rank<r>.json per rank, summary.json, summary.txt) and emits one
`diagnosis/hang` (or `diagnosis/rank_exited`) event naming the rank(s) that differ from the rest.

Nothing here acts on what a hello says. A hello's pid, signal and file are claims from the
network (loopback TCP is open to every local user; a node daemon's records arrive on the same
socket): the stage signals, reads, py-spies or polls only processes it has verified itself, in
/proc, as this run's ranks on this host (verify.py: the daemon's uid, the claimed start time, the
process's own stacks file among its descriptors naming its rank, a connection to this daemon's
local ingest; the signal from that file, sent only if the process catches it). A hello that was
forwarded, or names another host, is never a local rank. Bundles are private: 0700 directories,
0600 files.

    verify.py   which processes are this run's local ranks (the checks, in its docstring)
    stacks.py   read a faulthandler dump; where a rank is (waiting in a collective, or not)
    collect.py  collect one rank's evidence (each part optional, never fatal)
    stage.py    the stage that watches the output stream and runs it, off the daemon's thread
"""
from telemetry.daemon.forensics.stage import ForensicsStage

__all__ = ["ForensicsStage"]
