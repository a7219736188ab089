"""The closing summary run.sh prints: steps, throughput, final loss, records in, drops, goodput
(and goodput.json beside metrics.jsonl).

    python -m telemetry.consumers.summary RUN_DIR/telemetry [--drain-json FILE] [--trainer-rc N]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from telemetry.consumers.daemontotals import DaemonTotals
from telemetry.consumers.drain import problem_lines, read_final, wandb_not_made
from telemetry.consumers.readjsonl import ReadStats, read_records
from telemetry.consumers.runend import FINISH_EVENT, SCRIPT_EXIT_EVENT, how_ended, run_failure
from telemetry.shared.bookkeeping import is_bookkeeping
from telemetry.shared.numbers import is_int, is_number
from telemetry.shared.wandb_keys import REFUSED_EVENT


def summarize(log_dir: Path) -> dict:
    steps: list[int] = []
    losses: list[float] = []
    tps: list[float] = []
    mfu: list[float] = []
    daemon = DaemonTotals()   # across daemon restarts: a resumed run has several
    num_events = 0
    refused: dict[str, int] = {}        # a W&B script's values not logged, by why (wandb/refused)
    loss_key = None
    ends: list[dict] = []               # the ranks' train_end and the launcher's script_exit
    stats = ReadStats()
    for rec in read_records(log_dir, stats):
        kind = rec.get("kind")
        if kind == "metrics" and "rank" not in rec:
            v, step = rec.get("values"), rec.get("step")
            if not isinstance(v, dict) or not is_int(step):   # a hand-made line, not the daemon's
                continue
            steps.append(step)
            if loss_key is None:
                loss_key = _loss_key(v)
            if loss_key in v and is_number(v[loss_key]):
                losses.append(v[loss_key])
            if is_number(v.get("perf/tokens_per_second")) and v["perf/tokens_per_second"]:
                tps.append(v["perf/tokens_per_second"])
            if is_number(v.get("perf/mfu")):
                mfu.append(v["perf/mfu"])
        elif kind == "daemon" and isinstance(rec.get("values"), dict):
            daemon.consume(rec["values"], rec.get("t"))
        elif kind == "event" and not is_bookkeeping(rec.get("name")):
            num_events += 1
            data = rec.get("data")
            if rec.get("name") in (FINISH_EVENT, SCRIPT_EXIT_EVENT):
                ends.append(rec)
            if rec.get("name") == REFUSED_EVENT and isinstance(data, dict) and isinstance(data.get("type"), str):
                n = data.get("count", 1)
                refused[data["type"]] = max(refused.get(data["type"], 0), n if is_int(n) else 1)
    # The first steps include warm-up (allocation, compilation): the median of the rest.
    steady = tps[len(tps) // 5:] or tps
    return {
        "num_steps": len(set(steps)),
        "loss_key": loss_key,
        "last_step": max(steps) if steps else None,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "tokens_per_second_median": statistics.median(steady) if steady else None,
        "mfu_median": statistics.median(mfu) if mfu else None,
        "num_events": num_events,
        "wandb_refused": refused,
        "daemon": daemon,
        "num_unreadable": stats.num_bad + stats.num_torn,
        # The run's own failure (a rank's train_end) is said even when the script exited 0: a
        # driver whose trial raised in a child process exits 0, and its W&B run records the failure.
        "ended": how_ended(ends) if run_failure(ends) is not None else "",
    }


def _loss_key(values: dict) -> str | None:
    """The step's loss: the trainer's `train/loss`, else a script's own name for it (the
    shortest key whose last part names a loss: "loss", "train_loss", "train/loss_step")."""
    if "train/loss" in values:
        return "train/loss"
    named = [k for k in values if "loss" in k.rsplit("/", 1)[-1].lower() and "val" not in k.lower()]
    return min(named, key=lambda k: (len(k), k)) if named else None


def _fmt(x, spec: str = "") -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log_dir", type=Path)
    p.add_argument("--drain-json", type=Path, help="the final counters from `telemetry drain`")
    p.add_argument("--trainer-rc", type=int)
    args = p.parse_args(argv)
    if not (args.log_dir / "metrics.jsonl").exists():
        print(f"summary: no metrics.jsonl in {args.log_dir}", file=sys.stderr)
        return 1
    s = summarize(args.log_dir)
    final = {}
    run_totals = {}
    wandb_sink: dict = {}
    drained, drain_unread = read_final(args.drain_json) if args.drain_json else ({}, "")
    if drained:
        # The last daemon's final counters, under their record names.
        final = {"telemetry/records_in": drained.get("records_in"),
                 "telemetry/records_lost": drained.get("records_lost"),
                 # What the sinks dropped after the daemon's last counter record (the W&B run's
                 # finish, a late row): only the final counters have it.
                 "telemetry/sink_dropped": drained.get("sink_dropped")}
        # The whole run's, across the daemons that served it one after another (a restart): a
        # daemon killed before its first counter record left none in metrics.jsonl.
        run_totals = drained.get("run") if isinstance(drained.get("run"), dict) else {}
        sinks = drained.get("sinks")
        wandb_sink = sinks.get("wandb") if isinstance(sinks, dict) and isinstance(sinks.get("wandb"), dict) else {}
    totals = s["daemon"].totals(final)
    for key in ("records_in", "records_lost"):
        if isinstance(run_totals.get(key), int):
            totals[f"telemetry/{key}"] = run_totals[key]
    s["records_in"] = totals.get("telemetry/records_in")
    s["dropped"] = totals.get("telemetry/records_lost")
    s["sink_dropped"] = totals.get("telemetry/sink_dropped")
    print("=" * 72)
    print(f"run summary ({args.log_dir})")
    print(f"  steps logged       {s['num_steps']} (last step {_fmt(s['last_step'])})")
    loss = f"loss ({s['loss_key']})" if s["loss_key"] not in (None, "train/loss") else "loss"
    print(f"  {loss:<18} {_fmt(s['first_loss'], '.4f')} -> {_fmt(s['final_loss'], '.4f')}")
    print(f"  tokens/s (median)  {_fmt(s['tokens_per_second_median'], ',.0f')}")
    if s["mfu_median"] is not None:
        print(f"  MFU (median)       {s['mfu_median'] * 100:.2f} %")
    print(f"  records in         {_fmt(s['records_in'])}"
          + (f"  (over {s['daemon'].num_daemons} daemon runs)" if s["daemon"].num_daemons > 1 else ""))
    print(f"  records dropped    {_fmt(s['dropped'])}  (sink drops {_fmt(s['sink_dropped'])})")
    print(f"  events             {s['num_events']}")
    not_made = wandb_not_made({"sinks": {"wandb": wandb_sink}})
    if not_made:
        # The W&B run the user expects does not exist: said in the summary whatever else was quiet.
        print(f"  W&B run            NOT MADE: {not_made}")
    if s["wandb_refused"]:
        # The script's values the drop-in could not log (said once each as they came).
        print("  not logged to W&B  " + "; ".join(f"{_fmt(n)} {why}" for why, n in s["wandb_refused"].items()))
    refused = [f"{_fmt(drained[k])} {words}" for k, words in
               (("records_malformed", "records not of the protocol (refused whole)"),
                ("values_refused", "values refused alone (the rest of their rows kept)")) if drained.get(k)]
    if refused:
        print(f"  refused            {'; '.join(refused)} (telemetry status --json: by reason)")
    for line in problem_lines(drained, with_wandb=False):
        # Lost, unread or closed short at the drain: said here, not only in drain.json.
        print(f"  at the drain       {line}")
    if drain_unread:
        print(f"  at the drain       {args.drain_json.name} could not be read: {drain_unread}; "
              "the daemon's final counters are not in this summary")
    if s["num_unreadable"]:
        print(f"  unreadable lines   {s['num_unreadable']} skipped (not records, or a torn last line)")
    _goodput(args.log_dir)
    if s["ended"]:
        print(f"  ended              {s['ended']}")
    if args.trainer_rc is not None:
        print(f"  trainer exit code  {args.trainer_rc}")
    print("=" * 72)
    return 0


def _goodput(log_dir: Path) -> None:
    """The goodput ledger's line, and goodput.json beside metrics.jsonl (telemetry goodput RUN_DIR
    prints the whole breakdown)."""
    from telemetry.consumers.goodput import BUCKETS, ledger, with_ranks_file
    from telemetry.shared import files

    led = with_ranks_file(ledger(read_records(log_dir)), log_dir)
    if not led.get("wall_s"):
        return
    b = led["buckets_s"]
    top = max((k for k in BUCKETS if k not in ("productive", "excluded")), key=lambda k: b[k])   # excluded: planned, no loss
    print(f"  goodput            {100 * led['goodput']:.1f} % of {led['wall_s']:,.1f} s (biggest loss: {top}, "
          f"{b[top]:,.1f} s; telemetry goodput for the rest)")
    try:
        files.write_file(log_dir / "goodput.json", (json.dumps(led, indent=1) + "\n").encode())
    except OSError as exc:
        print(f"  goodput.json       not written: {exc.strerror or exc}")


if __name__ == "__main__":
    sys.exit(main())
