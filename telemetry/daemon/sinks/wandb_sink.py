"""Weights & Biases, in the daemon only: the training processes never import wandb.

One W&B run per training run: its id is derived from the run name and kept in the log dir, and
`resume="allow"`, so a restarted daemon continues the same run. `wandb` is imported on this
sink's thread at start (a slow import), never on the daemon's. The run's config comes from the
ranks' hello records. `finish()` gets a deadline: an unreachable server must not hold up the
daemon's exit (offline data stays on disk; `telemetry replay` or `wandb sync` uploads it later).
After the finish, the end of the offline run's file is read: W&B's writer says a failed write
(the disk full) only in its own log, and a file without the run's end is said here
(`write_failed`, telemetry/daemon/sinks/wandb_runfile.py).

Two kinds of run:
- **The user's run** (a script's `wandb.init` through telemetry.wandb, the HF callback, the
  Lightning logger, the Accelerate tracker: a hello with a "wandb" map): the run W&B itself would
  have made. Its id is the one the script's run has (`run.id`); its name is the one given, else
  W&B's; each aggregated step is logged at its own W&B step (`run.log(values, step=s)`), so
  `_step` in the history is the script's step and history, summary and define_metric are as in
  W&B; the daemon's host, GPU and telemetry series go to W&B's system metrics (stats records, the
  run's System section: "gpu.0.util", "cpu_percent", "telemetry/records_in"), never into the
  script's history or summary; text values (a "wandb/values" event) join the row of their step;
  the script's console output (a "wandb/console" event) is the run's console log (W&B's Logs);
  the run finishes with the script's exit code (see WandbSink.exit_code), as W&B records it.
- **The daemon's run** (our trainer, a bare client): every series against `train/step`.

A training script that uses `telemetry.wandb` names its run in `wandb.init(project=, name=,
config=, group=, tags=, ...)`: that reaches this sink as the "wandb" map of a hello. So the run
is opened when the first such hello arrives, or with the daemon's own settings at the first
aggregated step (a trainer that says nothing of W&B), or at close; the records before that
(pollers start before training does) wait, up to MAX_WAITING, and beyond are dropped and
counted. With an init's hello, the run config is the init's config (flat, as in W&B) and nothing
else. `run.summary[...]`
set in a rank arrives as a "wandb/summary" event and is set on the run's summary. Keys a rank
flattened from nested dicts ("a/b", the records' flat names) are nested again as W&B keeps
them, from the paths a "wandb/nested" event gave; so is a flat key the rank named apart from a
nested one of the same name ("a/b#2": the path ["a/b"], W&B's key "a/b"). A
`wandb.Image`, `wandb.Histogram`, `wandb.Table`, `wandb.Html` or `wandb.Audio` (or a long list
or numpy array value, logged as the value itself) logged in a rank arrives as a "wandb/media"
event naming a file in the media directory (telemetry/shared/media.py): the sink waits for the
file (up to media_keeper.MEDIA_WAIT_S), logs the W&B object built from it at the event's step as
a row of its own, and releases the file (the last of its readers, this sink and the daemon's
media keeper, deletes it: telemetry/daemon/media_keeper.py); a file that never came or cannot be
read is counted (`media_failed`) and named once in the daemon's log. A "wandb/call" event is a
W&B call the script made that the daemon's run makes for it (`log_artifact`, `log_model`, `save`,
`log_code`, `alert`, `mark_preempting`: telemetry/integrations/wandb_calls.py), from the files
staged in the media directory's `staged` folder; one that fails is counted (`calls_failed`) and
named once in the daemon's log.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from protocol.constants import CLIENT_TIME_KEY as OWN_TIME_KEY
from telemetry.daemon.derived import DERIVED_KEYS
from telemetry.daemon.sinks.base import Out, Sink
from telemetry.shared import files
from telemetry.shared.bookkeeping import SUMMARY_REMOVE_EVENT, summary_paths
from telemetry.daemon.media_keeper import MediaFiles, event_files, num_bins
from telemetry.shared import media as shared_media
from telemetry.shared.wandb_ids import fallback_files_dirs, stable_run_id
from telemetry.shared.numbers import is_int
from telemetry.shared.wandb_keys import MAX_NESTED_DEPTH, NESTED_EVENT, nest

log = logging.getLogger("telemetry.daemon.sinks.wandb")

MODES = ("disabled", "offline", "online")
FINISH_TIMEOUT_S = 30.0
PHASE_ALLOWANCE_S = 60.0
# Hello keys that describe one process, not the run: they stay out of the run config.
PER_PROCESS_KEYS = frozenset({"pid", "src", "rank", "local_rank", "host"})
_MISSING = object()
# Records held while the run is not open yet (see the module docstring).
MAX_WAITING = 10_000
MEDIA_READER = "wandb"          # its name among the media files' readers (media_keeper.MediaFiles)
# What a telemetry.wandb init may name, as wandb.init's keyword arguments (text; tags a list).
INIT_KEYS = ("project", "name", "entity", "group", "notes", "job_type", "id")
# The script's metadata W&B takes as settings (what W&B records of the process that made the run).
META_SETTINGS = ("program", "program_relpath", "program_abspath", "host")
SUMMARY_EVENT = "wandb/summary"                 # {key: value}: run.summary set in a rank
# Just before a rank's summary event: {"step": s, "replace": [[key, ...], ...]}: it is taken after
# the rank's rows up to s, each path's value replaced (without one, from an older rank: at once,
# each key set whole).
SUMMARY_AT_EVENT = "wandb/summary_at"
VALUES_EVENT = "wandb/values"        # {"step": s, "values": {key: text}}: values W&B keeps that are not numbers
CALL_EVENT = "wandb/call"            # {"call": ..., "args": {...}, "dir": staged name}: wandb_calls.py
# How long a call waits for the directory of files it names (staged by a rank, renamed when whole).
STAGED_WAIT_S = 60.0
CONSOLE_EVENT = "wandb/console"      # {"stream": "stdout"|"stderr", "text": ...}: the script's console output
FINISH_EVENT = "train_end"           # {"exit_code": N, ...}: a rank finished its run (telemetry.wandb's finish)
SCRIPT_EXIT_EVENT = "script_exit"    # {"exit_code": N}: the script's, from a drain request (daemon/shutdown.py)
# The daemon's own: a rank's process gone without its bye, {"exited_rank": R, "exit_code": its
# code, or minus the signal that killed it, or None: unknown} (daemon/forensics/stage.py).
RANK_EXITED_EVENT = "diagnosis/rank_exited"
# Hellos of runs whose finish always sends FINISH_EVENT (telemetry.wandb's Run: wandb.finish, the
# exit hook, the Accelerate tracker): such a rank that never sent it was killed, and its run ends
# with UNFINISHED_EXIT_CODE when no launcher says the script's code (W&B offline then writes no
# exit record at all: its server shows the run as crashed).
FINISH_FRAMEWORKS = ("wandb", "accelerate")
UNFINISHED_EXIT_CODE = 1
# Media and text events held for their step (see WandbSink._at_its_step); beyond, logged at once.
MAX_HELD_EVENTS = 10_000
# A step more than this above the last one W&B took (or above 0 for the first) is held back
# until the next step says whether the run really moved there (then both are logged) or it was
# one absurd step (a step of 10^12 among 1..2000: it is counted as dropped, and the steps after
# it still reach W&B, whose x-axis it would otherwise have pushed past all of them). A run
# resumed at step 500k is below it; one resumed further costs one step's delay, nothing else.
MAX_STEP_JUMP = 1_000_000
# After the run's finish, how long W&B's run file is given to show the run's exit record (W&B's
# core may write it a moment after the finish returns) before it is said not to hold the whole
# run, unless W&B's log names the write error that stopped it (WandbSink._check_run_file).
RUN_FILE_WAIT_S = 15.0


def script_meta(meta: object) -> dict:
    """The script process's metadata from an init's hello (telemetry/integrations/wandb_run.py:
    script_meta), the well-typed parts only."""
    if not isinstance(meta, dict):
        return {}
    out = {k: meta[k] for k in META_SETTINGS if isinstance(meta.get(k), str) and meta[k]}
    args = meta.get("args")
    if isinstance(args, list) and all(isinstance(a, str) for a in args):
        out["args"] = args
    return out


def init_kwargs(init: dict) -> dict:
    """The init's names as wandb.init takes them; anything else (wrong types, unknown keys, from
    a hello that is not telemetry.wandb's) is left out rather than fail the run's opening."""
    out = {k: init[k] for k in INIT_KEYS if isinstance(init.get(k), str) and init[k]}
    tags = init.get("tags")
    if isinstance(tags, list) and tags and all(isinstance(t, str) for t in tags):
        out["tags"] = tags
    return out


class WandbSink(Sink):
    name = "wandb"
    # W&B's finish (offline: 1-3 s on a busy host) ends the run with its exit code: under a
    # backlog at the drain, this sink stops taking batches this long before the end (Sink).
    close_reserve_s = 5.0
    # W&B's start (its import, its service's start in `wandb.init`) and its finish take seconds,
    # and tens of seconds on a loaded host: time they take during the drain is added to the
    # drain, up to this (Sink.phase), as the script's own W&B calls would have been waited for.
    phase_allowance_s = PHASE_ALLOWANCE_S
    # The metric names the ranks have sent (the daemon's name catalogue, memory.NameCatalogue:
    # read here, grown by the receiver), set by the daemon; None: every derived name is kept.
    rank_names: set[str] | None = None

    def __init__(self, mode: str, log_dir: str | Path, run_name: str, project: str = "telemetry",
                 entity: str | None = None, finish_timeout_s: float = FINISH_TIMEOUT_S,
                 media_files: MediaFiles | None = None, summaries: list[tuple[str, str]] = ()) -> None:
        """media_files: who else reads the ranks' media files (the daemon's keeper): the last
        reader deletes each; alone by default. summaries: (exact name, W&B summary) for
        the daemon's own run, from the metric catalogue (catalogue.wandb_summaries)."""
        if mode not in MODES:
            raise ValueError(f"wandb mode {mode!r}: expected one of {', '.join(MODES)}")
        self.mode = mode
        self._redactor = None                 # for text that came as a file (_log_media), made when first needed
        self.log_dir = Path(log_dir)
        self.run_name = run_name
        self.project = project
        self.entity = entity
        self.finish_timeout_s = finish_timeout_s
        self.summaries = list(summaries)
        self.run = None
        self.run_id = ""
        # Whether W&B's run was made, and why not while it is not: read by `telemetry run`
        # (status, drain.json) to say it, as a failed W&B run must never pass unseen.
        self.opened = False
        self.open_error = ""
        self.phase = "starting"               # until start() returns; again while _open runs (Sink.phase)
        self.num_logged = 0
        self._last_step = -1
        self._hellos: dict[int, dict] = {}
        self._config: dict = {}
        self._init: dict | None = None        # the "wandb" map of the lowest rank's init hello
        self._init_rank: int | None = None    # that rank: the user's run is its run
        self._metric_defs: set[str] = set()
        # Summary changes and define_metric calls made after the rows up to a step, waiting for
        # them (_after_its_rows): (step, apply, data).
        self._after_rows: list[tuple] = []
        self._summary_at: dict[int, dict] = {}   # by rank: the summary_at event for its next summary event
        self._uncommitted = False           # a row logged with its step, not committed yet
        self._waiting: list[Out] = []
        self._hellos_before_open = 0          # hellos taken (their config) while no run was open
        self.num_dropped_waiting = 0
        self.num_nested_refused = 0       # wandb/nested paths deeper than MAX_NESTED_DEPTH: their keys stay flat
        self._nested: dict[str, list[str]] = {}   # flat key -> its path, from wandb/nested events
        self.num_media_logged = 0
        self.num_media_failed = 0
        self.num_calls = 0
        self._run_attrs: dict = {}           # name, notes, tags the W&B run has (see _update_run_attrs)
        self.num_calls_failed = 0
        self.media_files = media_files if media_files is not None else MediaFiles((MEDIA_READER,))
        self._wandb = None
        self._stats = None                    # W&B's system-metrics writer of the open run (the user's run)
        self._held: list[tuple] = []          # media and text events of steps W&B has not reached
        self.num_console = 0                  # console writes passed to the run
        self._suspect: dict | None = None     # an aggregated step past MAX_STEP_JUMP, held back
        self._finished_ranks: dict[int, int] = {}   # rank -> the exit code its run finished with
        self._script_exit: int | None = None          # the launcher's (a drain request's)
        self._died: dict[int, int] = {}               # rank -> its shell code, gone without a bye, not 0; in that order
        # Records not given to W&B, by reason; their sum is this sink's num_dropped (see Sink).
        self.dropped_by_reason: dict[str, int] = {}
        self.num_files_unsaved = 0    # of the script's run.dir files W&B could not take (_save_fallback_files)
        # The offline run's file (W&B's transaction log) and W&B's core log, read after the finish
        # (_check_run_file); write_failed: what that found when the file does not hold the whole run.
        self._run_file: str | None = None
        self._core_log: str | None = None
        self.write_failed: dict | None = None

    def start(self) -> None:
        # A W&B service inherited through the environment (WANDB_SERVICE: the daemon started by a
        # process that had run wandb itself) would write this run's files with that process's
        # umask, not the daemon's private one, and end when that process does: start our own.
        os.environ.pop("WANDB_SERVICE", None)
        try:
            import wandb  # lazy: a slow import, on this sink's thread
        except BaseException:
            self.media_files.drop_reader(MEDIA_READER)    # it will read no media file: not waited for
            raise
        finally:
            self.phase = ""

        self._wandb = wandb
        from telemetry.integrations.wandb_calls import delete_stale_stages

        delete_stale_stages()            # the staged files of calls nobody will make (their writer gone)

    def _open(self) -> bool:
        """Open the W&B run: with the init's settings when a telemetry.wandb hello named them.
        False when W&B refused it (open_error says why)."""
        wandb = self._wandb
        init = init_kwargs(self._init or {})
        id_file = self.log_dir / "wandb_run_id"
        kept = files.read_small(id_file, 4096).strip()   # a FIFO or /dev/zero there: not read
        if init.get("id"):
            self.run_id = str(init["id"])
        elif kept:
            self.run_id = kept
        else:
            self.run_id = stable_run_id(self.run_name + ":" + str(self.log_dir.resolve()))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        files.write_file(id_file, (self.run_id + "\n").encode())   # the run-file mode (0600)
        kwargs = {k: init[k] for k in ("group", "tags", "notes", "job_type") if k in init}
        user = self._init is not None
        # The user's run has the name the script gave, else none (W&B names it: offline, None).
        name = init.get("name") if user else self.run_name
        meta = script_meta(self._init.get("meta")) if user else {}
        settings = {k: meta[k] for k in META_SETTINGS if k in meta}
        root = self._files_root(self._init.get("dir")) if user else None
        # W&B takes the run's args from sys.argv when the run starts (no setting names them):
        # the script's, for that moment, on this thread (nothing else in the daemon reads argv).
        argv = sys.argv
        if "args" in meta:
            sys.argv = [meta.get("program") or argv[0], *meta["args"]]
        self.phase = "starting"
        try:
            self.run = wandb.init(mode=self.mode, project=init.get("project") or self.project,
                                  entity=init.get("entity") or self.entity, name=name,
                                  id=self.run_id, resume="allow", dir=root or str(self.log_dir), reinit="create_new",
                                  settings=wandb.Settings(silent=True, console="off", x_disable_stats=True,
                                                          **settings), **kwargs)
        except Exception as exc:
            # Not tried again (each try can take as long as W&B's init timeout, while the queue
            # behind it fills): what waited for the run, and what comes after, is counted.
            self.open_error = repr(exc) or type(exc).__name__
            log.error("wandb: the W&B run could not be made, and is not tried again: %r", exc)
            lost = len(self._waiting) + self._hellos_before_open    # the hellos' config too
            self._waiting, self._hellos_before_open = [], 0
            if lost:
                self._drop_no_run(lost)
            return False
        finally:
            sys.argv = argv
            self.phase = ""
        self.opened, self.open_error = True, ""
        if self.mode == "offline":
            try:
                self._run_file, self._core_log = self.run.settings.sync_file, self.run.settings.log_internal
            except Exception as exc:      # W&B's settings, looked up, never assumed
                log.warning("wandb: the run's file is not known (%r): whether W&B wrote it whole is not checked", exc)
        if user:
            self._stats = _stats_writer(self.run)
        else:
            # Steps are training steps; host and GPU records follow wall time. The catalogue's
            # summaries, exact names (an exact definition wins over the "*" glob).
            self.run.define_metric("train/step")
            for name, summary in self.summaries:
                try:
                    self.run.define_metric(name, step_metric="train/step", summary=summary)
                except Exception as exc:
                    self._drop("define_metric", "define_metric(%r, summary=%r) refused by W&B: %s" % (name, summary, exc))
            self.run.define_metric("*", step_metric="train/step")
        self._run_attrs = {k: init[k] for k in ("name", "notes", "tags") if k in init and user}
        self._update_config()
        waiting, self._waiting = self._waiting, []
        self._consume(waiting)
        return True

    def _files_root(self, root: object) -> str | None:
        """The directory the script asked W&B's files to go to (its `dir`, $WANDB_DIR; the rank
        made it), when it is an absolute path this daemon can read and write; else None (the
        run directory), said once in the log."""
        if root is None:
            return None
        if isinstance(root, str) and os.path.isabs(root) and os.path.isdir(root) \
                and os.access(root, os.W_OK | os.R_OK | os.X_OK):
            return root
        log.warning("wandb: the script's W&B directory %r cannot be used by the daemon: W&B's files go to %s",
                    str(root)[:300], self.log_dir)
        return None

    def consume(self, batch: list[Out]) -> None:
        if self.open_error:      # W&B refused the run (_open): not asked again
            self._drop_no_run(len(batch))
            return
        if self.run is None:
            for i, o in enumerate(batch):
                if o.kind == "hello":
                    self._note_hello(o.record.get("rank", 0), o.record.get("info") or {})
                    self._hellos_before_open += 1
                    if self._init is not None:
                        self._then(self._open(), batch[i + 1:])
                        return
                elif o.kind == "metrics" and "rank" not in o.record:
                    self._then(self._open(), batch[i:])
                    return
                elif len(self._waiting) < MAX_WAITING:
                    self._waiting.append(o)
                else:
                    self.num_dropped_waiting += 1
                    self._drop("waiting_for_run", "more than %d records before the run could open" % MAX_WAITING)
            return
        self._consume(batch)

    def _then(self, opened: bool, rest: list[Out]) -> None:
        """The rest of a batch after the run's opening: logged, or counted (no run)."""
        if opened:
            self._consume(rest)
        elif rest:
            self._drop_no_run(len(rest))

    def _drop_no_run(self, count: int) -> None:
        """`count` records for a run W&B refused to make (open_error): counted, reason no_run."""
        self._drop("no_run", "the W&B run could not be made: %s" % self.open_error, count)

    def _consume(self, batch: list[Out]) -> None:
        for i, o in enumerate(batch):
            if self.giving_up:       # the drain's deadline: the run's finish first (Sink.giving_up)
                self._drop("drain_deadline", "the drain's deadline came with a backlog W&B had not logged: the run "
                                             "is finished with what it has", len(batch) - i)
                return
            try:
                self._consume_one(o)
            except RecursionError:   # W&B walks nested values recursively: this record alone is lost
                self._drop("too_deep", "a record (%s) nested too deep for W&B to take" % o.kind)

    def _consume_one(self, o: Out) -> None:
        """One record into W&B (a step's row, the system metrics, the config, an event's part)."""
        run = self.run
        kind = o.kind
        rec = o.record
        if kind == "metrics" and "rank" not in rec:
            self._log_step(rec)
        elif kind in ("gpu", "system", "daemon"):
            values = rec["values"]
            if self._init is not None:
                self._log_system(kind, rec)
                return
            if kind == "gpu":
                values = {k.replace("gpu/", f"gpu{rec['gpu']}/", 1): v for k, v in values.items()}
            run.log({"train/step": max(self._last_step, 0), **values})
            self.num_logged += 1
        elif kind == "hello":
            self._note_hello(rec.get("rank", 0), rec.get("info") or {})
            self._update_config()
            self._update_run_attrs()
        elif kind == "event" and isinstance(rec.get("data"), dict):
            name = rec.get("name")
            if name == SUMMARY_EVENT:
                at = self._summary_at.pop(rec.get("rank", 0), None)
                if at is None:
                    run.summary.update(self._nest(rec["data"]))
                else:
                    self._after_its_rows(self._set_summary, {**at, "values": rec["data"]})
            elif name == SUMMARY_AT_EVENT:
                self._summary_at[rec.get("rank", 0)] = rec["data"]
            elif name == SUMMARY_REMOVE_EVENT:
                self._after_its_rows(self._remove_summary, rec["data"])
            elif name == NESTED_EVENT and isinstance(rec["data"].get("paths"), dict):
                self._note_nested(rec["data"]["paths"])
            elif name == shared_media.EVENT:
                self._at_its_step(self._log_media, rec["data"])
            elif name == VALUES_EVENT and self._from_init_rank(rec):
                self._at_its_step(self._log_values, rec["data"])
            elif name == CALL_EVENT and self._init is not None:
                self._call(rec["data"])
            elif name == CONSOLE_EVENT and self._from_init_rank(rec):
                self._log_console(rec["data"])
            elif name in (FINISH_EVENT, SCRIPT_EXIT_EVENT, RANK_EXITED_EVENT):
                self._note_exit(name, rec)

    def _note_exit(self, name: str, rec: dict) -> None:
        """A rank's finish (`train_end` with the exit code its run finished with) or the
        script's exit code as its launcher saw it (`script_exit`, rank-less): see exit_code."""
        code = rec["data"].get("exit_code")
        if type(code) is not int:
            return
        if name == SCRIPT_EXIT_EVENT:
            self._script_exit = code
        elif name == RANK_EXITED_EVENT:
            rank = rec["data"].get("exited_rank")
            if type(rank) is int and code:
                self._died.setdefault(rank, 128 - code if code < 0 else code)
        else:
            self._finished_ranks.setdefault(rec.get("rank", 0), code)

    def exit_code(self) -> int:
        """The exit code the W&B run ends with, as W&B records the script's: the first failure a
        rank finished its run with; else, when a rank that made the run never finished it
        (killed: no exit hook ran), the script's as its launcher saw it (`telemetry run`: 143 for
        SIGTERM). With no launcher to say it (`telemetry run` itself killed, a daemon of one's
        own), the first rank the daemon saw gone without its bye by a failure (137: SIGKILLed),
        or UNFINISHED_EXIT_CODE for a telemetry.wandb run (its finish, at exit too, always says
        how it ended); else 0."""
        failed = [c for r, c in sorted(self._finished_ranks.items()) if c]
        if failed:
            return failed[0]
        inits = [r for r, h in self._hellos.items() if isinstance(h.get("wandb"), dict)]
        unfinished = [r for r in inits or [0] if r not in self._finished_ranks]
        script = self._script_exit
        if script is None and isinstance(self.script_exit, dict) and type(self.script_exit.get("exit_code")) is int:
            # Its record was behind a backlog given up on at the drain (with the ranks' finish
            # before it): the script's exit code, set by the drain (Sink.script_exit).
            script = self.script_exit["exit_code"]
        if script and unfinished:
            return script
        if script is None:
            # In the order they went (the daemon says them so): the first cause, not a rank its
            # launcher ended after it (torchrun SIGTERMs the others once one failed).
            died = [c for r, c in self._died.items() if r not in self._finished_ranks]
            if died:
                return died[0]
            if any(self._hellos.get(r, {}).get("framework") in FINISH_FRAMEWORKS for r in unfinished):
                return UNFINISHED_EXIT_CODE
        return 0

    def _note_nested(self, paths: dict) -> None:
        """The paths a rank gave for its flattened keys; one deeper than MAX_NESTED_DEPTH is not
        taken (its key stays flat, counted in nested_refused): W&B walks a row's nested values
        recursively, and a 5,000-deep one would cost every record of its batch."""
        for k, p in paths.items():
            if not (isinstance(p, list) and p and all(isinstance(x, str) for x in p)):
                continue
            if len(p) > MAX_NESTED_DEPTH:
                self.num_nested_refused += 1
                if self.num_nested_refused == 1:
                    log.warning("wandb: a key nested %d deep is logged flat (counted in nested_refused; logged "
                                "once): at most %d levels", len(p), MAX_NESTED_DEPTH)
                continue
            self._nested[k] = p

    def _at_its_step(self, log_it, data: dict) -> None:
        """Log a media or text event into the row of its step. In the user's run, W&B's step is
        the script's: an event arrives as it is sent, but its step's numbers only once every rank
        has sent them, so an event of a step W&B has not reached yet waits for that step (logged
        first, the later step would make W&B drop the earlier rows still to come)."""
        step = data.get("step")
        if self._init is None or not isinstance(step, int) or step <= self._last_step or \
                len(self._held) >= MAX_HELD_EVENTS:
            log_it(data)
            return
        self._held.append((step, log_it, data))

    def _after_its_rows(self, apply, data: dict) -> None:
        """A summary change or a define_metric made in the script after its rows up to
        data["step"]: taken once W&B has those rows committed, and before any later row, as in
        the script's own run (a row is logged here with its step and committed only when the
        next one is, so a summary value set after it would be overwritten by it). Taken at once
        when no row of that step can still come."""
        step = data.get("step")
        if self._init is None or not is_int(step) or step < 0 or step < self._last_step or \
                len(self._after_rows) >= MAX_HELD_EVENTS:
            apply(data)
            return
        self._after_rows.append((step, apply, data))

    def _take_after_rows(self, up_to: float) -> None:
        """Before the row of step up_to + 1 (or at close): commit the row in hand, then take the
        changes made after the rows up to `up_to`, in the order the script made them."""
        if not any(h[0] <= up_to for h in self._after_rows):
            return
        if self._uncommitted:
            self.run.log({}, commit=True)         # commits the row in hand; writes no row of its own
            self._uncommitted = False
        ready = [h for h in self._after_rows if h[0] <= up_to]
        self._after_rows = [h for h in self._after_rows if h[0] > up_to]
        for _, apply, data in ready:
            apply(data)

    def _release(self, up_to: float) -> None:
        """Log the held events of steps up to `up_to`, in step order."""
        if not self._held:
            return
        ready = sorted((h for h in self._held if h[0] <= up_to), key=lambda h: h[0])
        if ready:
            self._held = [h for h in self._held if h[0] > up_to]
            for _, log_it, data in ready:
                log_it(data)

    def _from_init_rank(self, rec: dict) -> bool:
        """Whether a rank's event belongs to the user's run: the run is the lowest init rank's."""
        return self._init_rank is not None and rec.get("rank", 0) == self._init_rank

    def _log_system(self, kind: str, rec: dict) -> None:
        """A host, GPU or telemetry record of the user's run: W&B's system metrics, as W&B's own
        monitor writes them ("gpu.0.util", "cpu_percent"), never the script's history."""
        values = rec["values"]
        if kind == "gpu":
            values = {f"gpu.{rec['gpu']}." + k.split("/", 1)[-1]: v for k, v in values.items()}
        elif kind == "system":
            values = {k.split("/", 1)[1] if k.startswith("system/") else k: v for k, v in values.items()}
        if self._stats is None:
            self._drop("no_system_metrics", "this wandb has no system-metrics writer (interface.publish_stats): "
                       "the daemon's host, GPU and telemetry series are in the JSONL only")
            return
        self._stats(values)
        self.num_logged += 1

    def _log_values(self, data: dict) -> None:
        """Text values of a step (W&B keeps strings in the history): they join the row of their
        step, which the step's numbers (logged after, by the aggregator) complete."""
        step, values = data.get("step"), data.get("values")
        if not isinstance(step, int) or not isinstance(values, dict) or step < self._last_step:
            self._drop("values_late", "text values of step %r arrived after W&B took a later step" % (step,))
            return
        self.run.log(self._nest({k: v for k, v in values.items() if isinstance(k, str)}), step=step)
        self._uncommitted = True

    def _log_console(self, data: dict) -> None:
        """The script's console output, as W&B's console capture keeps it (its Logs tab)."""
        stream, text = data.get("stream"), data.get("text")
        iface = _interface(self.run)
        if stream not in ("stdout", "stderr") or not isinstance(text, str) or \
                not hasattr(iface, "publish_output_raw"):
            self._drop("console", "console output not kept (malformed, or this wandb cannot take it)")
            return
        iface.publish_output_raw(stream, text)
        self.num_console += 1

    def _log_step(self, rec: dict) -> None:
        """An aggregated step, unless W&B's x-axis cannot take it: a step below the last one it
        took (its charts would go back in time; JSONL keeps everything) is counted as dropped,
        and one far above it is held back as a suspect (MAX_STEP_JUMP), so that a single absurd
        step never makes every later step one that goes back."""
        step = rec["step"]
        suspect = self._suspect
        if suspect is not None:
            self._suspect = None
            if step >= suspect["step"]:           # the run did move there: the suspect was real
                self._log_metrics(suspect)
            else:
                self._drop("step_jump", "step %d jumped more than %d past step %d and the run went on "
                           "below it" % (suspect["step"], MAX_STEP_JUMP, self._last_step))
        if step < self._last_step:
            self._drop("step_backwards", "step %d is below step %d, which W&B already took" % (step, self._last_step))
            return
        if step > max(self._last_step, 0) + MAX_STEP_JUMP:
            self._suspect = rec
            return
        self._log_metrics(rec)

    def _log_metrics(self, rec: dict) -> None:
        step = rec["step"]
        values = rec["values"]
        if self._init is not None and OWN_TIME_KEY in values:
            # The client's own time rides in the script's records; in the user's run it is one
            # of the telemetry series (W&B's system metrics), never the script's history.
            values = dict(values)
            own = values.pop(OWN_TIME_KEY)
            if self._stats is not None:
                self._stats({OWN_TIME_KEY: own})
        if self._init is not None and self.rank_names is not None:
            # What the daemon derived from the script's values (a script that logs perf/step_time
            # gets perf/step_time_max, perf/steps_per_second, ...) is the daemon's series too,
            # unless the script logs that name itself.
            ours = [k for k in values if k in DERIVED_KEYS and k not in self.rank_names]
            if ours:
                derived = {k: values[k] for k in ours}
                values = {k: v for k, v in values.items() if k not in derived}
                if self._stats is not None:
                    self._stats(derived)
        if self._nested:
            values = self._nest(values)
        if self._init is not None:
            self._release(step - 1)               # the events of the steps before it, first
            self._take_after_rows(step - 1)       # then what the script did after those rows
            self.run.log(values, step=step)       # the user's run: W&B's _step is the script's step
            self._uncommitted = True
            self._last_step = step
            self._release(step)                   # those of its own step join its row
        else:
            self._last_step = step
            self.run.log({"train/step": step, **values})
        self.num_logged += 1

    def _drop(self, reason: str, detail: str, count: int = 1) -> None:
        """`count` records W&B will not get: counted (num_dropped, by reason), logged once per reason."""
        n = self.dropped_by_reason.get(reason, 0)
        self.dropped_by_reason[reason] = n + count
        self.num_dropped += count
        if not n:
            log.warning("wandb: not logged (counted in the sink's dropped, reason %s; logged once): %s",
                        reason, detail)

    def _at_local_step(self, step: int) -> None:
        """W&B names a media file after its run's local step (`<key>_<step>_<hash>`), which an
        explicit `step=` moves only once that row is logged; the script's W&B run is at `step`
        when it logs the value: this run is put there too, so the file's name (the history's
        `path`) is the one the script's own W&B would have written."""
        if getattr(self.run, "_local_step", step) < step:
            self.run._local_step = step

    def _set_summary(self, data: dict) -> None:
        """A rank's `run.summary` set (data["values"], data["replace"]): each replaced path (a key set whole, `summary["m"] = {...}`,
        or an edit through a nested value, `summary["m"]["b"] = {...}`) gets the value under it
        anew, as W&B's; any other key from nesting is set at its path inside what the summary
        holds, so that the others under its key stay."""
        replaced = summary_paths(data.get("replace"))
        groups: dict[tuple, dict] = {p: {} for p in replaced}
        for k, v in data["values"].items():
            path = tuple(self._nested.get(k) or (k,))
            whole = next((p for p in replaced if path[:len(p)] == p), None)
            if whole is not None:
                groups[whole][k] = v
            else:
                self._set_at(path, v)
        for path, values in groups.items():
            value: Any = self._nest(values)
            for part in path:
                value = value.get(part, {}) if isinstance(value, dict) else {}
            self._set_at(path, value)

    def _set_at(self, path: tuple, value: Any) -> None:
        """W&B's `summary[path[0]][path[1]]... = value`, the dicts on the way made if missing."""
        node = self.run.summary
        for i, part in enumerate(path[:-1]):
            try:
                child = node[part]
            except KeyError:
                child = None
            if not hasattr(child, "keys"):     # missing, or a value: the rest of the path is new
                for later in reversed(path[i + 1:]):
                    value = {later: value}
                node[part] = value
                return
            node = child
        node[path[-1]] = value

    def _remove_summary(self, data: dict) -> None:
        """`del run.summary[...]` in a rank (data["paths"]): the key (or the nested one at its
        path) goes from the run's summary, as W&B's own (a key not there is no error)."""
        for path in summary_paths(data.get("paths")):
            node = self.run.summary
            try:
                for part in path[:-1]:
                    node = node[part]
                del node[path[-1]]
            except (KeyError, TypeError):
                pass

    def _nest(self, values: dict) -> dict:
        """Keys a telemetry.wandb rank flattened from nested dicts, nested again ("a/b" ->
        {"a": {"b": v}}), and flat keys it named apart back at their own key ("a/b#2" -> "a/b"),
        as W&B keeps them."""
        return nest(values, self._nested)

    def _log_media(self, data: dict) -> None:
        """A media event: one file ("file", "options"), or a list of them ("items": W&B's list
        of images, logged as one value)."""
        step, key, paths = data.get("step"), data.get("key"), []
        try:
            items, as_list = event_files(data)
            objs = []
            for item in items:
                path = shared_media.media_file(item.get("file"))
                if path is None:                                  # UnsafePathError: not our directory
                    raise ValueError(f"a malformed media event: {data!r:.200}")
                paths.append(path)
                self.media_files.wait(path)
                objs.append(self._media_object(str(data.get("type")), path, item.get("options") or {}))
            obj = objs if as_list else objs[0]
            if data.get("type") in ("Text", "List"):
                # Text that came as a file, past what its row's event carries: its secrets are
                # redacted as the event's text would have been (docs/trust.md, "Secrets").
                if self._redactor is None:
                    from telemetry.shared.security.redact import Redactor

                    self._redactor = Redactor()
                obj = self._redactor({key: obj})[key]
            if self._init is not None:
                if step < self._last_step:
                    raise ValueError(f"it arrived after W&B took step {self._last_step}")
                self._at_local_step(step)
                self.run.log(self._nest({key: obj}), step=step)
                self._uncommitted = True
            else:
                self.run.log({"train/step": step, **self._nest({key: obj})})
            self.num_media_logged += 1
        except Exception as exc:
            self.num_media_failed += 1
            if self.num_media_failed == 1:
                log.error("wandb: media at key %r, step %r not logged (counted in media_failed): %s", key, step, exc)
        finally:
            self.media_files.release(paths, MEDIA_READER)

    def _call(self, data: dict) -> None:
        """A W&B call the script made (telemetry/integrations/wandb_calls.py), made on the run."""
        import shutil

        from telemetry.integrations.wandb_calls import staged_dir

        call, args = data.get("call"), data.get("args") if isinstance(data.get("args"), dict) else {}
        stage = None
        try:
            if "dir" in data:
                stage = staged_dir(data["dir"])
                if stage is None:
                    raise ValueError(f"a malformed call event: {data!r:.200}")
                MediaFiles.wait(stage, STAGED_WAIT_S)
                if stage.is_symlink() or not stage.is_dir():
                    raise ValueError(f"{stage} is not a directory")
            self._make_call(call, args, stage)
            self.num_calls += 1
        except Exception as exc:
            self.num_calls_failed += 1
            if self.num_calls_failed == 1:
                log.error("wandb: the script's %s call not made (counted in calls_failed): %s", call, exc)
        finally:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)

    def _make_call(self, call: object, args: dict, stage: Path | None) -> None:
        import shutil

        wandb, run = self._wandb, self.run
        if call == "log_artifact" and stage is not None:
            a = args.get("artifact") or {}
            art = wandb.Artifact(str(a["name"]), type=str(a["type"]), description=a.get("description"),
                                 metadata=a.get("metadata") or None, incremental=bool(a.get("incremental")))
            if any(stage.iterdir()):
                art.add_dir(str(stage))
            for ref in a.get("references") or []:
                art.add_reference(ref["uri"], name=ref.get("name"), checksum=ref.get("checksum", True),
                                  max_objects=ref.get("max_objects"))
            run.log_artifact(art, aliases=args.get("aliases") or None, tags=args.get("tags") or None)
        elif call == "log_model" and stage is not None:
            run.log_model(str(stage / str(args.get("path") or "")), name=args.get("name"), aliases=args.get("aliases"))
        elif call == "log_code" and stage is not None:
            run.log_code(str(stage), name=args.get("name"), include_fn=lambda path, root: True)
        elif call == "save" and stage is not None:
            # Into the run's files directory first: W&B links what it saves, and the stage goes.
            files_dir = Path(run.dir)
            for rel in args.get("files") or []:
                src = stage / rel
                dst = files_dir / rel
                if Path(os.path.normpath(dst)).is_relative_to(files_dir) and src.is_file():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, dst)
            glob_str = args.get("glob")
            policy = args.get("policy") if args.get("policy") in ("live", "end", "now") else "now"
            if args.get("refresh"):
                pass       # the finish's copy of a "live"/"end" file: W&B uploads it as it is at the end
            elif glob_str:
                run.save(str(files_dir / glob_str), base_path=str(files_dir), policy=policy)
            else:
                for rel in args.get("files") or []:
                    run.save(str(files_dir / rel), base_path=str(files_dir), policy=policy, glob=False)
        elif call == "alert":
            kwargs = {"level": wandb.AlertLevel(args.get("level") or "INFO")}
            if args.get("wait_duration") is not None:
                kwargs["wait_duration"] = args["wait_duration"]
            run.alert(str(args.get("title")), str(args.get("text")), **kwargs)
        elif call == "mark_preempting":
            run.mark_preempting()
        else:
            raise ValueError(f"unknown call {call!r}")

    def _media_object(self, kind: str, path: Path, options: dict):
        """The W&B object a rank's media file stands for (telemetry/integrations/wandb_media.py)."""
        import numpy as np

        wandb = self._wandb
        if kind == "Image":
            source = options.get("source")
            data: object = str(path)
            if source in ("numpy", "torch"):
                data = np.load(path, allow_pickle=False)
                if source == "torch":
                    import torch   # lazy, on this thread: W&B reads a tensor as C,H,W, an array as H,W,C

                    data = torch.from_numpy(data)
            return wandb.Image(data, mode=options.get("mode"), caption=options.get("caption"))
        if kind == "Histogram":
            with np.load(path, allow_pickle=False) as f:
                if "hist" in f:
                    return wandb.Histogram(np_histogram=(f["hist"], f["bins"]))
                return wandb.Histogram(f["sequence"], num_bins=num_bins(options))
        if kind == "Table":
            doc = json.loads(path.read_text())
            return wandb.Table(columns=doc.get("columns"), data=doc.get("data"))
        if kind == "Html":
            return wandb.Html(path.read_text(encoding="utf-8"), inject=bool(options.get("inject", True)),
                              data_is_not_path=True)
        if kind == "Audio":
            kwargs = {k: options[k] for k in ("sample_rate", "caption") if options.get(k) is not None}
            if options.get("source") == "numpy":
                return wandb.Audio(np.load(path, allow_pickle=False), **kwargs)
            return wandb.Audio(str(path), **kwargs)
        if kind == "Array":      # a plain value: W&B stores it by its own rule
            return np.load(path, allow_pickle=False)
        if kind in ("List", "Text"):        # a plain value: W&B keeps it as it is
            return json.loads(path.read_text())
        if kind == "Chart":          # the script's wandb.plot call, made here with the real one
            from telemetry.integrations.wandb_media import CHARTS, TABLE_ARG

            name, doc = options.get("chart"), json.loads(path.read_text())
            if name not in CHARTS:
                raise ValueError(f"unknown chart {name!r}")

            def arg(v):
                if isinstance(v, dict) and isinstance(v.get(TABLE_ARG), dict):
                    return wandb.Table(columns=v[TABLE_ARG].get("columns"), data=v[TABLE_ARG].get("data"))
                return v

            return getattr(wandb.plot, name)(*map(arg, doc.get("args") or []),
                                             **{k: arg(v) for k, v in (doc.get("kwargs") or {}).items()})
        raise ValueError(f"unknown media type {kind!r}")

    def _note_hello(self, rank: int, info: dict) -> None:
        self._hellos[rank] = info
        inits = [r for r, h in self._hellos.items() if isinstance(h.get("wandb"), dict)]
        if inits:
            self._init_rank = min(inits)
            self._init = self._hellos[self._init_rank]["wandb"]

    def _update_config(self) -> None:
        """The run config. The daemon's run: the lowest rank's latest hello (a rank's explicit
        hello supersedes its automatic one), without per-process keys; plus the world size and the
        hosts seen. The user's run (a telemetry.wandb init): the init's config alone, as W&B would
        have it (the daemon's view of the run is in the JSONL's hellos)."""
        if not self._hellos:
            return
        if self._init is not None:
            user = self._hellos[self._init_rank].get("config")
            cfg = dict(user) if isinstance(user, dict) else {}
            self._define_metrics(self._init.get("metrics"))
        else:
            base = self._hellos[min(self._hellos)]
            cfg = {k: v for k, v in base.items() if k not in PER_PROCESS_KEYS}
            sizes = [h.get("world_size") for h in self._hellos.values() if isinstance(h.get("world_size"), int)]
            if sizes:
                cfg["world_size"] = max(sizes)
            hosts = sorted({str(h["host"]) for h in self._hellos.values() if h.get("host")})
            if hosts:
                cfg["hosts"] = hosts
        changed = {k: v for k, v in cfg.items() if self._config.get(k, _MISSING) != v}
        if changed:
            self.run.config.update(changed, allow_val_change=True)
            self._config.update(changed)

    def _update_run_attrs(self) -> None:
        """`run.name`, `run.tags`, `run.notes` set in the script after init (a new hello): set on
        the W&B run as W&B sets them."""
        if self._init is None or self.run is None:
            return
        init = init_kwargs(self._init)
        for key in ("name", "notes", "tags"):
            want = init.get(key)
            if want is None or self._run_attrs.get(key, _MISSING) == want:
                continue
            try:
                setattr(self.run, key, tuple(want) if key == "tags" else want)
                self._run_attrs[key] = want
            except Exception as exc:
                self._drop("run_attr", "run.%s = %r refused by W&B: %s" % (key, want, exc))

    def _define_metrics(self, metrics: object) -> None:
        """An init's define_metric calls, as the script made them (step_metric, summary, goal,
        hidden, step_sync)."""
        for m in metrics if isinstance(metrics, list) else []:
            name = m.get("name") if isinstance(m, dict) else None
            if not isinstance(name, str) or name in self._metric_defs:
                continue
            self._metric_defs.add(name)
            opts = {k: m[k] for k in ("step_metric", "summary", "goal", "hidden", "step_sync")
                    if isinstance(m.get(k), (str, bool))}
            self._after_its_rows(self._define_metric, {"step": m.get("at"), "name": name, "opts": opts})

    def _define_metric(self, data: dict) -> None:
        name, opts = data["name"], data["opts"]
        try:
            self.run.define_metric(name, **opts)
        except Exception as exc:          # W&B refuses it (a bad summary name): the run goes on
            self._drop("define_metric", "define_metric(%r, %r) refused by W&B: %s" % (name, opts, exc))

    def close(self) -> None:
        if self.run is None and self._wandb is not None and not self.open_error and (self._waiting or self._hellos):
            self._open()   # nothing opened it: the records that waited still go to a run
        if self.run is None:
            return
        if self._suspect is not None:             # nothing came after it to say it was absurd
            suspect, self._suspect = self._suspect, None
            self._log_metrics(suspect)
        self._release(float("inf"))
        self._take_after_rows(float("inf"))
        self._save_fallback_files()
        t = threading.Thread(target=self.run.finish, kwargs={"exit_code": self.exit_code()}, name="wandb-finish",
                             daemon=True)
        # The step the file's last row should have: the script's (W&B's) step, or the
        # daemon's run's train/step (W&B's _step counts its rows).
        step_key = "_step" if self._init is not None else "train/step"
        self.phase = "finishing"
        t.start()
        t.join(self.finish_timeout_s)
        if t.is_alive():
            log.error("wandb finish did not return within %.0f s; its data stays in %s", self.finish_timeout_s,
                      self.log_dir)
        elif self._run_file:
            self._check_run_file(step_key)
        self.phase = ""
        self.run = None

    def _check_run_file(self, step_key: str) -> None:
        """After the run's finish: whether W&B's writer kept the whole run in its file (W&B says
        nothing of a write that failed: wandb_runfile). The finish can return before W&B's core
        has written the file's end: it is waited for, until W&B's log names the write error that
        stopped it, or up to RUN_FILE_WAIT_S. When the file does not hold the run (the disk
        full), that is said: `write_failed` in stats and drain.json, a line of the run's summary
        and report (drain.problem_lines), an error in the daemon's log. How many records it lost
        is not known (records_not_kept "unknown"); the steps it holds are."""
        from telemetry.daemon.sinks.wandb_runfile import full_disk, logged_error, run_file_end

        path = self._run_file
        start = time.monotonic()
        size, grew_at = -1, start
        try:
            while True:
                try:
                    end = run_file_end(path, step_key)
                    missing = ""
                except FileNotFoundError as exc:
                    end, missing = None, exc.strerror or "not there"
                if end is not None and end.complete:
                    return
                error = logged_error(path, self._core_log)
                now = time.monotonic()
                if error or now - start >= RUN_FILE_WAIT_S:
                    break
                try:
                    now_size = os.stat(path).st_size
                except OSError:
                    now_size = size
                if now_size != size:
                    size, grew_at = now_size, now
                time.sleep(0.1)
        except Exception as exc:       # a file this reader cannot make sense of: said, not judged
            log.warning("wandb: whether W&B wrote its run file %s whole could not be checked: %r", path, exc)
            return
        if not error and now - grew_at < 1.0:
            log.warning("wandb: W&B was still writing its run file %s %.0f s after the run's finish: whether it "
                        "holds the whole run is not known", path, RUN_FILE_WAIT_S)
            return
        error = error or missing or full_disk(path) or "W&B's writer stopped before the run's end"
        self.write_failed = {"file": path, "error": error, "last_step_kept": end.last_step if end else None,
                             "last_step_logged": self._last_step if self._last_step >= 0 else None,
                             "records_not_kept": "unknown"}
        log.error("wandb: W&B's run file %s was not fully written (%s): it ends at step %s of the %s logged, without "
                  "the run's end; the records it lost are not counted (unknown), metrics.jsonl has them",
                  path, error, self.write_failed["last_step_kept"], self.write_failed["last_step_logged"])

    def _save_fallback_files(self) -> None:
        """The files the script wrote to its `run.dir` while this run's directory was not known
        to it (W&B still starting here): saved into the run, as W&B saves the files of its run
        directory at finish. Their directories are wandb_ids.fallback_files_dirs under the init's
        `dir`, else the script's working directory (else the temporary directory, the script's
        second choice). A file W&B could not take is counted (files_unsaved) and said once; so
        is a directory this daemon cannot see (the script on another host)."""
        import socket

        init = self._init
        if init is None:
            return
        meta = init.get("meta") if isinstance(init.get("meta"), dict) else {}
        root = init.get("dir") if isinstance(init.get("dir"), str) else meta.get("cwd")
        if not isinstance(root, str) or not os.path.isabs(root):
            return
        candidates = fallback_files_dirs(root, self.run_id)
        bases = [b for b in candidates if os.path.isdir(b)]
        if not bases:
            host = meta.get("host")
            if isinstance(host, str) and host != socket.gethostname():
                log.warning("wandb: files the script may have written to run.dir before W&B's run started (%s, on "
                            "host %s) cannot be seen from this host: not saved to the W&B run",
                            candidates[0], host)
            return
        for base in bases:
            try:
                # Only a directory of this user's, under no parent others may swap it in
                # (files.make_dir's checks; nothing is made): a stranger's wandb/telemetry-<id>
                # (under /tmp, made first) is not put into the run; the script refused it too.
                files.make_dir(base, own=True, keep_mode=True)
            except OSError as exc:
                log.warning("wandb: %s is not saved to the W&B run: %s", base, exc)
                continue
            self._save_files_of(base)

    def _save_files_of(self, base: str) -> None:
        """Each file under `base` into the run (_save_fallback_files), counted when W&B refuses one."""
        unreadable: list[OSError] = []
        for folder, _, names in os.walk(base, onerror=unreadable.append):
            for name in sorted(names):
                path = os.path.join(folder, name)
                try:
                    if not self.run.save(path, base_path=base, policy="now", glob=False):
                        raise OSError("W&B took no file")
                except Exception as exc:
                    unreadable.append(OSError(f"{path}: {exc}"))
        if unreadable:
            self.num_files_unsaved += len(unreadable)
            log.error("wandb: %d file(s) or folder(s) of the script's run.dir %s not saved to the W&B run (counted in "
                      "files_unsaved): %s", len(unreadable), base, unreadable[0])

    def run_info(self) -> dict:
        """The open run as W&B gives it: what a script's `run.name`, `run.url`, `run.path` read."""
        run = self.run
        if run is None:
            return {}
        out = {}
        for k in ("id", "name", "project", "entity", "path", "url", "dir", "resumed", "project_url",
                  "starting_step", "sweep_url"):
            if k in ("url", "project_url", "sweep_url") and self.mode == "offline":
                # None, as W&B's offline run gives; asked, W&B also logs a warning each time,
                # which went to the run's terminal at every `telemetry status`.
                out[k] = None
                continue
            try:
                out[k] = getattr(run, k)
            except Exception:
                out[k] = None
        return out

    def stats(self) -> dict:
        open_error = self.open_error
        if not open_error and self.phase == "starting" and self.giving_up:
            # The drain gave up on it inside wandb.init: no run is made, and that must be said
            # as a refused start is (`telemetry run`'s summary: "W&B run NOT MADE").
            open_error = ("W&B's start had not ended when the drain gave up on it (drain_timeout_s and %.0f s more)"
                          % self.phase_allowance_s)
        return {"mode": self.mode, "run_id": self.run_id, "run": self.run_info(), "opened": self.opened,
                "open_error": open_error, "console": self.num_console,
                "logged": self.num_logged,
                "dropped_before_open": self.num_dropped_waiting, "media_logged": self.num_media_logged,
                "media_failed": self.num_media_failed, "calls": self.num_calls, "calls_failed": self.num_calls_failed,
                "nested_refused": self.num_nested_refused,
                "dropped_by_reason": dict(self.dropped_by_reason), "files_unsaved": self.num_files_unsaved,
                "write_failed": self.write_failed}




def _interface(run):
    """The interface through which a W&B run writes its records (`run._interface` in wandb
    0.31; `run._backend.interface` before), or None: W&B's internals, looked up, never assumed."""
    iface = getattr(run, "_interface", None)
    if iface is None:
        iface = getattr(getattr(run, "_backend", None), "interface", None)
    return iface


def _stats_writer(run):
    """W&B's system-metrics writer of `run` (what its own monitor calls), or None."""
    return getattr(_interface(run), "publish_stats", None)
