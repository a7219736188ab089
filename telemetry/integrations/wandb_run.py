"""The run behind `telemetry.wandb`: W&B's logging semantics over a TelemetryClient.

Runs inside the training process, on the thread that trains. What W&B would do in the process
(build history rows, serialize, talk to its service) happens in the daemon instead: here a log
call only flattens the dict, keeps W&B's step and commit rules, and hands a committed row to
TelemetryClient.log (tensors are read on the client's sender thread, never here).

W&B's rules, as wandb 0.31 applies them (checked against real offline runs in
tests/test_wandb_module.py and tests/test_wandb_dropin.py):
- `log(data)`: merge into the current step's row, commit it, advance the step by one;
- `log(data, commit=False)`: merge, do not commit (a later log commits the row);
- `log(data, step=s)`: s above the current step commits the pending row and moves to s; s
  below it is dropped with W&B's warning; the row at s is not committed unless commit=True;
- nested dicts become "a/b" keys in the records (the daemon's flat names); W&B keeps them nested
  (its UI shows "a.b"), so each such key's path is sent once (a `wandb/nested` event) and the
  daemon's W&B sink logs the value nested again, as W&B would have. W&B keeps a flat "a/b" and a
  nested a -> b as two keys; the second of them to be logged is named "a/b#2" in the records
  (telemetry/shared/wandb_keys.py: RecordNames), its path sent the same way.

Across ranks: every rank may log. The hello names how many ranks log: a rank above 0 that calls
init says "every rank" (the world size), rank 0 alone says 1, so the daemon never waits for a
rank that will not log (the usual `if rank == 0: wandb.init(...)`), and means every rank's
values when they all log. This relies on every logging rank's init (its hello) reaching the
daemon before rank 0's first row does, which a data-parallel script ensures: its first
gradient all-reduce waits for every rank, and each rank calls init before training. That is
for ranks that share a run id; a rank whose run has an id of its own (made in the process, on a
daemon of the run's own: telemetry.wandb.init) is rank 0 of a world of one, as W&B's run per rank.

Text values (W&B keeps strings in the history), `None` (W&B: null), short lists of plain values
and numpy arrays of up to 32 elements (W&B: a list) are sent with the row, as a `wandb/values`
event the daemon's W&B sink logs at the row's step; longer lists and arrays go as files, as media
do (below), and the daemon's run logs the value itself, so W&B stores it by its own rule. The console output of the process (rank 0
only: W&B captures the process that made the run) is sent as `wandb/console` events, as W&B's
console capture does, unless `settings.console` or $WANDB_CONSOLE is "off".

The run's id is the script's (`id=`, $WANDB_RUN_ID, the `telemetry run` id, else a new W&B-style
id), and the daemon opens its W&B run with it. What only W&B knows (`run.name` when none was
given, `run.url`, `run.path`, the entity) is read from the daemon's open run when first asked
(its `status`), so it is what W&B gave; without an answer, what W&B offline gives.

`wandb.Image`, `wandb.Histogram`, `wandb.Table`, `wandb.Html` and `wandb.Audio` are passed
through: a snapshot is queued for a writer thread that writes it to a file, and a `wandb/media`
event names the file, the key and the step; the daemon's W&B sink logs the real object
(telemetry/integrations/wandb_media.py). Other media types, multi-element tensors and the like
are refused with one warning per type, counted (`Run.num_refused`), and reported once per type to
the daemon as a `wandb/refused` event.
"""
from __future__ import annotations

import atexit
import operator
import os
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Mapping

from protocol.constants import MAX_NAME_CHARS, MAX_VALUES
from telemetry.integrations._client import LazyClient, process_rank
from telemetry.integrations.wandb_calls import CALL_EVENT, RunCalls
from telemetry.integrations.wandb_objects import Config, Error, Metric, Summary, Unsupported, UsageError
from telemetry.integrations.wandb_values import json_value, nested_key_text, summary_key_text
from telemetry.integrations.wandb_media import (INLINE_ARRAY, INLINE_LIST, INLINE_TEXT_CHARS, Array, Histogram, List,
                                                 Media, MediaWriter, Text)
from telemetry.shared.bookkeeping import SUMMARY_REMOVE_EVENT
from telemetry.shared.media import EVENT as MEDIA_EVENT
from telemetry.shared.wandb_ids import fallback_files_dirs
from telemetry.shared.wandb_keys import NESTED_EVENT, REFUSED_EVENT, RecordNames

SUMMARY_EVENT = "wandb/summary"             # {key: value}: run.summary set (what consumers read)
# Just before each: {"step": s, "replace": [[key, ...], ...]}, the rows it comes after (the
# daemon's run takes it after them) and the paths whose value it replaces.
SUMMARY_AT_EVENT = "wandb/summary_at"
VALUES_EVENT = "wandb/values"
CONSOLE_EVENT = "wandb/console"
ENV_RUN_ID = "TELEMETRY_RUN_ID"
# A log() of more top-level keys than this costs the training thread no Python work per key (see
# Run.log): the bound on what a wandb.log call does on the caller's thread.
WIDE_ROW_KEYS = MAX_VALUES
# The entity of W&B's disabled run, and its name's prefix ("dummy-<id>").
DISABLED_ENTITY = "dummy"
# The largest step W&B takes (its history step is an int64).
MAX_STEP = (1 << 63) - 1
# Histograms of watch() waiting for their writer (a model's parameters, noted at once).
WATCH_MAX_QUEUED = 4096
# How long `run.name` / `run.url` / `run.path` wait for the daemon's W&B run to open (it imports
# wandb and calls wandb.init, which take a while) before giving what W&B offline gives.
RUN_INFO_WAIT_S = 15.0
# After that wait ran out with W&B still starting, a later read asks again with one look, at most
# this often (a loop reading `run.dir` each step does not ask the daemon each step).
RUN_INFO_RETRY_S = 1.0
NOT_UPLOADED = ": its files are not uploaded"     # why run.dir is the run's own, when no W&B run takes them

# Run methods of W&B (0.31) that this run does not offer: calling one raises, naming it. A name
# W&B's run does not have (`files_dir`, `get_url`: older W&B's) raises AttributeError, as W&B's.
# (alert, save, log_artifact, log_model, log_code, use_artifact, mark_preempting: wandb_calls.py)
UNSUPPORTED_RUN_METHODS = frozenset({
    "restore", "link_artifact", "use_model", "link_model", "status",
    "to_html", "display", "finish_artifact"})


# Run.log's fast path: the key and value types of the common row.
_STR = {str}
_PLAIN = {float, int}
# A list of these goes with the row's text values (msgpack takes them as they are).
_JSON_PLAIN = {float, int, str, bool, type(None)}

# Runs not finished yet: finished at exit, as W&B does, so a pending row is sent.
_unfinished: "weakref.WeakSet[Run]" = weakref.WeakSet()


def run_in_use(run_id: str) -> bool:
    """Whether a run of this process with this id is still open (W&B's service refuses a second
    one: "run ID ... is in use")."""
    pid = os.getpid()
    return any(run.id == run_id and run._pid == pid and not run._finished for run in list(_unfinished))
_exit_hook_registered = False


def flatten(data: Mapping[str, Any], names: RecordNames, path: tuple[str, ...] = (),
            key_text: Callable[[Any], str] = nested_key_text) -> dict[str, Any]:
    """Each value under its record name: a nested dict's as "a/b", a flat key's as it is, either
    made distinct when another key of the run has that name (`names`, which keeps each path).
    A top-level key must be text, as W&B's; a nested one is named by `key_text` (W&B's name for
    it in a logged row: wandb_values.nested_key_text). A set or bytes value is what W&B logs of it
    (wandb_values.json_value). Raises before anything is logged, as W&B's log does."""
    out: dict[str, Any] = {}
    claimed, flat = names.paths, names.flat
    for k, v in data.items():
        if k.__class__ is not str and not isinstance(k, str):
            if not path:
                raise TypeError("Key values passed to `wandb.log` must be strings.")
            k = key_text(k)
        c = v.__class__
        # A float or int (the usual value) skips the other checks: an ABC isinstance is slow.
        if c is float or c is int:
            pass
        elif isinstance(v, Mapping):
            out.update(flatten(v, names, path + (k,), key_text))
            continue
        elif isinstance(v, (set, frozenset, bytes, bytearray)):
            v = json_value(v)
        if path or k in claimed:
            out[names.name(path + (k,))] = v
        else:                   # a top-level key no other has named: itself (RecordNames.name, inline)
            flat.add(k)
            out[k] = v
    return out


def _media_list(value: Any) -> bool:
    """A non-empty list or tuple of passed-through media of one type (W&B's list of images)."""
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(m, Media) and m.passthrough and type(m) is type(value[0]) for m in value)


def _is_array(value: Any) -> bool:
    """A numpy array of numbers (numpy is only looked for if the script imported it)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray) and value.dtype != object


def as_w_and_b_logs(value: Any) -> Any:
    """A value as W&B's history keeps it where W&B turns it into something else: a datetime,
    date or time as its ISO text, a Decimal or a Fraction as its text, an Enum as its value;
    anything else as it is."""
    import datetime
    import decimal
    import enum
    import fractions

    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (datetime.date, datetime.time)):     # a datetime is a date
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, fractions.Fraction)):
        return str(value)
    return value


def refusal(value: Any) -> str | None:
    """None for a value the daemon takes (a number, a one-element tensor, a numpy scalar), else
    the name of its type for the warning. Reads no tensor value: numel() is metadata."""
    c = value.__class__
    if c is float or c is int or c is bool or c is str:
        return None
    if hasattr(value, "detach"):
        if value.numel() == 1:
            return None
        return f"{c.__name__} with {value.numel()} elements (W&B makes a histogram of it: log wandb.Histogram(...) to pass one)"
    if hasattr(value, "dtype") and getattr(value, "shape", None) == ():   # numpy scalar
        return None
    if isinstance(value, Media) or (c.__module__ or "").startswith("wandb"):
        return f"wandb.{c.__name__}"
    return c.__name__


class Run(RunCalls):
    """A W&B-like run whose rows go to the telemetry daemon (see the module docstring).

    Args:
        project, name, entity, group, tags, notes, job_type, id: what the daemon's W&B sink opens
            the real run with.
        config: the starting config (dict or argparse.Namespace).
        client: a TelemetryClient to use (its owner closes it); None: one of its own, on
            `endpoint` (None: $TELEMETRY_ENDPOINT or the default).
        rank, world_size: this process's; None: torch.distributed's, else $RANK/$WORLD_SIZE.
        framework: named in the hello ("wandb", "accelerate").
        runtime: the runtime directory of the run's own daemon (telemetry.wandb.its_daemon): its
            client sends there, `run.name` and the like are asked there, and the process that
            started that daemon drains it at finish. None: the default endpoints.
    """

    def __init__(self, project: str | None = None, name: str | None = None, config: Any = None,
                 entity: str | None = None, group: str | None = None, tags: Any = None,
                 notes: str | None = None, job_type: str | None = None, id: str | None = None,
                 dir: str | None = None, mode: str = "online", client: Any = None, endpoint: str | None = None,
                 rank: int | None = None, world_size: int | None = None, framework: str = "wandb",
                 settings_console: str | None = None, runtime: Any = None) -> None:
        env_rank, env_world = process_rank()
        if rank is None and client is not None:
            rank = getattr(client, "rank", None)    # the caller's client knows its rank
        self.rank = env_rank if rank is None else rank
        self.world_size = env_world if world_size is None else world_size
        self.project = project
        self._name = name or None
        self._entity = entity
        self.group = group or ""            # W&B's: "" when none was given
        self._tags = tuple(tags or ())
        self._notes = notes
        self.start_time = time.time()       # W&B's: when init was called
        self.job_type = job_type or ""
        # W&B's: the sweep this run is a trial of ($WANDB_SWEEP_ID, set by the sweep agent), None
        # outside a sweep (a stand-in here was truthy: `if run.sweep_id:` took the sweep's branch).
        self.sweep_id = os.environ.get("WANDB_SWEEP_ID") or None
        self.id = id or os.environ.get(ENV_RUN_ID) or new_run_id()
        # Where W&B's files go, as W&B's `dir` (its root_dir): made here, as W&B makes it; one
        # that cannot be made or written is said once and left to the daemon's default.
        self._files_root = files_root(dir)
        self._meta = script_meta(self.start_time)     # the W&B run's metadata: this process's
        self._daemon_run: dict | None = None     # the daemon's answer, once final (see _w_b)
        self._no_run_why = ""                    # with {} there: why no W&B run takes this run's files
        self._asked_at: float | None = None      # when the daemon was last asked
        self._fallback: str | None = None        # run.dir until the daemon's is known (_fallback_dir)
        self._said_no_upload = False
        self.mode = mode
        self.framework = framework
        self.num_refused: dict[str, int] = {}
        self._step = 0
        self._pending: dict[str, Any] = {}
        self._metrics: list[dict[str, Any]] = []
        self._warned: set[str] = set()
        self._finished = False
        self._media = MediaWriter()
        self._names = RecordNames()
        self._num_paths_sent = 0            # of _names.paths, told the daemon (wandb/nested)
        self._fast_keys: frozenset = frozenset()    # the last fast row's keys (see log)
        self._nested_tops: set[str] = set()         # top-level keys with a nested key under them
        self._media_step = -1               # the step of the last media sent (its row is not empty)
        self._row_open = False              # a log() call made the current step's row
        self._pid = os.getpid()             # a forked child's copy is not its run (see _finish_all)
        self._runtime = runtime
        if runtime is not None and endpoint is None and client is None:
            endpoint = f"ipc://{runtime}/ingest.sock"
        self._client = LazyClient(client, endpoint, rank=self.rank, send_hello=False)
        self.config = Config(self._send_hello, guard=lambda: self._raise_if_finished("_config_callback"))
        self.summary = Summary(self._send_summary, lambda data: self._flatten(data, summary_key_text),
                               self._send_summary_remove,
                               guard=lambda: self._raise_if_finished("_summary_update_callback"),
                               finished=lambda: self._finished)
        self._logged = self.summary._items
        self._texts: dict[str, str] = {}
        self._watched: list = []           # (key, clone) noted by watch()'s hooks, sent at the next commit
        self._watch_handles: dict = {}
        self._watch_media: MediaWriter | None = None
        self._saved_late: list = []        # save()s with policy "live"/"end": staged again at finish
        # The first hello, with the starting config: the daemon's W&B sink opens the run with it.
        self.config.update(config)
        self._console = None
        if self.rank == 0 and console_wanted(settings_console) and mode != "disabled":
            self._console = ConsoleCapture(self._send_console)
        _unfinished.add(self)
        _register_exit_hook()

    # -- what W&B gives ------------------------------------------------------------------------
    @property
    def name(self) -> str | None:
        """The name given, else W&B's (offline: None; disabled: "dummy-<id>", as W&B's)."""
        if self._name:
            return self._name
        return f"{DISABLED_ENTITY}-{self.id}" if self.mode == "disabled" else self._w_b("name")

    @name.setter
    def name(self, value: str | None) -> None:
        self._raise_if_finished("name")
        self._name = value or None
        self._send_hello()

    @property
    def tags(self) -> tuple:
        return self._tags

    @tags.setter
    def tags(self, value: Any) -> None:
        """Set after init, as W&B: the daemon's run takes them (a new hello)."""
        self._raise_if_finished("tags")
        self._tags = tuple(value or ())
        self._send_hello()

    @property
    def notes(self) -> str | None:
        return self._notes

    @notes.setter
    def notes(self, value: str | None) -> None:
        self._raise_if_finished("notes")
        self._notes = value
        self._send_hello()

    @property
    def resumed(self) -> bool:
        """Whether the daemon's W&B run resumed an earlier one (W&B's run.resumed)."""
        return bool(self._w_b("resumed"))

    @property
    def starting_step(self) -> int:
        """W&B's: the step the run started at, a resumed online run's from W&B's server (the
        daemon's W&B run's); 0 offline and disabled, as W&B's, and when no W&B run says one."""
        if self.mode in ("offline", "disabled"):
            return 0
        return self._w_b("starting_step") or 0

    @property
    def project_url(self) -> str | None:
        """The project's page (online only: offline, W&B has none)."""
        return self._w_b("project_url")

    @property
    def entity(self) -> str:
        if self.mode == "disabled":
            return self._entity or DISABLED_ENTITY
        return self._entity or self._w_b("entity") or ""

    @property
    def path(self) -> str:
        """"entity/project/id", as W&B's (offline with no entity: "project/id")."""
        got = self._w_b("path")
        if got:
            return got
        entity = self.entity if self.mode == "disabled" else self._entity
        return "/".join(p for p in (entity, self.project or "uncategorized", self.id) if p)

    @property
    def url(self) -> str | None:
        """The run's page (online only: offline, W&B has none)."""
        return self._w_b("url")

    @property
    def dir(self) -> str:
        """Where the run's files are, as W&B's `run.dir`: the daemon's W&B run's files directory
        once the daemon has it; until then (W&B still starting there) and without one (W&B off
        or refused), this run's own (_fallback_dir), whose files the daemon's W&B sink saves into
        the run at its finish. Never None: scripts join paths to it. With mode="disabled", W&B's
        own: a path under the system's temporary directory, not made."""
        if self.mode == "disabled":
            import tempfile

            stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(self.start_time))
            return os.path.join(tempfile.gettempdir(), "wandb", f"run-{stamp}-{self.id}", "files")
        return self._w_b("dir") or self._fallback_dir()

    @property
    def sweep_url(self) -> str | None:
        """The page of the sweep this run is a trial of (online only; None outside a sweep)."""
        return self._w_b("sweep_url") if self.sweep_id and self.mode not in ("offline", "disabled") else None

    @property
    def sync_dir(self) -> str:
        """The directory of the run's W&B files, as W&B's (run.dir is its `files`)."""
        return os.path.dirname(self.dir)

    @property
    def offline(self) -> bool:
        """As W&B's: whether the run is offline (W&B's disabled run says False)."""
        return self.mode != "disabled" and self.url is None

    @property
    def disabled(self) -> bool:
        return self.mode == "disabled"

    def _w_b(self, key: str):
        """`key` of the daemon's open W&B run (None when it has none, or has none yet). Asked
        once with a wait (RUN_INFO_WAIT_S) for W&B's start in the daemon; an answer that says
        the run is still starting is not kept: a later read asks again, with one look and no
        wait (at most once a RUN_INFO_RETRY_S), so a training loop never waits that long twice."""
        if self._daemon_run is None:
            if self.mode == "disabled":
                self._daemon_run, self._no_run_why = {}, ""
            elif self._asked_at is None or time.monotonic() - self._asked_at >= RUN_INFO_RETRY_S:
                control = f"ipc://{self._runtime}/control.sock" if self._runtime is not None else None
                wait_s = RUN_INFO_WAIT_S if self._asked_at is None else 0.0
                info, why = daemon_run_info(self.id, wait_s, control=control)
                self._asked_at = time.monotonic()
                if why is not None:
                    self._daemon_run, self._no_run_why = info, why
        return (self._daemon_run or {}).get(key)

    def _fallback_dir(self) -> str:
        """This run's own files directory (wandb_ids.fallback_files_dirs), made on first use, for
        `run.dir` while the daemon's W&B run directory is not known. Under the script's `dir`,
        else its working directory at init; one that cannot be made is the system's temporary
        directory's (W&B's own fallback), said once. Said once too when no W&B run will take
        its files (W&B off or refused in the daemon)."""
        if self._fallback is None:
            from telemetry.shared import files

            paths = fallback_files_dirs(self._files_root or self._meta["cwd"], self.id)
            why = []
            for i, path in enumerate(paths):
                try:
                    # Ours alone (files.make_dir's checks): under /tmp a stranger may have made
                    # wandb/ or the run's directory first, to read or swap the files put there.
                    files.make_dir(path, own=True)
                except OSError as exc:
                    why.append(f"{path}: {exc}")
                    if i + 1 < len(paths):
                        warnings.warn(f"telemetry.wandb: run.dir {path} cannot be made ({exc}): using "
                                      f"{paths[i + 1]} (under the system's temporary directory)",
                                      RuntimeWarning, stacklevel=3)
                    continue
                self._fallback = path
                break
            else:
                raise OSError(f"telemetry.wandb: no directory for run.dir could be made: {'; '.join(why)}")
        if self._no_run_why and not self._said_no_upload and self.rank == 0:
            self._said_no_upload = True
            print(f"telemetry.wandb: run.dir is this run's own {self._fallback}: {self._no_run_why}",
                  file=sys.stderr, flush=True)
        return self._fallback

    # -- logging -------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """The current W&B step (the step of the row being filled); W&B's disabled run's stays 0."""
        return 0 if self.mode == "disabled" else self._step

    def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        """wandb.log: see the module docstring for the step and commit rules. Never blocks.

        The common row (a dict of plain float/int values, its keys those of the previous fast
        row or else str within MAX_NAME_CHARS, no step or commit given, nothing pending from an
        earlier call) takes a fast path: its checks run at C speed (a set of types, a keys
        comparison), and the dict goes to the client as it is, with the same effect as the
        general path below (one committed row at the current step, the step advanced,
        run.summary's last values)."""
        if step is None and commit is None and data.__class__ is dict and data and not self._finished \
                and not self._pending and not self._texts and not self._watched \
                and set(map(type, data.values())) <= _PLAIN \
                and (data.keys() == self._fast_keys or self._fast_keys_ok(data)):
            console = self._console
            if console is not None and console._buf:
                console.flush_due()
            client = self._client._client
            (self._client.get() if client is None else client).log(self._step, data)
            self._logged.update(data)
            if self.summary._ops:                    # define_metric summaries (min, max, ...)
                self.summary.note(data)
            self._step += 1
            self._row_open = False
            return
        self._raise_if_finished("log")
        if not isinstance(data, Mapping):
            raise TypeError("wandb.log must be passed a dictionary")
        if step is not None:
            # As W&B takes it: an int, or what stands for one (a numpy integer, a one-element
            # integer tensor); anything else raises TypeError, as W&B's does, never a row lost.
            if step.__class__ is bool:       # an int to operator.index; W&B's history refuses it
                raise TypeError("Field wandb_internal.HistoryStep.num: Expected an int, got a boolean.")
            step = operator.index(step)
            if step > MAX_STEP and self.mode != "disabled":
                # W&B's history step is an int64: its protobuf refuses a larger one, before anything
                # is logged (W&B's disabled run writes no history and takes it).
                raise ValueError(f"Value out of range: {step}")
            if step < self._step:
                # W&B's line, each time, on stderr (not a Python warning), unless $WANDB_SILENT.
                if os.environ.get("WANDB_SILENT", "").lower() not in ("1", "true", "yes"):
                    print(f"wandb: WARNING Tried to log to step {step} that is less than the current step "
                          f"{self._step}. Steps must be monotonically increasing, so this data will be ignored. "
                          f"See https://wandb.me/define-metric to log data out of order.", file=sys.stderr,
                          flush=True)
                return
            if step > self._step:
                self._commit()
                self._step = step
        pending = self._pending
        if len(data) > WIDE_ROW_KEYS:
            # Work beyond the bound is not done here: the row goes to the client as it is (a
            # copy at C speed), whose sender thread sends its numbers and tensors as records of
            # this step and leaves the rest out (named once, counted in its skipped_values).
            self._warn_once("wide", f"telemetry.wandb: a row of more than {WIDE_ROW_KEYS} keys is passed to the "
                                    f"daemon unchecked: its numbers and tensors are logged; text, nested dicts "
                                    f"and media in it are not")
            names = self._names
            if names.paths.keys().isdisjoint(data):
                names.flat.update(data)
            else:                           # a key a nested one was named first: its own name
                data = {names.name((k,)): v for k, v in data.items()}
                self._send_paths()
            pending.update(data)
            data = {}
        texts = self._texts
        for k, v in self._flatten(data).items():
            if len(k) > MAX_NAME_CHARS:
                self._refuse(k, f"a key longer than {MAX_NAME_CHARS} characters")
                continue
            if k in pending or k in texts:
                # Logged earlier into this row (commit=False): this value replaces that one, as in
                # W&B's row, whichever of the two holds each.
                pending.pop(k, None)
                texts.pop(k, None)
            why = refusal(v)
            if why is not None and not isinstance(v, (Media, list, tuple, dict)) and v is not None:
                v = as_w_and_b_logs(v)
                why = refusal(v)
            if why is None:
                if isinstance(v, str):
                    self._texts[k] = v if v.__class__ is str else str(v)    # numpy's str_ too: text
                    continue
                pending[k] = v
            elif isinstance(v, Media) and v.passthrough:
                self._send_media(k, [v])
            elif _media_list(v):
                self._send_media(k, list(v), as_list=True)
            elif v is None:
                self._texts[k] = None           # W&B's history keeps it as null
            elif v.__class__ is list or v.__class__ is tuple:
                self._log_list(k, v)
            elif _is_array(v):
                self._log_array(k, v)
            else:
                self._refuse(k, why)
        self._row_open = True               # this step's row is one W&B writes, even if empty
        if (step is None and commit is None) or commit:
            self._commit()
            self._step += 1

    def _raise_if_finished(self, call: str) -> None:
        """W&B's UsageError, in its words, for `call` (the name of W&B's method that refuses it)
        on a finished run: what it would have changed reaches no run, so it is never taken
        silently (`except wandb.errors.UsageError` catches it, as with W&B)."""
        if self._finished:
            raise UsageError(f"Run ({self.id}) is finished. The call to `{call}` will be ignored. Please make sure "
                             f"that you are using an active run.")

    def _fast_keys_ok(self, data: dict) -> bool:
        """Whether `data`'s keys suit Run.log's fast path (1..WIDE_ROW_KEYS str keys, none
        longer than MAX_NAME_CHARS, none whose record name is another: see RecordNames, none with
        a nested key under it: its value replaces theirs in run.summary, see Summary.take); if so
        they are kept, for the next row's keys comparison, and named as themselves."""
        names = self._names
        if data and len(data) <= WIDE_ROW_KEYS and set(map(type, data)) == _STR \
                and max(map(len, data)) <= MAX_NAME_CHARS and names.paths.keys().isdisjoint(data) \
                and self._nested_tops.isdisjoint(data):
            names.flat.update(data)
            self._fast_keys = frozenset(data)
            return True
        return False

    def _log_list(self, key: str, value: list | tuple) -> None:
        """A list W&B keeps in its history as it is (a JSON list): a short one of plain values
        travels with the row's text values; any other, as a file (wandb_media.List)."""
        if len(value) <= INLINE_LIST and set(map(type, value)) <= _JSON_PLAIN:
            self._texts[key] = list(value)
        else:
            for x in value:
                if isinstance(x, Media):     # W&B's JSON encoder refuses one inside a list, so does this
                    raise TypeError(f"Object of type {type(x).__name__} is not JSON serializable")
            self._send_media(key, [List(value)])
            self.summary.take({key: list(value)})   # run.summary reads it back as W&B's: a list of its values

    def _log_array(self, key: str, value: Any) -> None:
        """A numpy array, stored as W&B stores it: one element as that number, up to
        INLINE_ARRAY elements as a list (with the row), more as a file the daemon's run logs as
        the array (W&B makes a 32-bin histogram of it)."""
        if value.size == 1:
            x = value.reshape(-1)[0].item()
            if x.__class__ is float or x.__class__ is int:
                self._pending[key] = x
            else:
                self._texts[key] = x
        elif value.size <= INLINE_ARRAY:
            self._texts[key] = value.tolist()
        else:
            self._send_media(key, [Array(value)])

    def _commit(self) -> None:
        # A row logged with nothing in it (`wandb.log({})`, `log({}, commit=False)`): W&B still
        # writes it, a row of its _step alone, when it is committed; so does the daemon's run,
        # from an empty values event.
        empty = self._row_open and not (self._pending or self._texts or self._watched) and \
            self._media_step != self._step
        self._row_open = False
        if empty:
            self._client.get().event(VALUES_EVENT, {"step": self._step, "values": {}})
        if self._console is not None:
            self._console.flush_due()
        if self._watched:        # watch()'s clones of this row (wandb_watch.py)
            self._send_watched()
        if self._texts:          # first: the daemon's W&B sink logs them into the row before its numbers
            texts, self._texts = self._texts, {}
            self.summary.take(texts)
            inline = self._inline_texts(texts)
            if inline:
                self._client.get().event(VALUES_EVENT, {"step": self._step, "values": inline})
        if self._pending:
            self._client.get().log(self._step, self._pending)
            self.summary.take(self._pending)         # run.summary's last values (wandb_objects.Summary)
            if self.summary._ops:                    # define_metric summaries (min, max, ...)
                self.summary.note(self._pending)
            self._pending = {}

    def _inline_texts(self, texts: dict[str, Any]) -> dict[str, Any]:
        """The row's text values that its event carries: up to INLINE_TEXT_CHARS characters of
        text in all; each value past them goes as a file (as W&B keeps a text of any length in
        its history; the event would have been too large for the daemon, and lost)."""
        chars = 0
        for k, v in list(texts.items()):
            c = v.__class__
            n = len(v) if c is str else sum(len(x) for x in v if x.__class__ is str) if c is list else 0
            if n and chars + n > INLINE_TEXT_CHARS:
                self._send_media(k, [Text(v) if c is str else List(v)])
                del texts[k]
            else:
                chars += n
        return texts

    def _flatten(self, data: Mapping[str, Any], key_text: Callable[[Any], str] = nested_key_text) -> dict[str, Any]:
        """flatten(), telling the daemon once of each key's path (see _send_paths)."""
        flat = flatten(data, self._names, key_text=key_text)
        self._send_paths()
        return flat

    def _send_paths(self) -> None:
        """The paths of the record names made since the last call (nested keys, and flat ones
        named apart): run.summary reads them back at their paths, and the daemon's W&B run logs
        them there, as W&B's (a `wandb/nested` event, before the values that use them)."""
        paths = self._names.paths
        if len(paths) > self._num_paths_sent:
            new = dict(list(paths.items())[self._num_paths_sent:])
            self._num_paths_sent = len(paths)
            self.summary.add_paths(new)
            tops = {p[0] for p in new.values() if len(p) > 1}
            if tops:
                # A key with a nested one under it takes the general path (Summary.take: one
                # replaces the other in run.summary, as in W&B's); the fast path's update cannot.
                self._nested_tops |= tops
                self._fast_keys = frozenset()
            self._client.get().event(NESTED_EVENT, {"paths": {k: list(p) for k, p in new.items()}})

    def _send_media(self, key: str, media: list, as_list: bool = False, writer: Any = None) -> None:
        """One media value, or a list of them of one type (W&B logs a list of images as one
        value): each written to a file by the writer thread, one event naming the files."""
        from telemetry.client.core import DisabledClient

        client = self._client.get()
        if isinstance(client, DisabledClient):
            return    # mode="disabled" or $TELEMETRY_DISABLED: no daemon would take the file
        items = []
        for m in media:
            queued = (writer or self._media).submit(m)
            if queued is None:
                unusable = (writer or self._media).unusable
                self._refuse(key, f"wandb.{type(m).__name__} ({unusable or 'the media writer queue is full'})",
                             None if unusable else "logged faster than its files are written")
                return
            items.append({"file": queued[0], "options": queued[1]})
        event = {"key": key, "step": self._step, "type": type(media[0]).__name__}
        self._media_step = self._step
        if as_list:
            event["items"] = items
        else:
            event.update(items[0])
        client.event(MEDIA_EVENT, event)

    def _refuse(self, key: str, why: str, hint: str | None = None) -> None:
        """A value not logged, counted by `why` (run.num_refused), said once; the run's end sends
        the counts (a `wandb/refused` event each: the summary says them)."""
        n = self.num_refused.get(why, 0)
        self.num_refused[why] = n + 1
        if n == 0:
            hint = hint or "the daemon's W&B run takes numbers and one-element tensors"
            warnings.warn(f"telemetry.wandb: {why} at key {key!r} is not logged: {hint} (counted in "
                          f"run.num_refused, said at the run's end)", RuntimeWarning, stacklevel=4)
            self._client.get().event(REFUSED_EVENT, {"type": why, "key": key, "step": self._step, "count": 1})

    def define_metric(self, name: str, step_metric: str | None = None, step_sync: bool | None = None,
                      hidden: bool | None = None, summary: str | None = None, goal: str | None = None,
                      overwrite: bool | None = None) -> Metric:
        """Reaches the daemon's W&B run as it was made (its step_metric, summary, goal, hidden),
        after the rows logged before it, as in W&B. Returns what W&B's returns, a Metric."""
        self._raise_if_finished("define_metric")
        if summary:
            self.summary.define(name, summary)
        # "at": the rows before it (the daemon's run defines it once they are committed).
        self._metrics.append({k: v for k, v in (("name", name), ("step_metric", step_metric), ("step_sync", step_sync),
                                                ("summary", summary), ("goal", goal), ("hidden", hidden),
                                                ("at", self._step - 1))
                              if v is not None})
        self._send_hello()
        return Metric(name, step_metric, step_sync, hidden, summary, goal, overwrite)

    def watch(self, models: Any, criterion: Any = None, log: str | None = "gradients", log_freq: int = 1000,
              idx: int | None = None, log_graph: bool = False) -> list:
        """W&B's gradient and parameter histograms, computed off the training thread
        (telemetry/integrations/wandb_watch.py)."""
        from telemetry.integrations import wandb_watch

        return wandb_watch.watch(self, models, criterion, log, log_freq, idx, log_graph)

    def unwatch(self, models: Any = None) -> None:
        from telemetry.integrations import wandb_watch

        wandb_watch.unwatch(self, models)

    def _send_watched(self) -> None:
        from telemetry.integrations.wandb_watch import Histogram

        taken = self._watched[:]
        del self._watched[:len(taken)]       # a hook on another thread may append meanwhile
        if self._watch_media is None:
            # Its own writer: a model's parameters at once, past what the media queue holds (the
            # clones exist already; the bound here is on what a log_freq step may hold).
            self._watch_media = MediaWriter(max_queued=WATCH_MAX_QUEUED)
        for key, tensor in taken:
            self._send_media(key, [Histogram(tensor)], writer=self._watch_media)

    def finish(self, exit_code: int | None = None, quiet: bool | None = None) -> None:
        """Send the pending row, say how the run ended (a `train_end` event with `exit_code`, 0
        when None: the daemon's W&B run finishes with it) and close this run's client (bounded
        time); the run's own daemon, if this process started it, drains now, so the run is
        complete when finish returns, as W&B's. Safe twice."""
        if self._finished:
            return
        self._save_late()
        self._commit()
        if self._console is not None:
            self._console.stop()
        self._finished = True
        _unfinished.discard(self)
        self._media.close()   # bounded: the files the daemon was told of get written
        if self._watch_media is not None:
            self._watch_media.close()
        code = exit_code if isinstance(exit_code, int) else 0
        for why, n in self.num_refused.items():
            if n > 1:              # the first was sent as it came: the total now
                self._client.get().event(REFUSED_EVENT, {"type": why, "count": n})
        self._say_sync()
        self._client.get().event("train_end", {"status": "failed" if code else "finished", "exit_code": code})
        self._client.close()
        if self._runtime is not None:
            from telemetry.client import autostart

            autostart.drain_started(self._runtime)

    def _say_sync(self) -> None:
        """Offline, as W&B at finish: the command that uploads the run (its directory is the
        daemon's W&B run's), on rank 0 unless $WANDB_SILENT."""
        if self.mode != "offline" or self.rank != 0 or \
                os.environ.get("WANDB_SILENT", "").lower() in ("1", "true", "yes"):
            return
        files = self._w_b("dir")
        if files:
            print(f"wandb: You can sync this run to the cloud by running:\nwandb: wandb sync "
                  f"{os.path.dirname(files.rstrip(os.sep))}", file=sys.stderr, flush=True)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        self.finish(exit_code=1 if exc_type is not None else None)

    def _label(self, *args: Any, **kwargs: Any) -> None:
        """W&B's own bookkeeping of which integration made the run (transformers calls it): nothing
        to keep here."""

    def __getattr__(self, name: str) -> Any:
        if name in UNSUPPORTED_RUN_METHODS:
            return Unsupported(f"run.{name}")
        raise AttributeError(f"telemetry.wandb Run has no attribute {name!r}")

    # -- what the daemon hears -----------------------------------------------------------------
    def _send_hello(self) -> None:
        if self._finished:
            return
        wandb_info = {k: v for k, v in (("project", self.project), ("name", self._name), ("entity", self._entity),
                                        ("group", self.group), ("tags", list(self.tags)), ("notes", self.notes),
                                        ("job_type", self.job_type), ("id", self.id)) if v}
        wandb_info["metrics"] = self._metrics
        wandb_info["meta"] = self._meta
        if self._files_root:
            wandb_info["dir"] = self._files_root
        self._client.get().hello({
            "framework": self.framework,
            "config": self.config.as_dict(),
            "wandb": wandb_info,
            # The ranks the daemon waits for at each step: a rank above 0 that logs means every
            # rank does; rank 0 alone promises only itself (see the module docstring).
            "world_size": self.world_size if self.rank > 0 else 1,
        })

    def _send_summary(self, values: dict[str, Any], replaced: list[list[str]]) -> None:
        """run.summary set: the flat values, and the paths whose value they replace (a key set
        whole, or the path of an edit through a nested value: what was under it goes, as in
        W&B; the rest under its key stays)."""
        data = {}
        for k, v in values.items():
            if hasattr(v, "detach"):
                if v.numel() > INLINE_ARRAY:
                    self._refuse(k, f"a tensor of {v.numel()} elements in run.summary (up to {INLINE_ARRAY} are kept, "
                                    f"as a list)")
                    continue
                # CPU-GPU sync point on a device tensor: a summary is set once, not per step.
                # W&B keeps a one-element tensor as its number, a longer one as a list.
                v = v.item() if v.numel() == 1 else v.detach().cpu().tolist()
            elif _is_array(v):
                if v.size > INLINE_ARRAY:
                    self._refuse(k, f"a numpy array of {v.size} elements in run.summary (up to {INLINE_ARRAY} are "
                                    f"kept, as a list)")
                    continue
                v = v.tolist()                 # W&B's: a list (a one-element array: its list too)
            elif isinstance(v, Histogram):
                v = v.as_json()                # W&B's summary holds the histogram's JSON
            elif isinstance(v, Media):
                self._refuse(k, f"wandb.{type(v).__name__} in run.summary (log it instead)")
                continue
            data[k] = v
        if (data or replaced) and not self._finished:
            client = self._client.get()
            client.event(SUMMARY_AT_EVENT, {"step": self._step - 1, "replace": replaced})
            client.event(SUMMARY_EVENT, data)

    def _send_summary_remove(self, paths: list[tuple[str, ...]]) -> None:
        if not self._finished:
            self._client.get().event(SUMMARY_REMOVE_EVENT, {"step": self._step - 1,
                                                            "paths": [list(p) for p in paths]})

    def _send_call(self, data: dict) -> None:
        """A W&B call for the daemon's run to make (wandb_calls.py): after this step's values."""
        if not self._finished:
            self._client.get().event(CALL_EVENT, data)

    def _send_console(self, stream: str, text: str) -> None:
        if not self._finished:
            self._client.get().event(CONSOLE_EVENT, {"stream": stream, "text": text})

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def _register_exit_hook() -> None:
    """After each run's client exists: exit hooks run last-registered first, so this one sends
    the pending rows and finishes every open run before the client's own hook closes the clients
    and before any daemon this process started drains at exit (autostart registers that drain
    when it starts a daemon: a second run's, after the first run registered this hook; so it is
    moved after it each time). The script's exit code is watched as W&B watches it (sys.exit's
    argument, an uncaught exception: 1), so a run left open finishes with it."""
    global _exit_hook_registered
    atexit.unregister(_finish_all)
    atexit.register(_finish_all)
    if not _exit_hook_registered:
        _exit_hook_registered = True
        _watch_exit_code()


# The exit code the script is leaving with, as far as the hooks saw (None: a normal end, 0).
_exit_code: int | None = None


def _watch_exit_code() -> None:
    """Wrap sys.exit and sys.excepthook (each calls the one it replaced) to note the code: W&B's
    (its ExitHooks): sys.exit's int, 0 for None, 1 for anything else; 1 for an uncaught
    exception, 255 for Ctrl-C."""
    exit_, excepthook = sys.exit, sys.excepthook

    def exit(status: object = None) -> None:
        global _exit_code
        _exit_code = status if isinstance(status, int) else (0 if status is None else 1)
        exit_(status)

    def hook(exc_type, exc, tb) -> None:
        global _exit_code
        _exit_code = 255 if issubclass(exc_type, KeyboardInterrupt) else 1
        excepthook(exc_type, exc, tb)

    sys.exit = exit
    sys.excepthook = hook


def _finish_all() -> None:
    for run in list(_unfinished):
        if run._pid != os.getpid():
            continue               # a forked child's copy of its parent's run: the parent's to finish
        try:
            run.finish(exit_code=_exit_code)
        except Exception:
            pass


def files_root(dir: str | None) -> str | None:
    """W&B's root_dir for `dir` (wandb.init's dir=, $WANDB_DIR): its absolute path, created as
    W&B creates it; None when none was given, or (with one warning, as W&B warns) when it cannot
    be created or read and written: the daemon's run directory then holds W&B's files (W&B would
    fall back to the system's temporary directory)."""
    if not dir:
        return None
    path = os.path.abspath(os.path.expanduser(os.fspath(dir)))
    try:
        os.makedirs(path, exist_ok=True)
        ok = os.access(path, os.W_OK | os.R_OK)
        why = f"Path {path} wasn't read/writable"
    except OSError:
        ok, why = False, f"Unable to create root directory {path}"
    if not ok:
        warnings.warn(f"telemetry.wandb: {why}: W&B's files go to the telemetry run directory instead",
                      RuntimeWarning, stacklevel=4)
        return None
    return path


def script_meta(start_time: float) -> dict:
    """What W&B records of the process that made the run (its wandb-metadata: program, code
    path, args, host, python, start), taken here, as W&B's settings take them in that process:
    the program is $WANDB_PROGRAM, else __main__'s file, else "-m <module>"; its code path is
    relative to the git root (else the working directory), None outside it."""
    import platform
    import socket

    program = os.environ.get("WANDB_PROGRAM")
    if program is None:
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and getattr(spec, "name", None):
            program = f"-m {spec.name}"
        else:
            program = getattr(main, "__file__", None)
    cwd = os.getcwd()
    meta: dict[str, Any] = {"args": [str(a) for a in sys.argv[1:]], "host": socket.gethostname(),
                            "python": f"{platform.python_implementation()} {platform.python_version()}",
                            "executable": sys.executable, "start_time": start_time, "cwd": cwd}
    if not program:
        return meta
    meta["program"] = str(program)
    root = _git_root(cwd) or cwd
    full = os.path.abspath(os.path.join(cwd, str(program)))
    if os.path.exists(full):
        meta["program_abspath"] = full
        rel = os.path.relpath(full, root)
        if "../" not in rel:
            meta["program_relpath"] = rel
    return meta


def _git_root(start: str) -> str | None:
    """The nearest directory at or above `start` holding `.git` (what git and W&B's GitRepo find)."""
    d = start
    while True:
        if os.path.exists(os.path.join(d, ".git")):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def new_run_id() -> str:
    """Eight lowercase letters and digits, as W&B's run ids."""
    from telemetry.client.autostart import new_run_id as new

    return new()


def daemon_run_info(run_id: str, wait_s: float, control: str | None = None) -> tuple[dict, str | None]:
    """The daemon's W&B run as it gives it (id, name, project, entity, path, url, dir), once it is
    this run (`run_id`), waiting up to `wait_s` for it to open (0: one look). Returns (info, why):
    the run's info and ""; or {} and why there is, and will be, no such run to ask (no daemon to
    ask, W&B off in the daemon, its W&B run is another one, W&B refused to make it); or {} and
    None when W&B was still starting in the daemon when the wait ended (asked again, it may know).
    control: the daemon's control endpoint (None: the default)."""
    from telemetry.shared import endpoints
    from telemetry.shared import control as control_requests

    try:
        ep = control or endpoints.resolve("control")
    except Exception:
        return {}, "no telemetry daemon to ask" + NOT_UPLOADED
    if ep.startswith("ipc://") and not os.path.exists(ep[len("ipc://"):]):
        return {}, "no telemetry daemon to ask" + NOT_UPLOADED
    deadline = time.monotonic() + wait_s
    while True:
        try:
            sink = control_requests.request(ep, "status", timeout_s=max(0.5, deadline - time.monotonic())).get("sinks", {})
        except Exception:
            return {}, ("the telemetry daemon did not answer: its files are uploaded at the run's finish only if "
                        "the daemon has this W&B run")
        w = sink.get("wandb") if isinstance(sink, dict) else None
        if not isinstance(w, dict):
            return {}, "W&B is off in the telemetry daemon" + NOT_UPLOADED
        info = w.get("run")
        if isinstance(info, dict) and info.get("id") == run_id:
            return info, ""
        if isinstance(info, dict) and info.get("id"):
            return {}, "the telemetry daemon's W&B run is another run" + NOT_UPLOADED
        # W&B refused the run (the sink says why in open_error, and does not try again), or the
        # sink failed (no wandb to import): either way no run will open.
        if w.get("open_error") or w.get("errors"):
            why = w.get("open_error") or w.get("last_error") or "failed"
            return {}, f"W&B could not make the run in the telemetry daemon ({why}){NOT_UPLOADED}"
        if time.monotonic() > deadline:
            return {}, None
        time.sleep(0.1)


def console_wanted(setting: str | None) -> bool:
    """W&B's console capture unless turned off (init settings, else $WANDB_CONSOLE)."""
    value = setting if setting is not None else os.environ.get("WANDB_CONSOLE", "auto")
    return str(value).lower() not in ("off", "false", "0")


class ConsoleCapture:
    """W&B's console capture ("wrap_raw"): each write to sys.stdout and sys.stderr is also kept
    for `send(stream, text)`; the stream's own write is called first and is what the caller gets.

    A write only appends to a buffer; the buffer goes to the daemon, consecutive
    writes of a stream as one event, on the thread that trains at moments it already spends on
    telemetry: a committed row at most once a FLUSH_S (`flush_due`), a buffer past MAX_BUFFER,
    and finish. Sent at each write, a print would cost the training thread two events. Other
    threads' writes are kept too; only the thread that made the run sends (the client's socket is
    not shared between threads)."""

    FLUSH_S = 1.0
    MAX_BUFFER = 64 * 1024
    # Characters per event: a frame stays far below the daemon's 1 MiB limit (a larger one would
    # cost the connection), whatever one write holds.
    MAX_EVENT_CHARS = 64 * 1024
    # Kept while the thread that sends does not flush (other threads printing while it waits):
    # beyond, writes are not kept, counted in `num_dropped_chars` and said at the next flush.
    MAX_HELD = 4 * 1024 * 1024

    def __init__(self, send) -> None:
        self._send = send
        self._buf: list[tuple[str, str]] = []
        self._size = 0
        self._last_flush = time.monotonic()
        self._flushing = False
        self.num_dropped_chars = 0
        self._said_dropped = 0
        self._owner = threading.get_ident()      # the client's socket is this thread's: only it sends
        self._wrapped: list[tuple[object, object]] = []
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name, None)
            write = getattr(stream, "write", None)
            if write is None:
                continue
            own = "write" in getattr(stream, "__dict__", {})     # someone's wrapper already: put it back
            try:
                stream.write = self._wrap(name, write)
            except (AttributeError, TypeError):
                continue                    # a stream that takes no attribute: not captured
            self._wrapped.append((stream, write if own else None))

    def _wrap(self, name: str, write):
        buf = self._buf

        def captured(text, *args, **kwargs):
            n = write(text, *args, **kwargs)
            if text and isinstance(text, str):
                sender = threading.get_ident() == self._owner
                if not sender and self._size + len(text) > self.MAX_HELD:
                    self.num_dropped_chars += len(text)
                else:
                    buf.append((name, text))
                    self._size += len(text)
                if sender and self._size > self.MAX_BUFFER and not self._flushing:
                    self.flush()
            return n

        return captured

    def flush_due(self) -> None:
        """Flush if there is output and FLUSH_S has passed since the last flush."""
        if self._buf and time.monotonic() - self._last_flush >= self.FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Send what was written: one event per run of writes to one stream."""
        self._last_flush = time.monotonic()
        if not self._buf or self._flushing:
            return
        self._flushing = True            # what sending prints (a warning) waits for the next flush
        try:
            taken = self._buf[:]
            del self._buf[:len(taken)]
            self._size = 0
            if self.num_dropped_chars > self._said_dropped:
                taken.append(("stderr", f"[telemetry: {self.num_dropped_chars - self._said_dropped} characters of "
                                        f"console output not kept (written faster than sent)]\n"))
                self._said_dropped = self.num_dropped_chars
            stream, parts = taken[0][0], []
            for name, text in taken + [("", "")]:
                if name != stream:
                    joined = "".join(parts)
                    for i in range(0, len(joined), self.MAX_EVENT_CHARS):
                        self._send(stream, joined[i:i + self.MAX_EVENT_CHARS])
                    stream, parts = name, []
                parts.append(text)
        except Exception:
            pass
        finally:
            self._flushing = False

    def stop(self) -> None:
        """Put the streams' writes back and send what is left."""
        self.flush()
        for stream, write in self._wrapped:
            try:
                if write is None:
                    del stream.write        # the instance attribute: the class's write again
                else:
                    stream.write = write
            except AttributeError:
                pass
        self._wrapped = []
