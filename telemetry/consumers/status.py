"""Ask a running daemon for its counters (records in, malformed, dropped, ranks, sinks, uptime)."""
from __future__ import annotations

import argparse
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--control", metavar="EP", help="the daemon's control endpoint "
                   "(default $TELEMETRY_CONTROL, else the private ipc socket)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout", type=float, default=3.0, metavar="S", help="seconds to wait (default 3)")


def run(args: argparse.Namespace) -> int:
    from telemetry.shared import endpoints
    from telemetry.daemon.control import request

    ep = endpoints.resolve("control", args.control)
    try:
        st = request(ep, "status", timeout_s=args.timeout)
    except TimeoutError as exc:
        print(f"telemetry status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(st))
        return 0
    print(f"run {st['run_name']}  pid {st['pid']}  up {st['uptime_s']:.0f} s  log dir {st['log_dir']}"
          f"  inner loops {st.get('inner_loops', '?')}")
    print(f"records in {st['records_in']}  malformed {st['records_malformed']}  "
          f"dropped by clients {st['records_dropped_by_clients']}  lost in transit {st['records_lost_in_transit']}")
    print(f"ranks {st['ranks']}  last step {st['last_step']}  steps out {st['steps_out']} "
          f"({st['steps_incomplete']} without every rank)")
    for name, s in st["sinks"].items():
        err = f"  last error: {s['last_error']}" if s.get("last_error") else ""
        print(f"sink {name:<12} written {s['written']:<9} queued {s['queued']:<7} dropped {s['dropped']:<7} "
              f"errors {s['errors']}{err}")
    return 0
