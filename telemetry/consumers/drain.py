"""Ask a running daemon to drain and exit: stop intake, flush and fsync every sink, then reply
with the final counters (printed as JSON)."""
from __future__ import annotations

import argparse
import json

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
    return 0 if final.get("drained") else 1
