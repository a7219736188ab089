"""Ask a running daemon to drain and exit: stop intake, flush and fsync every sink, then reply
with the final counters (printed as JSON)."""
from __future__ import annotations

import argparse
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--control", metavar="EP", help="the daemon's control endpoint (default as for status)")
    p.add_argument("--timeout", type=float, default=15.0, metavar="S", help="seconds to wait (default 15)")


def run(args: argparse.Namespace) -> int:
    from telemetry.shared import endpoints
    from telemetry.daemon.control import request

    try:
        final = request(endpoints.resolve("control", args.control), "drain", timeout_s=args.timeout)
    except TimeoutError as exc:
        print(f"telemetry drain: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(final))
    return 0 if final.get("drained") else 1
