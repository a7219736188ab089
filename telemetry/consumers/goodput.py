"""Where a run's wall-clock time went: the goodput ledger, from what the daemon wrote.

    telemetry goodput RUN_DIR [--json FILE]      (--json -: the JSON alone on stdout, for scripts)
    telemetry goodput --exclude START END [--reason TEXT] [--control EP]

The second form marks planned maintenance: the running daemon (found as `telemetry status` finds
it) writes a goodput/exclude event into its run, and every ledger of that run (this command's,
the daemon's own, `telemetry report`'s) books the part of the window in which the job made no
progress as `excluded`, out of the wall time goodput counts. START and END are unix times or ISO
8601 (2026-11-29T02:00:00Z; without a zone, this machine's local time), or `now`. The job's own
client marks a window with the events goodput/exclude_begin and goodput/exclude_end.

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
import errno
import json
import os
import sys
from pathlib import Path

from telemetry.shared.config import STDOUT_PATH
from telemetry.shared.goodput import ADVICE, BUCKETS, Ledger, ledger, text, with_ranks_file   # noqa: F401 (the CLI's API)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from telemetry.shared.config import nonempty_arg

    from telemetry.consumers.status import TIMEOUT_ARG
    from telemetry.shared.endpoints import endpoint_arg

    p.add_argument("run_dir", type=nonempty_arg, nargs="?",
                   help="the run dir (holding telemetry/metrics.jsonl) or the telemetry dir")
    p.add_argument("--json", type=nonempty_arg, metavar="FILE",
                   help="also write the ledger as JSON to FILE; - writes it to stdout, instead of the text")
    p.add_argument("--exclude", type=when_arg, nargs=2, metavar=("START", "END"),
                   help="mark planned maintenance from START to END (unix time, ISO 8601 or now) in the run "
                        "the daemon at --control writes: excluded from goodput")
    p.add_argument("--reason", type=nonempty_arg, metavar="TEXT", help="with --exclude: why (kept in the event)")
    p.add_argument("--control", type=endpoint_arg, metavar="EP",
                   help="with --exclude: the daemon's control endpoint (default as for status)")
    p.add_argument("--timeout", type=TIMEOUT_ARG, default=15.0, metavar="S",
                   help="with --exclude: seconds to wait for the daemon (default 15)")


def when_arg(text: str) -> float:
    """An argparse `type=` for a moment: unix seconds, ISO 8601 (no zone: local time) or now."""
    import math
    import time
    from datetime import datetime

    text = text.strip()
    if text == "now":
        return time.time()
    try:
        t = float(text)
    except ValueError:
        try:
            t = datetime.fromisoformat(text).timestamp()
        except (ValueError, OverflowError, OSError):
            raise argparse.ArgumentTypeError(f"{text!r}: a unix time, an ISO 8601 time or now") from None
    if not math.isfinite(t) or t < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a unix time, an ISO 8601 time or now")
    return t


def exclude(args: argparse.Namespace) -> int:
    """`--exclude START END`: the daemon writes the window into its run (module docstring)."""
    import time

    from telemetry.consumers.status import ask

    start, end = args.exclude
    if not end > start:
        print("telemetry goodput: --exclude START END: END must be after START", file=sys.stderr)
        return 2
    window = {"start": start, "end": end, "reason": args.reason or ""}
    reply, rc = ask("telemetry goodput", args.control, "exclude", args.timeout, extra=window)
    if reply is None:
        return rc
    fmt = "%Y-%m-%d %H:%M:%S UTC"
    print(f"excluded from goodput: {time.strftime(fmt, time.gmtime(start))} -> {time.strftime(fmt, time.gmtime(end))} "
          f"(a window of {end - start:,.0f} s: the ledger counts only its part within the job's run in which the "
          f"job made no progress; written into the daemon's run)")
    return 0


def _open_output(path: str, mode: int) -> int:
    """`--json FILE` opened for writing without ever waiting: a FIFO nobody reads is refused
    (OSError), one with a reader (`--json /dev/stdout | jq`) and a terminal are written to. Never
    through what another user could have put at its name (files.open_output_file): a regular
    file is written new, once the run dir has been found."""
    from telemetry.shared import files

    try:
        return files.open_output_file(path, mode)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OSError(exc.errno, "a FIFO that nobody reads (not waited on)", path) from None
        raise


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.readjsonl import ReadStats, Unreadable, find_log_dir, read_records
    from telemetry.consumers.terminal import printable

    if args.exclude is not None:
        if args.run_dir or args.json:
            print("telemetry goodput: --exclude goes to the running daemon: no RUN_DIR or --json with it", file=sys.stderr)
            return 2
        return exclude(args)
    if args.run_dir is None:
        print("telemetry goodput: a RUN_DIR is needed (or --exclude START END)", file=sys.stderr)
        return 2
    if args.reason or args.control:
        print("telemetry goodput: --reason and --control go with --exclude", file=sys.stderr)
        return 2
    if not os.path.exists(args.run_dir):
        print(f"telemetry goodput: {args.run_dir}: no such file or directory", file=sys.stderr)
        return 2
    to_stdout = args.json == STDOUT_PATH
    if args.json and not to_stdout:
        from telemetry.shared.config import writable_dir_problem

        # A name that exists is judged when it is opened (a /dev/stdout, in a /dev nobody but root
        # may create in); a new one needs its directory made and writable.
        why = ("a directory, not a file" if os.path.isdir(args.json)
               else None if os.path.lexists(args.json)
               else writable_dir_problem(os.path.dirname(os.path.abspath(args.json))))
        if why:
            print(f"telemetry goodput: --json {args.json}: {why}", file=sys.stderr)
            return 2
    try:
        log_dir = find_log_dir(args.run_dir)
    except (FileNotFoundError, Unreadable) as exc:
        print(f"telemetry goodput: {exc}", file=sys.stderr)
        return 2
    out_fd = None
    if args.json and not to_stdout:
        from telemetry.shared import files

        try:
            # A new --json FILE is as private as the run it sums up (the process's own modes stay).
            out_fd = _open_output(args.json, files.modes_like(log_dir).file)
        except OSError as exc:
            print(f"telemetry goodput: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    stats = ReadStats()
    led = with_ranks_file(ledger(read_records(log_dir, stats)), log_dir)
    if to_stdout:     # stdout is the JSON's alone: a script parses it; what was skipped goes to stderr
        print(json.dumps(led, indent=1))
    else:
        print("\n".join(printable(line) for line in text(led, Path(args.run_dir).name).split("\n")))
    if stats.num_bad or stats.num_torn:   # a damaged or hand-made file: what was not read, said
        print(f"{'telemetry goodput: ' if to_stdout else '  '}unreadable lines: {stats.num_bad + stats.num_torn} "
              "skipped (not records, or a torn last line)", file=sys.stderr if to_stdout else sys.stdout)
    if led.get("ranks_file_problem"):
        print(f"telemetry goodput: per-rank ledgers not read: {printable(led['ranks_file_problem'])}", file=sys.stderr)
    if out_fd is not None:
        try:
            with os.fdopen(out_fd, "w") as out:
                out.write(json.dumps(led, indent=1) + "\n")
        except OSError as exc:
            print(f"telemetry goodput: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    return 0
