"""Hang and crash forensics, from outside the training processes (issue 19).

When no step completes for `diagnosis.hang_factor` x the recent median step time (at least
`diagnosis.hang_min_s`), or a rank's process is gone without a bye, the daemon collects for each
rank on its host: every thread's Python stack (the client's faulthandler dump on a signal, see
telemetry/client/stacks.py), `py-spy dump --native` where installed and permitted, the last
records the rank sent, its last step, and its process state; writes them to
`<log_dir>/forensics/<time>/` (rank<r>.json per rank, summary.json, summary.txt) and emits one
`diagnosis/hang` (or `diagnosis/rank_exited`) event naming the rank(s) that differ from the rest.

    stacks.py   read a faulthandler dump; where a rank is (waiting in a collective, or not)
    collect.py  collect one rank's evidence (each part optional, never fatal)
    stage.py    the stage that watches the output stream and runs it, off the daemon's thread
"""
from telemetry.daemon.forensics.stage import ForensicsStage

__all__ = ["ForensicsStage"]
