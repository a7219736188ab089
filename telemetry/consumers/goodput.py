"""Where a run's wall-clock time went: the goodput ledger, from what the daemon wrote.

    telemetry goodput RUN_DIR [--json FILE]

Reads the run's metrics.jsonl (every launch of the job on that run dir, every daemon that wrote
it, rotated pieces oldest first) and prints the ledger of telemetry/shared/goodput.py (its
docstring has the buckets and their formulas): the job's wall time, from the first process's
start to the last record of the last launch, split into buckets that sum to it, the biggest
loss first, with what to do about it. The daemon keeps the same ledger live (`telemetry
status`, its daemon records' goodput/* values). Per rank: from the per-rank records where the
daemon wrote them (--per-rank), else from the ledgers it kept of them (goodput_ranks.json).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from telemetry.shared.goodput import ADVICE, BUCKETS, Ledger, ledger, text, with_ranks_file   # noqa: F401 (the CLI's API)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from telemetry.shared.config import nonempty_arg

    p.add_argument("run_dir", type=nonempty_arg, help="the run dir (holding telemetry/metrics.jsonl) or the telemetry dir")
    p.add_argument("--json", type=nonempty_arg, metavar="FILE", help="also write the ledger as JSON to FILE")


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.readjsonl import ReadStats, find_log_dir, read_records
    from telemetry.consumers.terminal import printable

    if not os.path.exists(args.run_dir):
        print(f"telemetry goodput: {args.run_dir}: no such file or directory", file=sys.stderr)
        return 2
    if args.json:
        from telemetry.shared.config import writable_dir_problem

        why = ("a directory, not a file" if os.path.isdir(args.json)
               else writable_dir_problem(os.path.dirname(os.path.abspath(args.json))))
        if why:
            print(f"telemetry goodput: --json {args.json}: {why}", file=sys.stderr)
            return 2
    try:
        log_dir = find_log_dir(args.run_dir)
    except FileNotFoundError as exc:
        print(f"telemetry goodput: {exc}", file=sys.stderr)
        return 2
    stats = ReadStats()
    led = with_ranks_file(ledger(read_records(log_dir, stats)), log_dir)
    print("\n".join(printable(line) for line in text(led, Path(args.run_dir).name).split("\n")))
    if stats.num_bad or stats.num_torn:   # a damaged or hand-made file: what was not read, said
        print(f"  unreadable lines: {stats.num_bad + stats.num_torn} skipped (not records, or a torn last line)")
    if led.get("ranks_file_problem"):
        print(f"telemetry goodput: per-rank ledgers not read: {printable(led['ranks_file_problem'])}", file=sys.stderr)
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(led, indent=1) + "\n")
        except OSError as exc:
            print(f"telemetry goodput: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    return 0
