"""A drop-in for the part of the W&B API training scripts use, over the telemetry sidecar:

    import telemetry.wandb as wandb      # the one line that changes
    wandb.init(project="gpt2", name="run-1", config=cfg, group="ddp", tags=["baseline"])
    wandb.log({"train/loss": loss, "lr": lr})   # tensors on any device: no host-device sync
    wandb.run.summary["best_val"] = best
    wandb.finish()

A run is its run id (`id=`, $WANDB_RUN_ID, `telemetry run`'s, else a new one), and each run has a
daemon of its own (its_daemon): runs with distinct ids (a sweep's trials, forked children,
k-fold's folds, ranks that each init without a shared id) are runs of their own, as in W&B.
Ranks that share an id (every rank under `telemetry run`, or torchrun with $WANDB_RUN_ID; or
rank 0 alone, as W&B scripts usually do) share one daemon (two processes that would be the
same rank of it are two runs, as in W&B: _rank_of_its_own): it aggregates the ranks' rows (mean by
default, see the daemon's reductions) and its W&B sink opens the one real run with the project,
name, config, group and tags given to `init`. The run ends with the script's exit code. wandb itself is never
imported in the training process. Step and commit rules, nested keys, what is refused and why:
telemetry/integrations/wandb_run.py; `Image`, `Histogram`, `Table`, `Html` and `Audio`, passed through to the
daemon's run: telemetry/integrations/wandb_media.py; artifacts, models, `save`, `log_code`,
`alert`, `mark_preempting`, made by the daemon's run: telemetry/integrations/wandb_calls.py. What
W&B offers beyond this subset raises an error naming it.

`run`, `config` and `summary` are looked up at each access (a module `__getattr__`), so
`wandb.run` read after `init` is the new run, as in W&B. Importing this module costs what
importing telemetry's client costs; torch is never imported here.
"""
from __future__ import annotations

import os
import stat
import sys
import types
from typing import Any

from telemetry.integrations._client import process_rank
from telemetry.integrations.wandb_calls import AlertLevel, Artifact, plot
from telemetry.integrations.wandb_media import Audio, Histogram, Html, Image, Media, Table
from telemetry.integrations.wandb_objects import (CONFIG_DEFAULTS_FILE, AuthenticationError, CommError, Error, PreInit,
                                                  ServerResponseError, Unsupported, UnsupportedError, UsageError,
                                                  config_dict, config_from_file)
from telemetry.integrations.wandb_run import ENV_RUN_ID, Run, new_run_id, run_in_use
from telemetry.integrations.wandb_settings import MODE_NAMES, REINITS, check_init, check_settings, lax_bool, sink_mode

__all__ = ["init", "log", "finish", "define_metric", "watch", "unwatch", "login", "setup", "teardown", "Settings",
           "Error", "UsageError",
           "Artifact", "AlertLevel", "plot", "save", "log_artifact", "use_artifact", "log_model", "alert",
           "mark_preempting",
           "termlog", "termwarn", "termerror", "require",
           "Run", "Image", "Table", "Histogram", "Audio", "Video", "Html", "Object3D", "Molecule",
           "Plotly", "Graph"]

# `wandb.errors`, as W&B's (a script's `except wandb.errors.UsageError:`); under `telemetry run
# --as-wandb`, `import wandb.errors` finds the same classes (as_wandb/wandb/errors.py).
errors = types.ModuleType("wandb.errors", "W&B's error classes, as the drop-in raises them.")
errors.__dict__.update({c.__name__: c for c in (Error, CommError, AuthenticationError, UsageError, UnsupportedError)})
errors.__all__ = [k for k in errors.__dict__ if not k.startswith("_")]

# init() arguments that change what W&B does in ways the daemon's run cannot follow.
_UNSUPPORTED_INIT_ARGS = ("sync_tensorboard", "monitor_gym", "resume_from", "fork_from", "tensorboard")
# Module attributes of W&B that this module does not offer: using one raises, naming it (see
# Unsupported: a stand-in, so that hasattr() on them stays harmless).
_UNSUPPORTED = frozenset({
    "restore", "use_model", "link_model",
    "sweep", "agent", "controller", "plot_table", "Api", "apis", "tensorboard",
    "attach", "mark_preempting",
    "Classes", "ImageMask", "BoundingBoxes2D"})

_run: Run | None = None
# wandb.setup's settings (W&B's field names): every later init of the process takes them for the
# arguments it is not given (a forked child too: it inherits them, as W&B's singleton).
_setup_settings: dict[str, Any] = {}
_setup: "WandbSetup | None" = None

# `sys.modules["wandb"] = telemetry.wandb`, the shortcut a user tries: the submodules the
# integrations import from inside W&B (transformers' `wandb.sdk.lib.config_util`, Lightning's
# `wandb.wandb_run`) are found in the package `telemetry run --as-wandb` uses.
__path__ = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "integrations", "as_wandb", "wandb")]


# Image, Histogram, Table, Html and Audio are passed through to the daemon's W&B run; these are refused by
# name when logged (a script may still build them).
class Video(Media):
    pass


class Object3D(Media):
    pass


class Molecule(Media):
    pass


class Plotly(Media):
    pass


class Graph(Media):
    pass


class Settings:
    """Accepted for `init(settings=wandb.Settings(...))`; the daemon's W&B run has its own. The
    fields W&B's Settings validates that a script is likely to set (console, mode, project, the
    run's name and tags, ...) are refused as W&B refuses them (wandb_settings.check_settings)."""

    def __init__(self, **kwargs: Any) -> None:
        check_settings(kwargs)
        self.__dict__.update(kwargs)


def termlog(string: str = "", newline: bool = True, repeat: bool = True, prefix: bool = True) -> None:
    """Print a line as W&B does (on stderr, "wandb: " first)."""
    print(("wandb: " if prefix else "") + str(string), end="\n" if newline else "", file=sys.stderr, flush=True)


def termwarn(string: str = "", newline: bool = True, repeat: bool = True, prefix: bool = True) -> None:
    termlog(("WARNING " if prefix else "") + str(string), newline, repeat, prefix)


def termerror(string: str = "", newline: bool = True, repeat: bool = True, prefix: bool = True) -> None:
    termlog(("ERROR " if prefix else "") + str(string), newline, repeat, prefix)


def require(*args: Any, **kwargs: Any) -> None:
    """A no-op: W&B's opt-in features ("service", ...) are its own process's; the daemon is ours."""


class WandbSetup:
    """What `wandb.setup()` returns (W&B's process-wide setup object), as far as a script reads
    it: the settings it holds."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __repr__(self) -> str:
        return f"<WandbSetup settings={vars(self.settings)!r}>"


def setup(settings: Settings | None = None) -> WandbSetup:
    """W&B's `wandb.setup`: what it prepares (W&B's service) is the daemon here, started by
    `init` when a run needs one, so it starts nothing; its Settings apply to this process's
    later inits as W&B's global settings do, each init argument given taking precedence: the
    project, entity, the run's name, id, group, tags, notes and job type, mode, dir, console,
    and `config_paths` (their files read into each run's config, over the init's config, as
    W&B 0.31 reads them). Called again, its settings update the earlier ones; it returns the
    one setup object of the process until `teardown`, as W&B's. A dict of settings raises
    W&B 0.31's AttributeError (its docs show one; its code takes a Settings alone)."""
    global _setup
    if isinstance(settings, dict):
        raise AttributeError("'dict' object has no attribute 'model_fields_set'")
    if settings is not None:
        _setup_settings.update((k, v) for k, v in vars(settings).items() if v is not None)
    if _setup is None:
        _setup = WandbSetup(Settings())
    _setup.settings = Settings(**_setup_settings)
    return _setup


def teardown(exit_code: int | None = None) -> None:
    """W&B's `wandb.teardown`: finishes this process's runs not finished yet (with `exit_code`),
    and forgets wandb.setup's settings."""
    global _run, _setup
    from telemetry.integrations import wandb_run

    for run in list(wandb_run._unfinished):
        if run._pid == os.getpid():
            run.finish(exit_code=exit_code)
    _run = None
    _setup = None
    _setup_settings.clear()


def _or_setup(value: Any, field: str) -> Any:
    """An init argument, or when not given, wandb.setup's setting `field` for it (None without)."""
    return value if value is not None else _setup_settings.get(field)


def login(*args: Any, **kwargs: Any) -> bool:
    """Nothing to log in to here (the daemon holds the W&B credentials); answers as W&B does:
    False offline ($WANDB_MODE or mode="offline"), else whether an API key is configured."""
    mode = kwargs.get("mode") or os.environ.get("WANDB_MODE")
    if mode in ("offline", "dryrun", "disabled"):
        termwarn("Unable to verify login in offline mode.")
        return False
    return bool(kwargs.get("key") or os.environ.get("WANDB_API_KEY") or _netrc_has_key())


def _netrc_has_key() -> bool:
    import netrc

    try:
        path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
        return netrc.netrc(path).authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def init(project: str | None = None, name: str | None = None, config: Any = None, entity: str | None = None,
         group: str | None = None, tags: Any = None, mode: str | None = None, dir: str | None = None,
         resume: Any = None, id: str | None = None, notes: str | None = None, job_type: str | None = None,
         reinit: Any = None, settings: Any = None, config_exclude_keys: Any = None,
         config_include_keys: Any = None, allow_val_change: bool | None = None, save_code: bool | None = None,
         anonymous: str | None = None, magic: Any = None, **unsupported: Any) -> Run:
    """Start a run, as wandb.init does; returns it (also `wandb.run`).

    project, name, entity, group, tags, notes, job_type, id and config reach the daemon's W&B
    run (defaults from $WANDB_PROJECT, $WANDB_NAME, ...). mode="disabled" (or $WANDB_MODE)
    gives a run that sends nothing; "online"/"offline" are the daemon's to choose (its
    `wandb.mode`). resume, dir, settings, save_code are accepted: the daemon resumes its own run.
    With a run active, as W&B: reinit=True or "finish_previous" finishes it first, "create_new"
    makes another beside it (returned, not `wandb.run`), anything else returns it.

    The run's id (`id=`, $WANDB_RUN_ID, else the launcher's $TELEMETRY_RUN_ID for the first run
    of the process, else a new one) is its identity: it has a daemon of its own (its_daemon).
    """
    global _run
    for key in _UNSUPPORTED_INIT_ARGS:
        if unsupported.pop(key, None):
            raise NotImplementedError(f"telemetry.wandb does not support wandb.init({key}=...)")
    if unsupported:
        raise TypeError(f"wandb.init() got unexpected keyword arguments: {', '.join(sorted(unsupported))}")
    # wandb.setup's settings, for the arguments this init is not given.
    project, entity = _or_setup(project, "project"), _or_setup(entity, "entity")
    name, group, tags = _or_setup(name, "run_name"), _or_setup(group, "run_group"), _or_setup(tags, "run_tags")
    notes, job_type, id = _or_setup(notes, "run_notes"), _or_setup(job_type, "run_job_type"), _or_setup(id, "run_id")
    mode, dir = _or_setup(mode, "mode"), _or_setup(dir, "root_dir")
    if settings is None and "console" in _setup_settings:
        settings = {"console": _setup_settings["console"]}
    # What W&B's init refuses (its Settings' rules) raises here, before any run exists: the
    # daemon's W&B run, made from the same values, could not be made.
    check_init({"job_type": job_type, "dir": dir, "project": project, "entity": entity, "reinit": reinit,
                "tags": tags, "group": group, "name": name, "notes": notes, "mode": mode, "resume": resume,
                "save_code": save_code, "id": id})
    if isinstance(settings, dict):
        check_settings(settings)
    if reinit is not None and reinit not in REINITS:
        reinit = lax_bool(reinit)       # as W&B reads it: 1 or "yes" is True
    mode = mode or os.environ.get("WANDB_MODE") or _default_mode()
    # W&B's older names: "dryrun" for offline (Lightning's WandbLogger sets it), "run" for online.
    mode = MODE_NAMES.get(mode, mode)
    if _run is not None and not _run._finished and _run._pid == os.getpid():
        if reinit in (True, "finish_previous"):
            if not _silent():
                termlog(f"Finishing previous runs because reinit is set to {reinit!r}.")
            _run.finish()
        elif reinit != "create_new":
            if not _silent():      # W&B's words: the arguments of this call are not used
                termlog(f"wandb.init() called while a run is active and reinit is set to "
                        f"{'default' if reinit is None else reinit!r}, so returning the previous run.")
            return _run
    cfg = config_dict(config)
    if config_include_keys:
        cfg = {k: v for k, v in cfg.items() if k in set(config_include_keys)}
    if config_exclude_keys:
        cfg = {k: v for k, v in cfg.items() if k not in set(config_exclude_keys)}
    # As W&B 0.31's init: `config-defaults.yaml` in the working directory under the config given
    # (each of its keys replaces the file's), the files of wandb.setup's `config_paths` over it.
    cfg = {**config_from_file(CONFIG_DEFAULTS_FILE), **cfg}
    for path in _setup_settings.get("config_paths", ()):
        cfg.update(config_from_file(path))
    env = os.environ.get
    env_tags = env("WANDB_TAGS")
    client = None
    if mode == "disabled":
        from telemetry.client import DisabledClient

        client = DisabledClient()
    rank, world_size = process_rank()
    # One id for the script's run, the daemon's run directory and the W&B run the daemon opens.
    run_id = id if id is not None else env("WANDB_RUN_ID")       # checked above, as W&B checks it
    launch_id = _launcher_run_id()           # this process's first run may be the launch's
    if launch_id is not None and client is None and not _launch_takes(run_id or launch_id, rank):
        launch_id = None                     # the launch's run is another's: this one is a run of its own
    run_id = run_id or launch_id
    if run_id and client is None and run_in_use(run_id):
        raise ServerResponseError(f"run ID {run_id} is in use")      # W&B's words
    made_here = not run_id
    run_id = run_id or new_run_id()
    runtime = None
    if client is None:
        # No daemon for this run: start one, as wandb.init starts W&B's service.
        from telemetry.client import autostart

        runtime = its_daemon(run_id, launch=launch_id is not None)
        copy = 1
        if made_here and runtime is not None:
            # An id made here, on a daemon of the run's own: no other process can name this run
            # (W&B's run per rank when every rank inits), so this process is its only rank.
            rank, world_size = 0, 1
        elif runtime is not None:
            runtime, copy = _rank_of_its_own(run_id, runtime, rank)
        autostart.ensure_daemon("telemetry.wandb", run_id=run_id, run_name=name or env("WANDB_NAME"),
                                wandb_mode=sink_mode(mode),
                                root=dir or env("WANDB_DIR"), runtime=runtime, copy=copy)
    console = settings.get("console") if isinstance(settings, dict) else getattr(settings, "console", None)
    # W&B's own project for a run that names none: "uncategorized" (a disabled run's: "dummy");
    # the daemon's default project ("telemetry") is for its own runs, never a script's.
    project = project or env("WANDB_PROJECT") or ("dummy" if mode == "disabled" else "uncategorized")
    run = Run(project=project, name=name or env("WANDB_NAME"), config=cfg,
              entity=entity or env("WANDB_ENTITY"), group=group or env("WANDB_RUN_GROUP"),
              tags=tags if tags is not None else (env_tags.split(",") if env_tags else None),
              notes=notes or env("WANDB_NOTES"), job_type=job_type or env("WANDB_JOB_TYPE"),
              id=run_id, dir=dir or env("WANDB_DIR"), mode=mode, client=client, rank=rank, world_size=world_size,
              settings_console=console, runtime=runtime)
    if reinit != "create_new":         # as W&B: a run made beside the active one is not wandb.run
        _run = run
    return run


def _default_mode() -> str:
    """W&B's mode when none is given: the launcher's (`telemetry run` sets $TELEMETRY_WANDB_MODE
    for the script's runs), else W&B's own rule: online when an API key is configured, else
    offline, said once as W&B says it (the command that syncs the run is printed at finish)."""
    from telemetry.client import autostart

    launcher = os.environ.get(autostart.ENV_WANDB_MODE)
    if launcher in ("online", "offline"):
        return launcher
    if launcher == "disabled":
        return "offline"     # the launcher's W&B is off; the run still logs to its daemon (not a stand-in)
    if login(mode="online"):
        return "online"
    if not _silent():
        termlog("telemetry.wandb: no W&B API key configured ($WANDB_API_KEY or `wandb login`): the run is offline; "
                "`wandb sync` uploads it later (the command is printed at finish). Set WANDB_MODE to choose.")
    return "offline"


def _silent() -> bool:
    return os.environ.get("WANDB_SILENT", "").lower() in ("1", "true", "yes")


def its_daemon(run_id: str, launch: bool = False):
    """The runtime directory of the daemon run `run_id` gets to itself (autostart.run_runtime_dir),
    or None for the default endpoints: a launcher's daemon for this run (`telemetry run`: its
    $TELEMETRY_RUN_ID, or the id the launched script's first run claimed: _launch_takes),
    $TELEMETRY_ENDPOINT (a daemon you run: it takes what it is sent), a daemon started by hand
    on the node's default endpoints outside a launcher, or no daemon wanted
    ($TELEMETRY_AUTOSTART=0). So runs with distinct ids (sweep trials, forked children, k-fold's
    folds, ranks that each name their own run) never share a daemon, and ranks that share an id
    (torchrun with $WANDB_RUN_ID, `telemetry run`) share one. `launch`: this run is the launch's
    (_launch_takes)."""
    from telemetry.client import autostart
    from telemetry.shared import endpoints

    env = os.environ.get
    if env(endpoints.ENV_INGEST) or launch or run_id == env(ENV_RUN_ID) or not autostart.wanted(True):
        return None
    try:
        if not env(ENV_RUN_ID) and endpoints.daemon_serves(endpoints.runtime_dir()):
            return None
        return autostart.run_runtime_dir(run_id)
    except (endpoints.EndpointError, OSError):
        return None        # ensure_daemon says why the default directory cannot serve either


# The ranks this process holds of the runs on daemons of their own: (runtime directory, rank) ->
# the descriptor holding `rank-<rank>.lock` there (flock, for the process's life).
_rank_claims: dict[tuple[str, int], int] = {}
# Copies of one id a node keeps apart at most (then the last is shared, as before).
MAX_COPIES = 16


def _rank_of_its_own(run_id: str, runtime, rank: int):
    """(the runtime directory, the copy) of run `run_id` in which this process is rank `rank`:
    the run's own (copy 1) unless another live process already is that rank of it (two scripts
    started with one $WANDB_RUN_ID, both rank 0); then the first copy where the rank is free,
    a run of its own as W&B keeps two runs of one id apart (its directory `<id>.<copy>`), said
    on stderr. Ranks that differ (torchrun's with a shared id) meet in one run, their values
    reduced, as before; a rank restarted by an elastic launcher finds its rank free again."""
    from telemetry.client import autostart

    holder = None
    for copy in range(1, MAX_COPIES + 1):
        directory = runtime if copy == 1 else autostart.run_runtime_dir(f"{run_id}.{copy}")
        taken_by = _claim_rank(directory, rank)
        if taken_by is None:
            break
        holder = holder or taken_by
    if holder is not None:
        print(f"telemetry.wandb: run {run_id}: another process (pid {holder}) is already rank {rank} of run {run_id} "
              f"on this node; this one is a run of its own, as W&B keeps two runs of one id apart: its files go "
              f"to telemetry/{run_id}.{copy}/, not to the other's", file=sys.stderr, flush=True)
    return directory, copy


def _claim_rank(directory, rank: int) -> str | None:
    """None once this process holds rank `rank` of the run served from `directory`; else who
    holds it (its pid, as written in the lock file)."""
    import fcntl

    path = directory / f"rank-{rank}.lock"
    held = _rank_claims.get((str(directory), rank))
    if held is not None:
        try:
            if os.fstat(held).st_ino == os.stat(path, follow_symlinks=False).st_ino:
                return None
        except OSError:
            pass
        os.close(_rank_claims.pop((str(directory), rank)))     # its directory went with its daemon
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None          # nothing to claim with: as before, the run's own daemon
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 16, 0).decode(errors="replace").strip()
        os.close(fd)
        return holder if holder.isdigit() else "?"
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _rank_claims[(str(directory), rank)] = fd
    return None


def _launch_takes(run_id: str, rank: int) -> bool:
    """Whether the first run of this process, of id `run_id`, made by rank `rank`, is the run
    `telemetry run`'s daemon serves. That is the first run a process of the launched script
    names to it (its own id: `wandb.init(id=..., resume="allow")` or $WANDB_RUN_ID; else the
    launch's id), claimed here, and the runs of that id that the claimant's other ranks make
    (early or late: a rank may start after another has ended), in this attempt or a later one of
    an elastic launcher. Any other run is one of its own, as in W&B: another id (a sweep's
    trials), or the same id from the claimant's own rank in its attempt (a retry, an evaluation
    subprocess, a driver's run after its trial's, mp.spawn children that never set up their
    process group)."""
    attempt = _restart_count()
    claim = _claim_launch(run_id, rank, attempt)
    if claim is None:                       # the claim cannot be kept: the launch's own id alone
        return run_id == os.environ.get(ENV_RUN_ID)
    claimed, pid, claimant_rank, claimant_attempt = claim
    # A rank restarted by an elastic launcher (torchrun --max-restarts) is the claimant's rank
    # again, in a later attempt: the same run.
    return claimed == run_id and (pid == os.getpid() or claimant_rank != rank or attempt > claimant_attempt)


def _restart_count() -> int:
    """The elastic launcher's attempt of this process (torchrun's $TORCHELASTIC_RESTART_COUNT), 0 alone."""
    value = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    return int(value) if value.isdigit() else 0


def _claim_launch(run_id: str, rank: int, attempt: int) -> tuple[str, int, int, int] | None:
    """The claim of the launch's run, made by this process (rank `rank`, the launcher's attempt
    `attempt`) for `run_id` if none was: (the id, the claimant's pid, rank and attempt). Kept in the launcher's private runtime directory, written
    whole and linked in at once (two ranks of one id find one answer). None when the directory
    cannot be used (not this user's alone) or the claim there is not one."""
    from telemetry.shared import endpoints

    try:
        fd = os.open(endpoints.runtime_dir(), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, endpoints.EndpointError):
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        tmp = f".{endpoints.LAUNCH_CLAIM_FILE}.{os.getpid()}.{os.urandom(4).hex()}"
        wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            os.write(wfd, f"{run_id}\n{os.getpid()} {rank} {attempt}\n".encode())
        finally:
            os.close(wfd)
        try:
            os.link(tmp, endpoints.LAUNCH_CLAIM_FILE, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp, dir_fd=fd)
        rfd = os.open(endpoints.LAUNCH_CLAIM_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
        try:
            if not stat.S_ISREG(os.fstat(rfd).st_mode):
                return None
            data = os.read(rfd, 4096).decode(errors="replace")
        finally:
            os.close(rfd)
        claimed, _, who = data.partition("\n")
        fields = who.split()
        return (claimed, *map(int, fields)) if len(fields) == 3 and all(f.isascii() and f.isdigit() for f in fields) \
            else None
    except OSError:
        return None
    finally:
        os.close(fd)


# The launcher's run id ($TELEMETRY_RUN_ID: `telemetry run`'s) names the first run this process
# makes: its ranks share it, each from its own process. A second run of the process (k-fold's next
# fold) and a forked child's runs are runs of their own, with ids of their own, as in W&B.
_launcher_id_used = False


def _launcher_run_id() -> str | None:
    global _launcher_id_used
    if _launcher_id_used:
        return None
    _launcher_id_used = True
    return os.environ.get(ENV_RUN_ID)


def _forked_child() -> None:
    global _launcher_id_used
    _launcher_id_used = True
    # The parent's ranks stay the parent's: a child that inits one of its runs is another process.
    for fd in _rank_claims.values():
        os.close(fd)
    _rank_claims.clear()


os.register_at_fork(after_in_child=_forked_child)


def _active(what: str) -> Run:
    if _run is None or _run._finished:
        raise Error(f"You must call wandb.init() before wandb.{what}")
    return _run


def log(data: dict[str, Any], step: int | None = None, commit: bool | None = None) -> None:
    """wandb.log on the current run: W&B's step and commit rules; never blocks, never syncs."""
    _active("log()").log(data, step=step, commit=commit)


def define_metric(name: str, *args: Any, **kwargs: Any) -> Any:
    return _active("define_metric()").define_metric(name, *args, **kwargs)


def watch(models: Any, criterion: Any = None, log: str | None = "gradients", log_freq: int = 1000,
          idx: int | None = None, log_graph: bool = False) -> list:
    """W&B's gradient/parameter histograms of `models`, computed off the training thread."""
    return _active("watch()").watch(models, criterion, log=log, log_freq=log_freq, idx=idx, log_graph=log_graph)


def unwatch(models: Any = None) -> None:
    if _run is not None and not _run._finished:
        _run.unwatch(models)


def save(glob_str: Any = None, base_path: Any = None, policy: str = "live", glob: bool = True) -> Any:
    """wandb.save on the current run (telemetry/integrations/wandb_calls.py)."""
    return _active("save()").save(glob_str, base_path, policy, glob)


def log_artifact(artifact_or_path: Any, name: str | None = None, type: str | None = None,
                 aliases: Any = None, tags: Any = None) -> Artifact:
    return _active("log_artifact()").log_artifact(artifact_or_path, name=name, type=type, aliases=aliases, tags=tags)


def use_artifact(artifact_or_name: Any, type: str | None = None, aliases: Any = None, use_as: str | None = None) -> Any:
    return _active("use_artifact()").use_artifact(artifact_or_name, type=type, aliases=aliases, use_as=use_as)


def log_model(path: Any, name: str | None = None, aliases: Any = None) -> None:
    return _active("log_model()").log_model(path, name=name, aliases=aliases)


def alert(title: str, text: str, level: Any = None, wait_duration: Any = None) -> None:
    return _active("alert()").alert(title, text, level=level, wait_duration=wait_duration)


def mark_preempting() -> None:
    return _active("mark_preempting()").mark_preempting()


def finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    """Finish the current run (bounded time); nothing to do without one."""
    global _run
    if _run is not None:
        _run.finish(exit_code=exit_code)
        _run = None


def __getattr__(name: str) -> Any:
    # Module state W&B rebinds at init: looked up now, so it is never a stale copy.
    if name == "run":
        return None if _run is None or _run._finished else _run
    if name in ("config", "summary"):
        return PreInit(name) if _run is None or _run._finished else getattr(_run, name)
    if name in _UNSUPPORTED:
        return Unsupported(f"wandb.{name}")
    if name == "__version__":       # integrations check W&B's features by it: the installed W&B's
        try:
            from importlib.metadata import version

            return version("wandb")
        except Exception:
            return "0.19.0"
    raise AttributeError(f"module 'telemetry.wandb' has no attribute {name!r} (not part of the supported W&B "
                         f"subset: {', '.join(__all__)}, run, config, summary)")

