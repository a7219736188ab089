"""Ask a running daemon for its counters (records in, malformed, dropped, ranks, sinks, uptime)."""
from __future__ import annotations

import argparse
import json
import sys

from telemetry.shared.config import number_arg
from telemetry.shared.endpoints import endpoint_arg
from telemetry.shared.numbers import is_number

# The longest a status or drain may be told to wait (a day): beyond, a typo, and libzmq's
# timeouts are C ints of milliseconds.
MAX_TIMEOUT_S = 86_400.0
TIMEOUT_ARG = number_arg(lo=0.0, lo_open=True, hi=MAX_TIMEOUT_S)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--control", type=endpoint_arg, metavar="EP", help="the daemon's control endpoint "
                   "(default $TELEMETRY_CONTROL, else the private ipc socket)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout", type=TIMEOUT_ARG, default=3.0, metavar="S", help="seconds to wait (default 3)")


def ask(prog: str, control: str | None, cmd: str, timeout_s: float, extra: dict | None = None,
        pid: int | None = None) -> tuple[dict | None, int]:
    """(the daemon's reply, 0), or (None, exit code) after one line on stderr: 2 for what the
    user can fix (a bad endpoint, a refused token), 1 for a daemon that does not answer.
    pid: the daemon's process on this host (its status said it), whose end stops the wait."""
    import zmq

    from telemetry.shared.control import GaveUp, request
    from telemetry.shared.procs import alive
    from telemetry.shared import endpoints

    try:
        ep = endpoints.resolve("control", control)
    except endpoints.EndpointError as exc:
        print(f"{prog}: {'--control' if control else 'control endpoint'}: {exc}", file=sys.stderr)
        return None, 2
    try:
        reply = request(ep, cmd, timeout_s=timeout_s, extra=extra,
                        give_up=(lambda: not alive(pid)) if pid is not None else None)
    except GaveUp:
        print(f"{prog}: the daemon at {ep} (pid {pid}) exited without answering", file=sys.stderr)
        return None, 1
    except TimeoutError as exc:
        # Nothing there: say where that was and how to look elsewhere (a `telemetry run` has
        # its own socket directory, which a bare `telemetry status` does not know).
        print(f"{prog}: {exc} {endpoints.where('control', control, '--control')}", file=sys.stderr)
        return None, 1
    except zmq.ZMQError as exc:   # an endpoint libzmq cannot connect to (tcp://999.1.1.1:5)
        print(f"{prog}: cannot connect to {ep}: {exc}", file=sys.stderr)
        return None, 2
    except (ValueError, UnicodeDecodeError):
        print(f"{prog}: the answer from {ep} is not JSON: not a telemetry daemon's control socket?", file=sys.stderr)
        return None, 1
    if not isinstance(reply, dict):
        print(f"{prog}: the answer from {ep} is not a JSON object", file=sys.stderr)
        return None, 1
    if reply.get("ok") is False:
        from telemetry.consumers.terminal import printable

        print(f"{prog}: the daemon at {ep} refused: {printable(reply.get('error', '?'))}", file=sys.stderr)
        return None, 2
    return reply, 0


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.terminal import printable

    st, rc = ask("telemetry status", args.control, "status", args.timeout)
    if st is None:
        return rc
    if args.json:
        print(json.dumps(st))
        return 0
    g = st.get
    lines = [f"run {g('run_name')}  pid {g('pid')}  up {_n(g('uptime_s'), '.0f')} s  log dir {g('log_dir')}"
             f"  inner loops {g('inner_loops', '?')}",
             f"records in {g('records_in')}"
             + (f" (and {g('records_in_earlier_daemons')} at the daemons before this one on the run)"
                if g("records_in_earlier_daemons") else "")
             + f"  malformed {g('records_malformed')}  "
             f"dropped by clients {g('records_dropped_by_clients')}  lost in transit {g('records_lost_in_transit')}"
             + _refused(g("values_refused"), g("values_refused_by_reason")),
             f"ranks {g('ranks')}  last step {g('last_step')}  steps out {g('steps_out')} "
             f"({g('steps_incomplete')} without every rank)" + _unannounced(st)]
    gp = g("goodput") if isinstance(g("goodput"), dict) else {}
    if isinstance(gp.get("goodput"), (int, float)) and isinstance(gp.get("buckets_s"), dict):
        from telemetry.shared.goodput import top_loss

        loss = top_loss({f"goodput/{k}_s": v for k, v in gp["buckets_s"].items()})
        lines.append(f"goodput {100 * gp['goodput']:.1f} % of {_n(gp.get('wall_s'), ',.0f')} s so far "
                     f"({gp.get('steps')} steps, {gp.get('launches')} launch(es))"
                     + (f"  biggest loss: {loss[0]} {loss[1]:,.1f} s" if loss else ""))
        ranks = gp.get("ranks") if isinstance(gp.get("ranks"), dict) else {}
        known = sorted(((v, r) for r, v in ranks.items() if isinstance(v, (int, float))), key=lambda x: x[0])
        if known:   # per rank (a daemon with --per-rank): the lowest first
            lines.append("goodput per rank (lowest first): " + ", ".join(
                f"rank {r} {100 * v:.1f} %" for v, r in known[:8]) + (f", ... {len(known) - 8} more" if len(known) > 8 else ""))
    sinks = g("sinks") if isinstance(g("sinks"), dict) else {}
    for name, s in sinks.items():
        s = s if isinstance(s, dict) else {}
        err = f"  last error: {s['last_error']}" if s.get("last_error") else ""
        if s.get("disabled_by"):          # OTLP: the environment turned OpenTelemetry's SDK off
            err += f"  exporting nothing: {s['disabled_by']}"
        if s.get("export_failures"):      # OTLP: the collector down or answering errors
            err += (f"  exports failed {s['export_failures']} of {s.get('exports')}: "
                    f"{s.get('last_export_error') or 'no reason given'}")
        lines.append(f"sink {name:<12} written {s.get('written')!s:<9} queued {s.get('queued')!s:<7} "
                     f"dropped {s.get('dropped')!s:<7} errors {s.get('errors')}{err}")
    # A run name, a path, a sink's last error may carry what a rank sent: never an escape sequence.
    print("\n".join(map(printable, lines)))
    return 0


def _refused(total: object, by_reason: object) -> str:
    """The metrics values refused alone (the rest of their record taken), by reason; "" for none."""
    if not is_number(total) or not total:
        return ""
    reasons = by_reason if isinstance(by_reason, dict) else {}
    return f"  values refused {total}" + (" (" + ", ".join(f"{k} {v}" for k, v in reasons.items()) + ")"
                                          if reasons else "")


def _unannounced(st: dict) -> str:
    """Records of ranks no hello announced (not waited for; beyond a bound, refused); "" for none."""
    taken, refused = st.get("records_unannounced"), st.get("records_unannounced_refused")
    if not (is_number(taken) and taken or is_number(refused) and refused):
        return ""
    return (f"  records of {st.get('ranks_unannounced')} rank(s) no hello announced {taken}"
            + (f" (and {refused} refused)" if refused else ""))


def _n(v: object, spec: str) -> str:
    return format(v, spec) if is_number(v) else str(v)
