"""Ask a running daemon to drain and exit: stop intake, flush and fsync every sink, then reply
with the final counters (printed as JSON)."""
from __future__ import annotations

import argparse
import json
import sys

from telemetry.consumers.status import TIMEOUT_ARG
from telemetry.shared.endpoints import endpoint_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--control", type=endpoint_arg, metavar="EP", help="the daemon's control endpoint (default as for status)")
    p.add_argument("--timeout", type=TIMEOUT_ARG, default=15.0, metavar="S", help="seconds to wait (default 15)")


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.status import ask

    final, rc = ask("telemetry drain", args.control, "drain", args.timeout)
    if final is None:
        return rc
    print(json.dumps(final))
    problems = _problems(final)
    if problems:
        print("telemetry drain: " + "; ".join(problems), file=sys.stderr)
    jsonl = (final.get("sinks") or {}).get("jsonl") or {}
    failed = any(jsonl.get(k) for k in ("write_errors", "lines_lost", "fsync_errors"))
    return 0 if final.get("drained") and not failed else 1


def _problems(final: dict) -> list[str]:
    """What the final counters say was lost or is unknown, in words (nothing: an empty list)."""
    out = []
    jsonl = (final.get("sinks") or {}).get("jsonl") or {}
    if jsonl.get("write_errors") or jsonl.get("lines_lost"):
        out.append(f"metrics.jsonl could not hold {jsonl.get('dropped', 0):,} records (write errors "
                   f"{jsonl.get('write_errors', 0)}, lost with a deleted file {jsonl.get('lines_lost', 0)})")
    if final.get("records_unread_at_drain"):
        out.append(f"{final['records_unread_at_drain']:,} records queued at the deadline were counted, "
                   f"not processed (raise drain_timeout_s)")
    if final.get("records_shed_at_intake"):
        out.append(f"{final['records_shed_at_intake']:,} records beyond the daemon's ingest share were shed and "
                   f"counted (a backlog: raise memory_mb, or send fewer or narrower records)")
    if final.get("sources_open_at_drain"):
        out.append(f"{final['sources_open_at_drain']} client(s) were still sending without a bye: what they "
                   f"sent after the drain is counted by no one")
    if final.get("unfinished_sinks"):
        out.append("abandoned at the deadline: " + ", ".join(map(str, final["unfinished_sinks"])))
    return out
