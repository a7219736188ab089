"""W&B's calls beyond log, config and summary, for `telemetry.wandb`: artifacts, models, saved
files, code, alerts, preemption. The daemon owns the real W&B run, so each call is forwarded to it
as a `wandb/call` event that the daemon's W&B sink turns into the real call (`run.log_artifact`,
`run.log_model`, `run.save`, `run.log_code`, `run.alert`, `run.mark_preempting`).

The files a call names are staged where the daemon can read them: a directory of their own under
the private media directory (<media dir>/staged/<pid>-<8 hex>-<n>, telemetry/shared/media.py),
laid out as the W&B call will store them. A file is copied there on the caller's thread, as
W&B's own `add_file` copies it (policy "mutable", the default), or hard-linked where the file
system allows when W&B would not copy it either (policy "immutable"; `save(policy="live")`,
which W&B links); everything else (hashing, the manifest, W&B's own staging and upload) happens
in the daemon. The directory is named in the event only once complete; the sink
deletes it after the call (a `save`d file is first copied into the W&B run's files directory).

What cannot work without the files in the training process raises, naming the call:
`use_artifact` (offline, W&B's own TypeError; online, the artifact would be downloaded into the
daemon, not this process), `use_model`, `link_model`, `restore`.
"""
from __future__ import annotations

import enum
import glob as globlib
import inspect
import itertools
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

CALL_EVENT = "wandb/call"
STAGED_SUBDIR = "staged"
_names = itertools.count()


class AlertLevel(str, enum.Enum):
    """wandb.AlertLevel."""

    INFO = "INFO"
    WARN = "WARN"
    ERROR = "ERROR"


def make_artifact_name_safe(name: str) -> str:
    """W&B's rule for the names it makes (alphanumerics, "-", "_", "."; 128 characters)."""
    cleaned = re.sub(r"[^a-zA-Z0-9_\-.]", "_", name)
    if len(cleaned) <= 128:
        return cleaned
    return re.sub(r"(^.{63}).*(.{63}$)", r"\g<1>..\g<2>", cleaned)


def staged_root(create: bool = False) -> Path:
    from telemetry.shared import media as shared_media
    from telemetry.shared.endpoints import private_dirs

    base = shared_media.media_dir(create=create)
    return private_dirs(base, base / STAGED_SUBDIR, create=create) if create else base / STAGED_SUBDIR


def new_stage() -> Path:
    """A new, empty staging directory (hidden by its leading "." until published)."""
    root = staged_root(create=True)
    name = f"{os.getpid()}-{os.urandom(4).hex()}-{next(_names)}"
    path = root / ("." + name)
    path.mkdir(mode=0o700)
    return path


def publish(stage: Path) -> str:
    """The staging directory under its final name (a rename: the sink never sees half of it)."""
    final = stage.with_name(stage.name.lstrip("."))
    os.replace(stage, final)
    return final.name


def link_or_copy(src: str | os.PathLike, dst: Path, link: bool = False) -> None:
    """`src` staged at `dst`: a copy (what W&B's add_file makes of a "mutable" file, the default:
    later writes to `src` do not change what is logged), or with `link` a hard link where the file
    system allows (W&B's "immutable": the caller promises not to change it; no bytes copied)."""
    dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if dst.exists():
        dst.unlink()
    if link:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)


def jsonable(value: Any) -> Any:
    """Metadata as JSON takes it (numpy and tensor scalars as numbers, the rest as text)."""
    def default(v: Any) -> Any:
        if hasattr(v, "item"):
            try:
                return v.item()
            except Exception:
                pass
        if hasattr(v, "tolist"):
            return v.tolist()
        return str(v)

    return json.loads(json.dumps(value, default=default))


class _NewFile:
    """`artifact.new_file(name)`: a file written into the artifact's staging directory."""

    def __init__(self, artifact: "Artifact", name: str, mode: str, encoding: str | None) -> None:
        path = artifact._stage_dir() / name
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._f = open(path, mode.replace("x", "w") if "x" in mode else mode, encoding=encoding)

    def __enter__(self):
        return self._f

    def __exit__(self, *exc: object) -> None:
        self._f.close()


class Artifact:
    """wandb.Artifact: its files are staged as they are added (see the module docstring); the
    daemon's W&B run builds the real artifact from them when it is logged."""

    def __init__(self, name: str, type: str, description: str | None = None, metadata: dict | None = None,
                 incremental: bool = False, use_as: str | None = None, **kwargs: Any) -> None:
        if not re.fullmatch(r"[a-zA-Z0-9_\-.]+", name or ""):
            raise ValueError(f"Artifact name may only contain alphanumeric characters, dashes, underscores, and "
                             f"dots. Invalid name: {name!r}")
        self.name = name
        self.type = type
        self.description = description
        self.metadata = dict(metadata or {})
        self.incremental = incremental
        self.aliases: list[str] = []
        self.tags: list[str] = list(kwargs.get("tags") or [])
        self._references: list[dict] = []
        self._stage: Path | None = None
        self._logged = False

    def _stage_dir(self) -> Path:
        if self._logged:
            raise ValueError("Can't add to artifact after it has been logged (as W&B)")
        if self._stage is None:
            self._stage = new_stage()
        return self._stage

    def add_file(self, local_path: str, name: str | None = None, is_tmp: bool | None = False,
                 skip_cache: bool | None = False, policy: str | None = "mutable", overwrite: bool = False) -> None:
        if not os.path.isfile(local_path):
            raise ValueError(f"Path is not a file: {local_path!r}")
        link_or_copy(local_path, self._stage_dir() / (name or os.path.basename(local_path)), policy == "immutable")

    def add_dir(self, local_path: str, name: str | None = None, skip_cache: bool | None = False,
                policy: str | None = "mutable", merge: bool = False) -> None:
        if not os.path.isdir(local_path):
            raise ValueError(f"Path is not a directory: {local_path!r}")
        base = self._stage_dir() / (name or "")
        for dirpath, _, files in os.walk(local_path):
            for f in files:
                src = os.path.join(dirpath, f)
                link_or_copy(src, base / os.path.relpath(src, local_path), policy == "immutable")

    def new_file(self, name: str, mode: str = "x", encoding: str | None = None) -> _NewFile:
        return _NewFile(self, name, mode, encoding)

    def add_reference(self, uri: str, name: str | None = None, checksum: bool = True,
                      max_objects: int | None = None) -> None:
        self._stage_dir()
        self._references.append({"uri": str(uri), "name": name, "checksum": checksum, "max_objects": max_objects})

    def add(self, obj: Any, name: str) -> None:
        raise NotImplementedError("telemetry.wandb does not support Artifact.add (a W&B object in an artifact): "
                                  "write it to a file and use add_file")

    def wait(self, timeout: int | None = None) -> "Artifact":
        return self

    def __repr__(self) -> str:
        return f"<Artifact {self.name}>"

    def __del__(self) -> None:
        if not getattr(self, "_logged", True) and getattr(self, "_stage", None) is not None:
            shutil.rmtree(self._stage, ignore_errors=True)     # never logged: its staged files go

    def _describe(self) -> dict:
        return jsonable({"name": self.name, "type": self.type, "description": self.description,
                         "metadata": self.metadata, "incremental": self.incremental, "tags": self.tags,
                         "references": self._references})


def _include_default(path: str) -> bool:
    """W&B's log_code default: Python files, Dockerfiles, requirements.txt."""
    name = os.path.basename(path)
    return name.endswith(".py") or name.startswith("Dockerfile") or name == "requirements.txt"


def _exclude_default(path: str, root: str) -> bool:
    """W&B's default (its own directory at the root), and W&B's run directories anywhere under
    the root: under `telemetry run` they are the daemon's, in the run directory, which may lie
    under the script's directory where W&B's own would not."""
    parts = os.path.relpath(path, root).split(os.sep)
    if parts[0] in ("wandb", ".wandb") and len(parts) > 1:
        return True
    return any(p in ("wandb", ".wandb") and parts[i + 1].startswith(("run-", "offline-run-", "latest-run"))
               for i, p in enumerate(parts[:-2]))


def _call2(fn, path: str, root: str) -> bool:
    return fn(path, root) if len(inspect.signature(fn).parameters) == 2 else fn(path)


class RunCalls:
    """The calls above, as methods of telemetry.wandb's Run (which supplies `_call`, `offline`,
    `id`, `project`, `dir`, and `_raise_if_finished`: each call W&B refuses on a finished run
    raises W&B's UsageError there too)."""

    def _forward(self, call: str, stage: Path | None = None, **args: Any) -> None:
        from telemetry.client.core import DisabledClient

        if self.mode == "disabled" or isinstance(self._client.get(), DisabledClient):   # no daemon would take it
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
            return
        data: dict[str, Any] = {"call": call, "args": jsonable(args)}
        if stage is not None:
            data["dir"] = publish(stage)
        self._send_call(data)

    def log_artifact(self, artifact_or_path: Any, name: str | None = None, type: str | None = None,
                     aliases: list[str] | None = None, tags: list[str] | None = None) -> Artifact:
        """run.log_artifact: an Artifact, or a path (a file or directory) with name and type."""
        self._raise_if_finished("log_artifact")
        if isinstance(artifact_or_path, Artifact):
            art = artifact_or_path
        else:
            path = str(artifact_or_path)
            if "://" in path:
                raise NotImplementedError(f"telemetry.wandb: log_artifact({path!r}): a reference URI; build a "
                                          f"wandb.Artifact and add_reference it")
            if type is None:
                raise ValueError("type is required when logging artifacts, specify it with type=")
            art = Artifact(name or f"run-{self.id}-{os.path.basename(path.rstrip(os.sep))}", type)
            (art.add_dir if os.path.isdir(path) else art.add_file)(path)
        stage = art._stage_dir()
        art._logged = True
        art.aliases = list(dict.fromkeys([*(aliases or []), "latest"]))
        self._forward("log_artifact", stage, artifact=art._describe(), aliases=list(aliases or []),
                      tags=list(tags or []))
        return art

    def upsert_artifact(self, *args: Any, **kwargs: Any) -> Artifact:
        return self.log_artifact(*args, **kwargs)

    def log_model(self, path: str, name: str | None = None, aliases: list[str] | None = None) -> None:
        """run.log_model: a file or directory, as an artifact of type "model"."""
        self._raise_if_finished("log_model")
        path = str(path)
        base = os.path.basename(path.rstrip(os.sep))
        stage = new_stage()
        if os.path.isdir(path):
            Artifact.add_dir(_Staged(stage), path)
            staged = ""
        elif os.path.isfile(path):
            link_or_copy(path, stage / base)
            staged = base
        else:
            shutil.rmtree(stage, ignore_errors=True)
            raise ValueError(f"Path is not a file or directory: {path!r}")
        self._forward("log_model", stage, path=staged, name=name or make_artifact_name_safe(f"run-{self.id}-{base}"),
                      aliases=list(aliases) if aliases is not None else None)

    def save(self, glob_str: str | None = None, base_path: str | None = None, policy: str = "live",
             glob: bool = True) -> list[str] | bool:
        """run.save: the matching files, staged now, saved into the W&B run's files (see
        docs/dropin-wandb.md: "live" and "end" files are staged again at finish)."""
        self._raise_if_finished("save")
        return self._save(glob_str, base_path, policy, glob, refresh=False)

    def _save(self, glob_str: Any, base_path: Any, policy: str, glob: bool, refresh: bool) -> list[str] | bool:
        if glob_str is None:
            return True              # W&B's old no-op form
        glob_str = os.fspath(glob_str)
        if isinstance(glob_str, bytes):
            glob_str = glob_str.decode()
        if glob_str.startswith(("gs://", "s3://")):
            print(f"wandb: {glob_str} is a cloud storage url, can't save file to W&B.", file=sys.stderr)
            return []
        if policy not in ("live", "end", "now"):
            raise ValueError('Only "live", "end" and "now" policies are currently supported.')
        resolved = os.path.abspath(glob_str)
        if base_path is None:
            base_path = "." if not os.path.isabs(glob_str) else os.path.dirname(os.path.dirname(resolved))
        base = os.path.abspath(base_path)
        if os.path.commonpath([base, resolved]) != base:
            raise ValueError(f"Glob path {glob_str!r} is not a subpath of {base_path!r}")
        rel_glob = os.path.relpath(resolved, base)
        matches = sorted(globlib.glob(resolved) if glob else ([resolved] if os.path.exists(resolved) else []))
        files = [m for m in matches if os.path.isfile(m)]
        if policy in ("live", "end") and not refresh:
            self._saved_late.append((glob_str, base_path, policy, glob))
        rels = [os.path.relpath(f, base) for f in files]
        if files:
            stage = new_stage()
            for f, rel in zip(files, rels):
                link_or_copy(f, stage / rel, link=policy == "live")   # W&B links these too
            self._forward("save", stage, glob=rel_glob if glob else None, files=rels, policy=policy, refresh=refresh)
        run_dir = self._w_b("dir") if files and not refresh else None    # where the daemon's run keeps them
        return [os.path.join(run_dir, rel) for rel in rels] if run_dir else rels

    def _save_late(self) -> None:
        """At finish: the "live" and "end" files again, as they are now (W&B uploads them at the end)."""
        late, self._saved_late = self._saved_late, []
        for glob_str, base_path, policy, glob in late:
            try:
                self._save(glob_str, base_path, policy, glob, refresh=True)
            except Exception:
                pass

    def log_code(self, root: str | None = ".", name: str | None = None, include_fn: Any = _include_default,
                 exclude_fn: Any = _exclude_default) -> Artifact | None:
        """run.log_code: the files under `root` that include_fn takes, as a "code" artifact."""
        if name is None:
            program = os.path.relpath(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else "python"
            name = make_artifact_name_safe(f"source-{self.project or 'uncategorized'}-{program}")
        art = Artifact(name, "code")
        found = False
        if root is not None:
            root = os.path.abspath(root)
            for dirpath, _, files in os.walk(root):
                for f in files:
                    path = os.path.join(dirpath, f)
                    if _call2(include_fn, path, root) and not _call2(exclude_fn, path, root):
                        art.add_file(path, name=os.path.relpath(path, root))
                        found = True
        if not found:
            print("wandb: WARNING No relevant files were detected in the specified directory. No code will be "
                  "logged to your run.", file=sys.stderr)
            if art._stage is not None:
                shutil.rmtree(art._stage, ignore_errors=True)
            return None
        art._logged = True
        self._forward("log_code", art._stage, name=name)
        return art

    def use_artifact(self, artifact_or_name: Any, type: str | None = None, aliases: list[str] | None = None,
                     use_as: str | None = None) -> Any:
        self._raise_if_finished("use_artifact")
        if self.mode == "disabled":
            return None                 # W&B's disabled run's
        if self.offline:
            raise TypeError("Cannot use artifact when in offline mode.")
        raise NotImplementedError("telemetry.wandb does not support run.use_artifact online: the daemon owns the "
                                  "W&B run, so the artifact would be downloaded there, not here. Download it with "
                                  "the real wandb (wandb.Api().artifact(name).download()) before training")

    def alert(self, title: str, text: str, level: Any = None, wait_duration: Any = None) -> None:
        """run.alert: sent by the daemon's W&B run (offline, recorded in the run as W&B does)."""
        self._raise_if_finished("alert")
        level = getattr(level, "value", level) or "INFO"
        if level not in ("INFO", "WARN", "ERROR"):
            raise ValueError(f"level must be one of {', '.join(a.value for a in AlertLevel)}")
        if hasattr(wait_duration, "total_seconds"):
            wait_duration = wait_duration.total_seconds()
        self._forward("alert", title=str(title), text=str(text), level=level, wait_duration=wait_duration)

    def mark_preempting(self) -> None:
        self._raise_if_finished("mark_preempting")
        self._forward("mark_preempting")


class _Staged:
    """Artifact.add_dir's target for log_model: a staging directory already made."""

    def __init__(self, stage: Path) -> None:
        self._stage = stage

    def _stage_dir(self) -> Path:
        return self._stage


def staged_dir(name: object) -> Path | None:
    """The staging directory a `wandb/call` event names, or None for a name this module never gives."""
    from telemetry.shared import media as shared_media

    if not isinstance(name, str) or shared_media.NAME.fullmatch(name) is None or "." in name:
        return None
    return staged_root() / name


def delete_stale_stages(min_age_s: float = 600.0) -> int:
    """Staging directories nobody will read: their writer (the pid in the name) is gone and they
    are older than `min_age_s` (a process killed between staging and its event's delivery, or a
    daemon killed before its call). The W&B sink calls this as it starts. Returns how many went."""
    import time

    try:
        root = staged_root()
        names = os.listdir(root)
    except (OSError, ValueError):
        return 0
    gone = 0
    for name in names:
        base = name.lstrip(".")
        if staged_dir(base) is None:
            continue
        try:
            old = time.time() - os.lstat(root / name).st_mtime > min_age_s
            os.kill(int(base.split("-", 1)[0]), 0)
            continue                           # its writer lives
        except ProcessLookupError:
            pass
        except OSError:
            continue
        if old:
            shutil.rmtree(root / name, ignore_errors=True)
            gone += 1
    return gone


class _Plot:
    """`wandb.plot`: its common charts (wandb_media.CHARTS) are passed through: the call is made
    by the daemon's W&B run with the real wandb.plot (wandb_media.Chart); the others raise."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        from telemetry.integrations.wandb_media import CHARTS, Chart

        if name in CHARTS:
            return lambda *args, **kwargs: Chart(name, args, kwargs)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(f"telemetry.wandb does not support wandb.plot.{name}: log its table "
                                      f"(wandb.Table) and make the chart in the W&B UI")

        return refuse


plot = _Plot()
