"""The documents a user reads stay equal to the code: the README stays short enough to read
(at most 450 lines and 6,000 words), its synopsis of the `telemetry` command names every
subcommand and every flag the parser has and no other, and docs/config.md lists every key of the
daemon's and the trainer's config with its default. (The metric table in docs/metrics.md is
tests/test_catalogue.py's.)

`python tests/test_docs.py` prints the key list to paste between docs/config.md's markers.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONFIG_DOC = ROOT / "docs" / "config.md"

MAX_LINES = 450
MAX_WORDS = 6000


def _between(text: str, name: str, where: str) -> str:
    m = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", text, re.S)
    assert m, f"{where} lost its {name} markers"
    return m.group(1)


# --- the README's length ------------------------------------------------------------------

def test_the_readme_is_short_enough_to_read():
    text = README.read_text()
    lines, words = text.count("\n"), len(text.split())
    assert lines <= MAX_LINES, f"README.md has {lines} lines (at most {MAX_LINES}): move reference to docs/"
    assert words <= MAX_WORDS, f"README.md has {words} words (at most {MAX_WORDS}): move reference to docs/"


# --- the CLI synopsis ---------------------------------------------------------------------

def _synopsis_entries() -> dict[str, str]:
    """Subcommand -> its synopsis text (its first line and the indented lines that continue it)."""
    block = _between(README.read_text(), "cli", "README.md")
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        m = re.match(r"telemetry ([a-z-]+)", line)
        if m:
            current = m.group(1)
            assert current not in entries, f"README's synopsis lists `telemetry {current}` twice"
            entries[current] = ""
        if current is not None and (m or line.startswith(" ")):
            entries[current] += line.split("  #")[0] + "\n"    # a comment is not a flag
    return entries


def _subparser(name: str) -> argparse.ArgumentParser:
    from telemetry import cli

    parser = cli.build_parser([name])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_the_readme_synopsis_is_the_parser():
    from telemetry import cli

    entries = _synopsis_entries()
    assert set(entries) == set(cli.COMMANDS), \
        f"README's synopsis and telemetry.cli.COMMANDS differ: {sorted(set(entries) ^ set(cli.COMMANDS))}"
    for name, entry in entries.items():
        p = _subparser(name)
        flags = {s for a in p._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
        written = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", entry))
        assert flags <= written, f"README's synopsis of `telemetry {name}` lacks {sorted(flags - written)}"
        assert written <= flags, f"README's synopsis of `telemetry {name}` names flags it does not have: " \
                                 f"{sorted(written - flags)}"
        for a in p._actions:
            if not a.option_strings and a.dest not in ("help", "command"):
                assert a.dest.upper() in entry, f"README's synopsis of `telemetry {name}` lacks {a.dest.upper()}"


# --- every config key ---------------------------------------------------------------------

def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:
        v = f.default_factory()
    else:
        return "(required)"
    if v is None:
        return "(unset)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f"`{v}`" if v else '`""`'
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, dict):
        return "`{}`" if not v else "(a map: launch/configs/tiny.yaml)"
    if isinstance(v, (list, tuple)):
        return "`[" + ", ".join(str(x) for x in v) + "]`"
    raise AssertionError(f"{f.name}: a default this table cannot show: {v!r}")


def _keys(cls, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.metadata.get("key", f.name)
        t = hints[f.name]
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if dataclasses.is_dataclass(t):
            yield from _keys(t, key + ".")
        elif typing.get_origin(t) is list and args and dataclasses.is_dataclass(args[0]):
            yield from _keys(args[0], key + "[].")
        elif len(args) == 1 and dataclasses.is_dataclass(args[0]):     # Optional[Section]
            yield from _keys(args[0], key + ".")
        else:
            yield key, _default(f)


def config_keys_markdown() -> str:
    from telemetry.daemon.config import DaemonConfig
    from trainer.config import TrainConfig

    out = []
    for title, cls in (("the daemon's config", DaemonConfig), ("the trainer's config", TrainConfig)):
        out += [f"| {title}: key | default |", "|---|---|"]
        out += [f"| `{k}` | {d} |" for k, d in _keys(cls)]
        out.append("")
    return "\n".join(out)


def test_the_config_doc_lists_every_key_with_its_default():
    assert _between(CONFIG_DOC.read_text(), "config-keys", "docs/config.md") == config_keys_markdown(), \
        "docs/config.md's key list differs from the config dataclasses: paste `python tests/test_docs.py` " \
        "between its config-keys markers (and say what a new key does in the tables above it)"


if __name__ == "__main__":
    print(config_keys_markdown(), end="")
