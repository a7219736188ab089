"""W&B's rules for the `wandb.init` arguments and environment variables a script is likely to
give, applied in the script's process by `telemetry.wandb.init` before a run exists.

W&B's init puts each argument into its Settings, which refuses what it cannot take: a project
name with `/` or longer than 128 characters and a bad run id raise W&B's UsageError; a tag
longer than 64 characters, a mode or resume it does not know, a name that is not text raise a
pydantic ValidationError ("1 validation error for Settings ..."). The daemon's W&B sink makes the
real run from the same values, so a value W&B refuses that passed here made no W&B run at all,
said only in the daemon's log, while the script trained on. Refused here, the script gets the
error W&B's init gives, of W&B's type, in W&B's words.

A ValidationError is pydantic's own when pydantic is importable (W&B depends on it; it is
imported only to raise), else a ValueError with the same text (pydantic's is a ValueError).
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from telemetry.integrations.wandb_objects import UsageError

# The Settings fields W&B's init sets from its arguments, in the order it sets them (the first
# refused raises), with the argument each comes from.
INIT_FIELDS = (("run_job_type", "job_type"), ("root_dir", "dir"), ("project", "project"),
               ("entity", "entity"), ("reinit", "reinit"), ("run_tags", "tags"), ("run_group", "group"),
               ("run_name", "name"), ("run_notes", "notes"), ("mode", "mode"), ("resume", "resume"),
               ("save_code", "save_code"), ("run_id", "id"))
# The environment variables W&B's settings read for those fields (WANDB_TAGS comma-separated).
ENV_FIELDS = (("WANDB_DIR", "root_dir"), ("WANDB_PROJECT", "project"), ("WANDB_ENTITY", "entity"),
              ("WANDB_TAGS", "run_tags"), ("WANDB_RUN_GROUP", "run_group"), ("WANDB_NAME", "run_name"),
              ("WANDB_NOTES", "run_notes"), ("WANDB_JOB_TYPE", "run_job_type"), ("WANDB_MODE", "mode"),
              ("WANDB_RESUME", "resume"), ("WANDB_RUN_ID", "run_id"), ("WANDB_CONSOLE", "console"),
              ("WANDB_CONFIG_PATHS", "config_paths"))

MODES = ("online", "offline", "shared", "disabled", "dryrun", "run")
# W&B's other names for its modes, as W&B reads them: "dryrun" (offline) and "run" (online), and
# "shared", one online run written by several processes (what a daemon of the run does for its
# ranks anyway): the mode a daemon's W&B sink runs in (sink_mode).
MODE_NAMES = {"dryrun": "offline", "run": "online"}
RESUMES = ("allow", "must", "never", "auto")
REINITS = ("default", "return_previous", "finish_previous", "create_new")
CONSOLES = ("auto", "off", "wrap", "redirect", "wrap_raw", "wrap_emu")
PROJECT_MAX_CHARS = 128
PROJECT_RESERVED = "/\\#?%:"
TAG_MAX_CHARS = 64
RUN_ID_RESERVED = ":;,#?/'"
# What pydantic's lax bool takes as a bool (a setting of type bool: save_code, reinit's bool).
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def sink_mode(mode: str | None) -> str | None:
    """The W&B mode a daemon's sink runs in for a script's `mode` (MODE_NAMES, "shared")."""
    return "online" if mode == "shared" else MODE_NAMES.get(mode, mode)


def check_init(args: dict[str, Any], environ: Any = None) -> None:
    """Raise what W&B's init raises for `args` (wandb.init's keyword arguments; None: not
    given) and for the W&B environment variables in `environ` (default os.environ) that its
    settings read; return when W&B takes them all."""
    for field, arg in INIT_FIELDS:
        value = args.get(arg)
        if value is not None:
            check_setting(field, tuple(value) if field == "run_tags" else value)
    env = os.environ if environ is None else environ
    for var, field in ENV_FIELDS:
        value = env.get(var)
        if value is not None:
            check_setting(field, value.split(",") if field == "run_tags" else value)


def check_settings(values: dict[str, Any]) -> None:
    """Raise what W&B's Settings(**values) raises for the fields this module knows (the others
    are taken as given: W&B has some two hundred)."""
    for field, value in values.items():
        check_setting(field, value)


def check_setting(field: str, value: Any) -> None:
    """Raise W&B's error for `value` of the Settings field `field`, as W&B's Settings does when
    the field is set; nothing for a field this module does not know."""
    if value is None:
        return
    if field in ("project", "entity", "run_name", "run_notes", "run_group", "run_job_type", "run_id"):
        if not isinstance(value, str):
            raise validation_error([("string_type", (field,), value, None)])
        if field == "project":
            _check_project(value)
        elif field == "run_id":
            check_run_id(value)
    elif field == "root_dir":
        if not isinstance(value, (str, os.PathLike)) or not isinstance(os.fspath(value), str):
            raise validation_error([("string_type", (field,), value, None)])
    elif field == "run_tags":
        _check_tags(value)
    elif field == "mode":
        _check_literal(field, value, MODES)
    elif field == "console":
        _check_literal(field, value, CONSOLES)
    elif field == "resume":
        if value is not True and value is not False:
            _check_literal(field, value, RESUMES)
    elif field == "reinit":
        if value in REINITS and isinstance(value, str) or lax_bool(value) is not None:
            return
        literal = "literal[" + ",".join(f"'{r}'" for r in REINITS) + "]"
        raise validation_error([("literal_error", (field, literal), value, {"expected": _expected(REINITS)}),
                                (_bool_error(value), (field, "bool"), value, None)])
    elif field == "config_paths":
        # A sequence of paths, never one text: W&B 0.31 reads $WANDB_CONFIG_PATHS as that text
        # and so refuses it at every init (set the paths with wandb.setup's settings instead).
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise _sequence_error(field, value)
    elif field in ("save_code", "force"):
        if lax_bool(value) is None:
            raise validation_error([(_bool_error(value), (field,), value, None)])


def lax_bool(value: Any) -> bool | None:
    """`value` as pydantic's lax bool reads it (True, 1, "yes", ...), None when it is none."""
    if value is True or value is False:
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        return True if text in _TRUE else False if text in _FALSE else None
    return None


def _bool_error(value: Any) -> str:
    """pydantic's error type for a value its lax bool refuses: text or a number it cannot read
    as one, or a value of another type."""
    return "bool_parsing" if isinstance(value, (str, int, float)) else "bool_type"


def check_run_id(run_id: str) -> None:
    """W&B's rule for a run id (its settings refuse it with UsageError, in these words)."""
    if not run_id:
        raise UsageError("Run ID cannot be empty")
    if len(run_id) > len(run_id.strip()):
        raise UsageError("Run ID cannot start or end with whitespace")
    if not run_id.strip():
        raise UsageError("Run ID cannot contain only whitespace")
    if any(c in RUN_ID_RESERVED for c in run_id):
        raise UsageError(f"Run ID cannot contain the characters: {RUN_ID_RESERVED}")


def _check_project(project: str) -> None:
    if len(project) > PROJECT_MAX_CHARS:
        raise UsageError(f"Invalid project name {project!r}: exceeded {PROJECT_MAX_CHARS} characters")
    found = [c for c in PROJECT_RESERVED if c in project]
    if found:
        raise UsageError(f"Invalid project name {project!r}: cannot contain characters "
                         f"{','.join(PROJECT_RESERVED)!r}, found {','.join(found)!r}")


def _check_tags(value: Any) -> None:
    """W&B's run_tags: text alone is one tag; each tag 1 to 64 characters (every tag refused
    said in one error), then each must be text."""
    tags = (value,) if isinstance(value, str) else tuple(value)
    errors = []
    for i, tag in enumerate(tags):
        n = len(str(tag))
        if n == 0:
            errors.append(f"Tag at index {i} is empty. Tags must be between 1 and {TAG_MAX_CHARS} characters")
        elif n > TAG_MAX_CHARS:
            text = str(tag)
            shown = f"{text[:20]}...{text[-20:]}" if n > 43 else text
            errors.append(f"Tag '{shown}' is {n} characters. Tags must be between 1 and {TAG_MAX_CHARS} characters")
    if errors:
        raise validation_error([("value_error", ("run_tags",), value, {"error": ValueError("; ".join(errors))})])
    wrong = [("string_type", ("run_tags", i), tag, None) for i, tag in enumerate(tags) if not isinstance(tag, str)]
    if wrong:
        raise validation_error(wrong)


def _check_literal(field: str, value: Any, allowed: tuple[str, ...]) -> None:
    if not (isinstance(value, str) and value in allowed):
        raise validation_error([("literal_error", (field,), value, {"expected": _expected(allowed)})])


def _expected(allowed: Iterable[str]) -> str:
    quoted = [f"'{a}'" for a in allowed]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


# pydantic's words for each error type used here (the fallback's; pydantic's own has them).
_MESSAGES = {"string_type": "Input should be a valid string",
             "bool_type": "Input should be a valid boolean",
             "bool_parsing": "Input should be a valid boolean, unable to interpret input"}


def _sequence_error(field: str, value: Any) -> ValueError:
    """pydantic's error for text (or another non-sequence) given as a sequence of text: an error
    type its from_exception_data does not make, so a model of that one field makes it."""
    try:
        from typing import Optional, Sequence

        from pydantic import ValidationError as PydanticError, create_model
    except ImportError:
        kind = "sequence_str" if isinstance(value, str) else "list_type"
        return ValidationError(f"1 validation error for Settings\n{field}\n  'str' instances are not allowed as a "
                               f"Sequence value [type={kind}, input_value={value!r}, input_type={type(value).__name__}]")
    try:
        create_model("Settings", **{field: (Optional[Sequence[str]], None)})(**{field: value})
    except PydanticError as exc:
        return exc
    return ValidationError(f"1 validation error for Settings\n{field}\n  Input should be a valid sequence")


class ValidationError(ValueError):
    """pydantic's ValidationError where pydantic is not installed: a ValueError, as pydantic's."""


def validation_error(errors: list[tuple[str, tuple, Any, dict | None]]) -> ValueError:
    """The error W&B's Settings raises for `errors` ((pydantic error type, location, the value,
    its context), each): pydantic's ValidationError titled "Settings", as W&B raises it."""
    try:
        from pydantic_core import ValidationError as PydanticError
    except ImportError:
        PydanticError = None
    if PydanticError is not None:
        return PydanticError.from_exception_data(
            "Settings", [{"type": t, "loc": loc, "input": value, **({"ctx": ctx} if ctx else {})}
                         for t, loc, value, ctx in errors])
    lines = [f"{len(errors)} validation error{'s' if len(errors) > 1 else ''} for Settings"]
    for t, loc, value, ctx in errors:
        if t == "value_error":
            msg = f"Value error, {ctx['error']}"
        elif t == "literal_error":
            msg = f"Input should be {ctx['expected']}"
        else:
            msg = _MESSAGES[t]
        lines += [".".join(map(str, loc)),
                  f"  {msg} [type={t}, input_value={value!r}, input_type={type(value).__name__}]"]
    return ValidationError("\n".join(lines))
