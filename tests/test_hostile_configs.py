"""Config files built to blow up their parser: a few hundred bytes of nested aliases ("billion
laughs"), 100,000-deep nesting, an alias inside its own node, a JSON model config nested as
deep. Every program that reads a config (the daemon, `telemetry metrics`, the trainer, its
`model.hf_config`, an override, `telemetry mfu-check`) refuses each with one line naming the
file and exit 2: the bounds (telemetry/shared/config.py's MAX_YAML_NODES, MAX_YAML_DEPTH) are
checked on yaml's node graph before anything is built.

Real processes, each under an address-space ceiling (RLIMIT_AS) far above what it needs and far
below what the expansion takes, and a timeout: both only catch a blow-up or a hang.
"""
from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from daemon_util import ROOT
from telemetry.shared.config import MAX_YAML_DEPTH, MAX_YAML_NODES, ConfigError, parse_yaml

HANG_S = 120
# The trainer imports torch (a few hundred MB of address space); the expansion wants gigabytes.
ADDRESS_SPACE_BYTES = 3 << 30


def _laughs(levels: int = 10) -> str:
    """A YAML flow sequence whose items each hold the one before nine times: 9**levels strings
    once expanded, ~40 bytes a level."""
    items = ['&l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    items += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def _deep(levels: int = 100_000) -> str:
    return "[" * levels + "]" * levels


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S,
                          preexec_fn=_limit_memory)


def _assert_refused(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr and "Error:" not in p.stderr, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


LAUGHS = "more than {:,} YAML nodes".format(MAX_YAML_NODES)
DEEP = f"nested deeper than {MAX_YAML_DEPTH} levels"
FILES = {   # a daemon config: the metrics declarations hold free-form values
    "laughs": ("metrics:\n  my/x:\n    doc: " + _laughs() + "\n", LAUGHS),
    "deep": ("a: " + _deep() + "\n", DEEP),
    "deep_block": ("".join("  " * i + "a:\n" for i in range(200)) + "  " * 200 + "a: 1\n", DEEP),
    "self_alias": ("a: &a [1, *a]\n", "an alias refers to a node that contains it"),
}


@pytest.mark.parametrize("case", sorted(FILES))
@pytest.mark.parametrize("program", ["daemon", "metrics"])
def test_telemetry_refuses_a_hostile_daemon_config(tmp_path, program, case):
    text, needle = FILES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    args = ["daemon", "--config", str(path), "--log-dir", str(tmp_path / "log")] if program == "daemon" \
        else ["metrics", "--config", str(path)]
    _assert_refused(_run("-m", "telemetry", *args), str(path), needle)


@pytest.mark.parametrize("case", ["laughs", "deep", "hf_config"])
def test_the_trainer_refuses_a_hostile_config(tmp_path, case):
    """A trainer config, and one whose model.hf_config (a free-form dict) holds the laughs."""
    if case == "hf_config":
        text, needle = "model:\n  hf_config:\n    model_type: qwen2\n    x: " + _laughs() + "\n", LAUGHS
    elif case == "laughs":
        text, needle = "steps: 2\nx: " + _laughs() + "\n", LAUGHS
    else:
        text, needle = FILES[case]
    path = tmp_path / "train.yaml"
    path.write_text(text)
    _assert_refused(_run("-m", "trainer.train", "--config", str(path), f"run_dir={tmp_path / 'run'}"),
                    str(path), needle)


def test_an_override_is_held_to_the_same_bounds(tmp_path):
    _assert_refused(_run("-m", "trainer.train", f"model.hf_config.x={_laughs()}", f"run_dir={tmp_path / 'run'}"),
                    "override", LAUGHS)


def test_mfu_check_refuses_a_hostile_json_or_yaml_model_config(tmp_path):
    deep_json = tmp_path / "config.json"
    deep_json.write_text('{"model_type": "gpt2", "x": ' + _deep() + "}")
    _assert_refused(_run("-m", "telemetry", "mfu-check", "--hf-config", str(deep_json)), str(deep_json), DEEP)
    laughs = tmp_path / "train.yaml"
    laughs.write_text("model:\n  hf_config:\n    model_type: gpt2\n    x: " + _laughs() + "\n")
    _assert_refused(_run("-m", "telemetry", "mfu-check", "--config", str(laughs)), str(laughs), LAUGHS)


def test_aliases_and_nesting_within_the_bounds_read_as_yaml_reads_them():
    """The bounds refuse what expands past them, nothing else: shared aliases, merge keys and
    nesting up to MAX_YAML_DEPTH read as yaml.safe_load reads them."""
    import yaml

    text = ("base: &base {lr: 0.1, betas: [0.9, 0.95]}\nopt: {<<: *base, lr: 0.2}\nboth: [*base, *base]\n"
            "deep: " + "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1) + "\n")
    assert parse_yaml(text, "t") == yaml.safe_load(text)
    # Just past each bound: one more level; one more node once the aliases are expanded.
    with pytest.raises(ConfigError, match=DEEP):
        parse_yaml("deep: " + "[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH, "t")
    items = MAX_YAML_NODES // 4   # a list of `items` scalars, used four times (+ the mapping, keys, lists)
    text = "a: &a [" + ", ".join(["1"] * items) + "]\nb: [*a, *a, *a]\n"
    with pytest.raises(ConfigError, match=LAUGHS):
        parse_yaml(text, "t")
    assert len(parse_yaml("a: &a [" + ", ".join(["1"] * items) + "]\nb: [*a, *a]\n", "t")["b"]) == 2
