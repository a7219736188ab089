"""Replay a run's metrics.jsonl into Weights & Biases (upload after an offline or network-less run).

    telemetry replay RUN_DIR [--wandb online|offline] [--project P] [--entity E] [--run-id ID]

The W&B run is the one the daemon's live sink uses for this run dir (its id is kept in
<telemetry dir>/wandb_run_id, else derived the same way), opened with resume="allow", and
logged in the sink's shape: aggregated metrics per step against `train/step`, GPU and host
records at the step they followed, the ranks' hello info as the run config, events as a table.

Idempotent by step. A replay records the last step it logged, per W&B mode and run id, in
<telemetry dir>/wandb_replay.json; when nothing is new no W&B run is opened at all.

Online, the resumed run's summary (`train/step`, fetched from the server on resume) is consulted
too, so a run filled by the live sink or another machine is not filled twice; re-running after
the training went on uploads only the new steps.

Offline, one directory per run id: `wandb sync <telemetry dir>/wandb` uploads every offline run
directory in it, and two with the same id (the live sink's and a replay's, or two replays')
would upload the same steps twice. So an offline replay writes the whole run from
metrics.jsonl (the source of truth: everything the live sink had, and what it missed) into one
new directory, and moves the older directories of the same run id out of the way, into
<telemetry dir>/wandb-superseded/ (kept, never deleted). A directory whose run was not finished
(no exit record) and was written to in the last LIVE_WRITE_S seconds belongs to a daemon still
running: it is left where it is, with a warning.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from telemetry.shared.config import WANDB_PROJECT_FORBIDDEN, WANDB_RUN_ID_FORBIDDEN
from telemetry.shared.wandb_keys import NESTED_EVENT, nest, usable_path

STATE_FILE = "wandb_replay.json"
SUPERSEDED_DIR = "wandb-superseded"
# A W&B offline directory touched this recently is still being written by a live daemon.
LIVE_WRITE_S = 30.0
# W&B's service process writes a finished run's last records a moment after run.finish().
FINISH_FLUSH_S = 10.0
# Records per W&B log call are one row each; this only paces progress output.
PROGRESS_EVERY = 5000


def _wandb_name(what: str, forbidden: str, max_chars: int):
    """An argparse `type=` for a W&B name flag: what W&B itself would refuse (with a traceback,
    after set-up: a run id with "/", one too long for a file name) is one line and exit 2 here,
    and an empty value is an error, not the default."""
    from telemetry.shared.config import wandb_name_problem

    def check(text: str) -> str:
        why = wandb_name_problem(text, what, forbidden, max_chars)
        if why:
            raise argparse.ArgumentTypeError(why)
        return text
    check.__name__ = "wandb_name"
    return check


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="run dir holding telemetry/metrics.jsonl, or the telemetry dir")
    p.add_argument("--wandb", choices=("online", "offline"), default="online", help="W&B mode (default online)")
    p.add_argument("--project", default=None, type=_wandb_name("W&B project", WANDB_PROJECT_FORBIDDEN, 128),
                   help="W&B project (default $WANDB_PROJECT, else 'telemetry')")
    p.add_argument("--entity", default=None, type=_wandb_name("W&B entity", WANDB_PROJECT_FORBIDDEN, 128),
                   help="W&B entity (default: yours)")
    p.add_argument("--run-id", default=None, type=_wandb_name("W&B run id", WANDB_RUN_ID_FORBIDDEN, 128),
                   help="W&B run id (default: the live sink's id for this run dir)")
    p.add_argument("--run-name", default=None, type=_wandb_name("W&B run name", "", 1024),
                   help="W&B run name (default: from the hello records, else the dir)")


def run_id_for(log_dir: Path, run_name: str) -> str:
    """The live sink's W&B run id for this log dir: the one it wrote down, else the same derivation."""
    from telemetry.shared import files
    from telemetry.shared.wandb_ids import stable_run_id

    text = files.read_small(log_dir / "wandb_run_id").strip()
    if text:
        return text
    return stable_run_id(run_name + ":" + str(log_dir.resolve()))


def _load_state(log_dir: Path) -> dict:
    from telemetry.shared import files

    try:
        state = json.loads(files.read_small(log_dir / STATE_FILE) or "{}")
        return state if isinstance(state, dict) else {}
    except (ValueError, RecursionError):   # not JSON, or nested past json's recursion limit
        return {}


def _save_state(log_dir: Path, state: dict) -> None:
    from telemetry.shared import files

    # atomic (a crash leaves the old mark, never half a file), private, never through a link
    files.write_file(log_dir / STATE_FILE, (json.dumps(state, indent=1) + "\n").encode())


def plan(records: Any, after_step: int) -> tuple[list[tuple[int, dict]], list[dict], dict, list[dict]]:
    """Split a run's records into W&B rows after `after_step`.

    Returns (rows, hellos, config, events): rows are (step, values) in file order, where GPU,
    host and daemon records take the step of the last aggregated metrics record before them. A
    drop-in rank's keys are at their W&B keys, as the live sink logs them, from the paths its
    "wandb/nested" events gave (before the values that use them): "a/b" of a nested
    {"a": {"b": v}} nested again, a flat "a/b" it named "a/b#2" back at "a/b".
    """
    rows: list[tuple[int, dict]] = []
    events: list[dict] = []
    config: dict = {}
    hellos: list[dict] = []
    paths: dict[str, list[str]] = {}
    cur = -1
    for rec in records:
        kind = rec.get("kind")
        values = rec.get("values") if isinstance(rec.get("values"), dict) else None
        if kind == "event" and rec.get("name") == NESTED_EVENT:
            data = rec.get("data")
            given = data.get("paths") if isinstance(data, dict) else None
            if isinstance(given, dict):
                paths.update((k, p) for k, p in given.items() if usable_path(p))
            continue
        if kind == "metrics" and "rank" not in rec and isinstance(rec.get("step"), int):
            cur = max(cur, rec["step"])
            if rec["step"] > after_step and values:
                rows.append((rec["step"], nest(values, paths) if paths else values))
        elif kind in ("gpu", "system", "daemon") and values and cur > after_step:
            if kind == "gpu":
                values = {k.replace("gpu/", f"gpu{rec.get('gpu', 0)}/", 1): v for k, v in values.items()}
            rows.append((cur, values))
        elif kind == "event" and max(cur, 0) > after_step:
            events.append(rec)
        elif kind == "hello" and isinstance(rec.get("info"), dict):
            hellos.append(rec)
            for k, v in rec["info"].items():
                config.setdefault(k, v)
    return rows, hellos, config, events


def replay(run_dir: str | Path, mode: str = "online", project: str | None = None, entity: str | None = None,
           run_id: str | None = None, run_name: str | None = None, out: Any = None) -> dict[str, Any]:
    """Replay into W&B; return {"run_id", "mode", "rows", "steps", "skipped_through", "last_step",
    "superseded", "unreadable_lines"}. Progress goes to `out` (default: sys.stdout at the time of the call)."""
    out = out if out is not None else sys.stdout
    from telemetry.consumers.readjsonl import ReadStats, find_log_dir, read_records, run_dir_of
    from telemetry.consumers.report import collect
    from telemetry.consumers.report import run_name as name_of

    log_dir = find_log_dir(run_dir)
    if run_name is None:
        run_name = name_of(collect(r for r in read_records(log_dir) if r.get("kind") == "hello"),
                           run_dir_of(log_dir).name)
    run_id = run_id or run_id_for(log_dir, run_name)
    state = _load_state(log_dir)
    key = f"{mode}:{run_id}"
    done = int(state.get(key, {}).get("last_step", -1))
    stats = ReadStats()
    rows, _, config, events = plan(read_records(log_dir, stats), done)
    result = {"run_id": run_id, "mode": mode, "rows": 0, "steps": 0, "skipped_through": done, "last_step": done,
              "superseded": [], "unreadable_lines": stats.num_bad + stats.num_torn}
    # Lines that are not records (a damaged or hand-made file) are skipped, and said.
    unreadable = f"; {result['unreadable_lines']} unreadable line(s) skipped" if result["unreadable_lines"] else ""
    if not rows:
        print(f"replay: nothing new for W&B run {run_id} ({mode}); steps up to {done} were replayed before"
              f"{unreadable}", file=out)
        return result
    if mode == "offline":
        # Something is new: the whole run goes into one new directory (see the module docstring).
        rows, _, config, events = plan(read_records(log_dir), -1)
        done = -1

    import wandb  # lazy: a slow import, and only when there is something to send

    t0 = time.monotonic()
    run = wandb.init(mode=mode, project=project or os.environ.get("WANDB_PROJECT") or "telemetry", entity=entity,
                     name=run_name, id=run_id, resume="allow", dir=str(log_dir), reinit="create_new",
                     settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    try:
        # Online, the resumed run knows how far it already got (from the live sink or an
        # earlier replay on another machine); offline it knows nothing and the state file rules.
        server_step = run.summary.get("train/step") if mode == "online" else None
        if isinstance(server_step, (int, float)) and server_step > done:
            done = int(server_step)
            rows = [(s, v) for s, v in rows if s > done]
        run.define_metric("train/step")
        run.define_metric("*", step_metric="train/step")
        if config:
            run.config.update(config, allow_val_change=True)
        steps = set()
        for i, (step, values) in enumerate(rows):
            run.log({"train/step": step, **values})
            steps.add(step)
            if i and i % PROGRESS_EVERY == 0:
                print(f"replay: {i}/{len(rows)} rows", file=out)
        if events:
            cols = ["t", "rank", "name", "message", "data"]
            table = wandb.Table(columns=cols)
            for ev in events:
                data = ev.get("data") if isinstance(ev.get("data"), dict) else {}
                table.add_data(ev.get("t"), ev.get("rank"), ev.get("name"), str(data.get("message", "")),
                               json.dumps(data))
            run.log({"telemetry/events": table, "train/step": max(steps) if steps else done})
        last = max(steps) if steps else done
        run_files_dir = Path(run.dir)
    finally:
        run.finish()
    if mode == "offline":
        result["superseded"] = supersede_offline_dirs(log_dir, run_id, keep=run_files_dir.parent, out=out)
    state[key] = {"last_step": last, "rows": int(state.get(key, {}).get("rows", 0)) + len(rows),
                  "updated": time.time()}
    _save_state(log_dir, state)
    result.update(rows=len(rows), steps=len(steps), skipped_through=done, last_step=last)
    print(f"replay: {len(rows)} rows ({len(steps)} steps, {min(steps, default=last)}..{last}) into W&B run {run_id} "
          f"({mode}) in {time.monotonic() - t0:.1f} s{unreadable}", file=out)
    return result


def _finishes_soon(run_dir: Path, is_finished: Any) -> bool:
    """Whether a recently written offline run is finished, allowing W&B's service process the
    moments it takes to write the exit record after run.finish() returned."""
    deadline = time.monotonic() + FINISH_FLUSH_S
    while not is_finished(run_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def supersede_offline_dirs(log_dir: Path, run_id: str, keep: Path, out: Any = None) -> list[Path]:
    """Move the offline W&B directories of `run_id` other than `keep` to wandb-superseded/.

    Returns where they went. One still being written (a live daemon's) stays, with a warning.
    """
    from telemetry.consumers.wandb_offline import is_finished

    out = out if out is not None else sys.stdout
    moved = []
    wandb_dir = log_dir / "wandb"
    for d in sorted(wandb_dir.glob(f"offline-run-*-{run_id}")):
        if not d.is_dir() or d.resolve() == keep.resolve():
            continue
        newest = max((p.stat().st_mtime for p in d.rglob("*") if p.is_file()), default=d.stat().st_mtime)
        if time.time() - newest < LIVE_WRITE_S and not _finishes_soon(d, is_finished):
            print(f"replay: warning: {d} was written {time.time() - newest:.0f} s ago (a daemon still running?); "
                  f"left in place: sync only {keep} for this run", file=out)
            continue
        dest_dir = log_dir / SUPERSEDED_DIR
        dest_dir.mkdir(exist_ok=True)
        dest = dest_dir / d.name
        os.replace(d, dest)
        moved.append(dest)
    if moved:
        print(f"replay: {len(moved)} older offline director{'y' if len(moved) == 1 else 'ies'} of run {run_id} "
              f"moved to {log_dir / SUPERSEDED_DIR} (the new one holds the whole run): wandb sync {wandb_dir} "
              "uploads it once", file=out)
    return moved


def run(args: argparse.Namespace) -> int:
    from telemetry.consumers.readjsonl import Unreadable, find_log_dir
    from telemetry.shared import files

    if not os.path.exists(args.run_dir):   # a typo is bad input (2), and so is a directory with no run
        print(f"telemetry replay: {args.run_dir or repr(args.run_dir)}: no such file or directory", file=sys.stderr)
        return 2
    try:
        log_dir = find_log_dir(args.run_dir)
    except (FileNotFoundError, Unreadable) as exc:
        print(f"telemetry replay: {exc}", file=sys.stderr)
        return 2
    files.apply_like(log_dir)    # its W&B directory and marks are as private as the run it reads
    try:
        replay(args.run_dir, args.wandb, args.project, args.entity, args.run_id, args.run_name)
    except FileNotFoundError as exc:     # the run's files gone while it read them
        print(f"telemetry replay: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        said = _wandb_refusal(exc)
        if said is None:
            raise
        rc, line = said
        print(f"telemetry replay: {line}", file=sys.stderr)
        return rc
    return 0


def _wandb_refusal(exc: Exception) -> tuple[int, str] | None:
    """(exit code, the line to say) for an error W&B raised, None for any other. No API key, or
    one W&B refuses, is the user's to fix (2, with how); W&B that cannot be reached, or that
    failed on its side, is 1. W&B's messages run over several lines: one is said."""
    errors = sys.modules.get("wandb.errors")     # imported with wandb: an error of W&B's came from it
    if errors is None or not isinstance(exc, errors.Error):
        return None
    from telemetry.consumers.terminal import printable

    why = printable(" ".join(str(exc).split())) or type(exc).__name__
    if isinstance(exc, (errors.UsageError, errors.AuthenticationError)):
        return 2, f"W&B refused: {why} (or --wandb offline, then `wandb sync`)"
    return 1, f"W&B failed: {why}"
