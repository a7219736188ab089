"""Ask a running daemon to drain and exit: stop intake, flush and fsync every sink, then reply
with the final counters: a few lines (records in, written, lost; each sink; why it stopped;
where the files are), or with --json the whole object, one line, as drain.json holds it."""
from __future__ import annotations

import argparse
import json
import sys

from telemetry.consumers.status import TIMEOUT_ARG
from telemetry.shared.endpoints import endpoint_arg
from telemetry.shared.numbers import is_int, is_number


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--control", type=endpoint_arg, metavar="EP", help="the daemon's control endpoint (default as for status)")
    p.add_argument("--json", action="store_true", help="print the final counters as one JSON object (for scripts)")
    p.add_argument("--timeout", type=TIMEOUT_ARG, default=None, metavar="S",
                   help="seconds to wait for the final counters (default: as long as the daemon says its drain may "
                        "take, its drain_timeout_s and a slow W&B start or finish, and 30 s more)")


# With no --timeout: how long to wait for the daemon's `status` (is anyone there?), and beyond
# the drain's own length (its `limits.drain_may_take_s`) for the final counters.
PROBE_S = 5.0
MARGIN_S = 30.0


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.status import ask

    timeout, pid = args.timeout, None
    if timeout is None:
        # Asked first, briefly: a daemon that is not there is said at once, not after the long
        # wait a drain may need (a W&B start on a loaded host adds up to a minute); and its pid,
        # on this host, ends the wait should it exit without answering.
        st, rc = ask("telemetry drain", args.control, "status", PROBE_S)
        if st is None:
            return rc
        limits = st.get("limits") if isinstance(st.get("limits"), dict) else {}
        may_take = limits.get("drain_may_take_s")
        timeout = (may_take if is_number(may_take) and 0 < may_take < 86400 else 15.0) + MARGIN_S
        if is_int(st.get("pid")) and st["pid"] > 0 and _local(args.control):
            pid = st["pid"]
    final, rc = ask("telemetry drain", args.control, "drain", timeout, pid=pid)
    if final is None:
        return rc
    if final.get("drain_under_way"):
        print("telemetry drain: a drain was already under way: its final counters", file=sys.stderr)
    if args.json:
        print(json.dumps(final))
    else:
        from telemetry.consumers.terminal import printable

        # A run name, a path, a sink's last error may carry what a rank sent: no escape sequence.
        print("\n".join(map(printable, summary_lines(final))))
    problems = problem_lines(final)
    if problems:
        print("telemetry drain: " + "; ".join(problems), file=sys.stderr)
    jsonl = _jsonl(final)
    failed = any(jsonl.get(k) for k in ("write_errors", "lines_lost", "fsync_errors"))
    return 0 if final.get("drained") and not failed else 1


def _local(control: str | None) -> bool:
    """Whether the control endpoint is this host's (ipc, or loopback tcp): a pid it gives is a
    process here."""
    from telemetry.shared import endpoints

    try:
        ep = endpoints.resolve("control", control)
    except endpoints.EndpointError:
        return False
    return ep.startswith("ipc://") or ep.startswith(("tcp://127.", "tcp://localhost:", "tcp://[::1]:"))


def problem_lines(final: dict, with_wandb: bool = True) -> list[str]:
    """What the final counters say was lost or is unknown, in words (nothing: an empty list);
    with_wandb: a W&B run not made among them (the run's summary says that on a line of its own)."""
    out = []
    jsonl = _jsonl(final)
    if jsonl.get("write_errors") or jsonl.get("lines_lost"):
        out.append(f"metrics.jsonl could not hold {_num(jsonl.get('dropped', 0), ',')} records (write errors "
                   f"{jsonl.get('write_errors', 0)}, lost with a deleted file {jsonl.get('lines_lost', 0)})")
    if final.get("records_unread_at_drain"):
        out.append(f"{_num(final['records_unread_at_drain'], ',')} records queued at the deadline were counted, "
                   f"not processed (raise drain_timeout_s)")
    if final.get("records_shed_at_intake"):
        out.append(f"{_num(final['records_shed_at_intake'], ',')} records beyond the daemon's ingest share were shed "
                   f"and counted (a backlog: raise memory_mb, or send fewer or narrower records)")
    if final.get("sources_open_at_drain"):
        out.append(f"{final['sources_open_at_drain']} client(s) had not said bye (still sending, or gone silent): "
                   f"what they sent after their last record that arrived is counted only by a daemon restarted "
                   f"on this run directory")
    if final.get("records_lost_with_client"):
        out.append(f"{_num(final['records_lost_with_client'], ',')} records never left "
                   f"{final.get('sources_ended_by_page', 0)} client(s) that ended without a bye (killed or crashed): "
                   f"counted lost by their seq pages")
    not_made = wandb_not_made(final) if with_wandb else None
    if not_made:
        out.append(f"the W&B run was not made: {not_made}")
    not_whole = wandb_not_whole(final)
    if not_whole:
        out.append(not_whole)
    unfinished = final.get("unfinished_sinks")
    short = final.get("sinks_closed_short")
    short = short if isinstance(short, dict) else {}
    if short:
        out.append("closed in time without what was queued behind them (counted dropped): "
                   + ", ".join(f"{name} {_num(n, ',')} records" for name, n in short.items()))
    if isinstance(unfinished, list):
        unfinished = [name for name in unfinished if name not in short]
    if unfinished:
        out.append("abandoned at the deadline: " + (", ".join(map(str, unfinished)) if isinstance(unfinished, list)
                                                   else str(unfinished)))
    return out


# The most of drain.json that is read: the daemon's final counters are a few KB.
MAX_FINAL_BYTES = 16 << 20


def read_final(path) -> tuple[dict, str]:
    """(the final counters a daemon wrote (drain.json), why they could not be read), as a run file
    is read: only a regular file, at most MAX_FINAL_BYTES (a FIFO there never blocks the reader,
    /dev/zero is never read without end). No file is ({}, ""): a daemon killed, an older run.
    One that is there but cannot be used is ({}, the reason in words), for the reader to say:
    its counters are missing from what it shows."""
    from telemetry.shared import files

    try:
        with files.open_regular(path) as f:
            data = f.read(MAX_FINAL_BYTES + 1)
    except FileNotFoundError:
        return {}, ""
    except OSError as exc:      # NotRegularFile included: a FIFO, a device, a directory
        return {}, exc.strerror or str(exc)
    if len(data) > MAX_FINAL_BYTES:
        return {}, f"larger than {MAX_FINAL_BYTES >> 20} MB"
    try:
        final = json.loads(data)
    except UnicodeDecodeError:
        return {}, "not UTF-8 text"
    except json.JSONDecodeError as exc:
        return {}, f"not JSON ({exc.msg}: line {exc.lineno} column {exc.colno})"
    except RecursionError:
        return {}, "nested too deep"
    if not isinstance(final, dict):
        return {}, "not a JSON object"
    return final, ""


def wandb_not_made(final: dict) -> str | None:
    """Why the W&B run the user expects does not exist, with what that cost, in words; None when
    it was made or there was no W&B sink."""
    sinks = final.get("sinks")
    w = sinks.get("wandb") if isinstance(sinks, dict) else None
    if not isinstance(w, dict) or not w.get("open_error") or w.get("opened"):
        return None
    return (f"{str(w['open_error'])[:300]} ({_num(w.get('dropped'), ',')} records not in W&B; "
            f"metrics.jsonl has the run)")


def wandb_not_whole(final: dict) -> str | None:
    """What W&B's run file lost (the W&B sink's write_failed: its writer stopped, the disk full),
    in words; None when it holds the whole run, or was not checked."""
    sinks = final.get("sinks")
    w = sinks.get("wandb") if isinstance(sinks, dict) else None
    failed = w.get("write_failed") if isinstance(w, dict) else None
    if not isinstance(failed, dict):
        return None
    kept, logged = failed.get("last_step_kept"), failed.get("last_step_logged")
    where = (f"it ends at step {_num(kept, ',')}" if kept is not None else "it holds no step") + \
        (f" of the {_num(logged, ',')} logged" if logged is not None else "")
    return (f"the W&B run's file was not fully written ({str(failed.get('error'))[:200]}): {where}, without the "
            f"run's end; records not kept: {failed.get('records_not_kept', 'unknown')} (metrics.jsonl has the run: "
            f"telemetry replay makes it again): {str(failed.get('file'))[:300]}")


def _jsonl(final: dict) -> dict:
    """The jsonl sink's counters, {} where the answer holds no such object (whatever answered
    on the control endpoint is read, never trusted to be shaped as the daemon's)."""
    sinks = final.get("sinks")
    jsonl = sinks.get("jsonl") if isinstance(sinks, dict) else None
    return jsonl if isinstance(jsonl, dict) else {}


def summary_lines(final: dict) -> list[str]:
    """The final counters in a few lines: the run and why it stopped, records in / written /
    lost, steps, one line per sink, where the files are."""
    g = final.get
    sinks = g("sinks") if isinstance(g("sinks"), dict) else {}
    jsonl = sinks.get("jsonl") if isinstance(sinks.get("jsonl"), dict) else {}
    state = "drained" if g("drained") else "NOT fully drained"
    lines = [f"run {g('run_name')}: {state} ({g('stop_reason') or 'no reason given'}); the daemon ran "
             f"{_num(g('uptime_s'), ',.0f')} s"]
    kinds = g("records_in_by_kind") if isinstance(g("records_in_by_kind"), dict) else {}
    by_kind = ", ".join(f"{_num(n, ',')} {k}" for k, n in kinds.items() if n)
    lines.append(f"records in {_num(g('records_in'), ',')}" + (f" ({by_kind})" if by_kind else "")
                 + f"; metrics.jsonl: {_num(jsonl.get('written'), ',')} written (with the daemon's own records)")
    parts = [(label, g(key)) for label, key in LOSSES if g(key)]
    lost = (f"lost {_num(g('records_lost'), ',')}" + (": " + ", ".join(f"{label} {_num(n, ',')}" for label, n in parts)
                                                      if parts else "") if g("records_lost") else "lost none")
    if g("records_malformed"):
        lost += f"; malformed (refused) {_num(g('records_malformed'), ',')}"
    if g("values_refused"):
        lost += f"; values refused alone (the rest of their rows kept) {_num(g('values_refused'), ',')}"
    lines.append(lost)
    lines.append(f"steps {_num(g('steps_out'), ',')} (last {g('last_step')}, {_num(g('steps_incomplete'), ',')} "
                 f"without every rank), ranks {_ranks(g('ranks'))}")
    if g("records_unannounced") or g("records_unannounced_refused"):
        lines.append(f"records of ranks no hello announced (in their steps, never waited for): "
                     f"{_num(g('records_unannounced'), ',')} of {_num(g('ranks_unannounced'), ',')} rank(s), "
                     f"{_num(g('records_unannounced_refused'), ',')} more refused")
    for name, st in sinks.items():
        st = st if isinstance(st, dict) else {}
        err = f"  last error: {st['last_error']}" if st.get("last_error") else ""
        in_hand = (f" (of them {_num(st['dropped_in_hand'], ',')} in its hands when it was abandoned:"
                   " they may have been written)") if st.get("dropped_in_hand") else ""
        why = st.get("dropped_by_reason") if st.get("dropped") else None
        why = ("  dropped for: " + ", ".join(f"{reason} {_num(n, ',')}" for reason, n in why.items())
               if isinstance(why, dict) and why else "")
        lines.append(f"sink {name:<12} written {_num(st.get('written'), ','):>9}  dropped "
                     f"{_num(st.get('dropped'), ','):>7}{in_hand}  errors {_num(st.get('errors'), ',')}{why}{err}")
    log_dir = g("log_dir")
    if isinstance(log_dir, str):
        lines.append(f"files: {log_dir} (metrics.jsonl, daemon.log; drain.json: every counter, as --json prints)")
        lines.append(f"next: telemetry report {log_dir}")
    return lines


# The parts of records_lost (sent, never processed), in words.
LOSSES = (("dropped by clients", "records_dropped_by_clients"), ("lost in transit", "records_lost_in_transit"),
          ("shed at intake", "records_shed_at_intake"),
          ("unread at the deadline", "records_unread_at_drain"), ("failed", "records_failed"))


def _num(v: object, spec: str) -> str:
    return format(v, spec) if is_number(v) else str(v)


def _ranks(ranks: object) -> str:
    """[0, 1, 2, 3, 7] -> "0-3, 7" (a thousand ranks stay one short line)."""
    if not isinstance(ranks, list) or not all(is_int(r) for r in ranks):
        return str(ranks)
    out, ranks = [], sorted(set(ranks))
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(out) if out else "none"
