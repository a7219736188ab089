"""telemetry.shared.config: the one loader of every config in the project (daemon, trainer)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from telemetry.shared.config import ConfigError, build, load, parse_override


@dataclass(kw_only=True, slots=True)
class Item:
    name: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.weight <= 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")


@dataclass(kw_only=True, slots=True)
class Inner:
    ids: tuple[int, ...] | None = None
    kind: str = field(default="a", metadata={"key": "class"})


@dataclass(kw_only=True, slots=True)
class Top:
    n: int = 1
    x: float = 0.5
    flag: bool = False
    label: str | None = None
    table: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)
    maybe: Inner | None = None
    items: list[Item] = field(default_factory=list)


def test_types_are_checked_and_normalised():
    t = build(Top, {"n": 3, "x": 2, "flag": True, "label": None, "table": {"a": "b"}, "extra": {"k": [1]},
                    "inner": {"ids": [1, 2], "class": "z"}, "maybe": {}, "items": [{"name": "a", "weight": 2}]})
    assert t.x == 2.0 and isinstance(t.x, float) and t.inner.ids == (1, 2) and t.inner.kind == "z"
    assert t.maybe == Inner() and t.items == [Item(name="a", weight=2.0)] and t.extra == {"k": [1]}
    assert build(Top, {"x": "1e-4"}).x == 1e-4       # YAML 1.1 reads 1e-4 as a string
    assert build(Top, {}) == Top()


@pytest.mark.parametrize("data, message", [
    ({"n": True}, "config key 'n' must be int, got bool True"),
    ({"n": 1.5}, "config key 'n' must be int"),
    ({"x": "0.5"}, "config key 'x' must be float"),
    ({"flag": "yes"}, "config key 'flag' must be bool"),
    ({"label": 3}, "config key 'label' must be str"),
    ({"table": {"a": 1}}, "config key 'table.a' must be str"),
    ({"inner": []}, "config key 'inner' must be a mapping"),
    ({"inner": {"ids": [1, "b"]}}, "config key 'inner.ids[1]' must be int"),
    ({"inner": {"kind": "z"}}, "unknown config key 'inner.kind'; known keys here: class, ids"),
    ({"items": [{"name": "a"}, {"nam": "b"}]}, "unknown config key 'items[1].nam'"),
    ({"items": [{"weight": 1}]}, "config key 'items[0].name' is required"),
    ({"items": [{"name": "a", "weight": -1}]}, "items[0]: weight must be > 0, got -1.0"),
    ({"items": {"name": "a"}}, "config key 'items' must be a list"),
])
def test_errors_name_the_dotted_key(data, message):
    with pytest.raises(ConfigError) as e:
        build(Top, data)
    assert message in str(e.value)


def test_overrides_from_a_command_line_and_from_flags(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("n: 2\ninner: {ids: [1]}\nmaybe:\n")
    t = load(Top, p, ["x=1e-3", "inner.class=q", "maybe.ids=[4]", "label=null", "extra.a.b=1"])
    assert (t.n, t.x, t.inner.ids, t.inner.kind, t.maybe.ids, t.label) == (2, 1e-3, (1,), "q", (4,), None)
    assert t.extra == {"a": {"b": 1}}
    t = load(Top, p, {"n": None, "flag": True, "inner.class": "r"})   # None: a flag not given
    assert (t.n, t.flag, t.inner.kind) == (2, True, "r")
    assert parse_override("label=") == ("label", "")
    for bad, message in [("n", "is not key=value"), ("=1", "empty key"), ("a..b=1", "empty key"),
                         ("n=[1", "not valid YAML"), ("n.sub=1", "'n' must be a mapping (to set 'n.sub')")]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            load(Top, p, [bad])


@pytest.mark.parametrize("content, message", [
    (None, "is a directory"),
    (b"a: [1\n", "not valid YAML"),
    (b"\xff\xfe", "not YAML (not UTF-8 text)"),
    (b"- 1\n", "the top level must be a mapping"),
])
def test_a_file_that_is_not_a_config(tmp_path, content, message):
    p = tmp_path if content is None else tmp_path / "c.yaml"
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(Top, p)
    with pytest.raises(ConfigError, match="not found"):
        load(Top, tmp_path / "missing.yaml")
    assert load(Top, _empty(tmp_path)) == Top()


def _empty(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("")
    return p


def test_an_empty_optional_section_is_one_not_given(tmp_path):
    from telemetry.daemon.config import load

    cfg_file = tmp_path / "d.yaml"
    cfg_file.write_text("forward: {}\n")
    assert load(cfg_file, {}).forward is None     # `forward: {}` meant "no forwarding" before


@pytest.mark.parametrize("content, said", [
    (b"foo: [unclosed\n", "expected ',' or ']', but got '<stream end>' at line 2, column 1"),
    (b"a: 1\n  b: 2\n", "mapping values are not allowed here at line 2, column 4"),
    (b'a: "x\n', "found unexpected end of stream at line 2, column 1"),
])
def test_a_yaml_error_is_said_in_one_line_with_what_and_where(tmp_path, content, said):
    """PyYAML's message is several lines whose last is a caret: `telemetry run` showed that last
    line alone (an outside tester's find). One line: what was wrong, where."""
    p = tmp_path / "c.yaml"
    p.write_bytes(content)
    with pytest.raises(ConfigError) as got:
        load(Top, p)
    assert "\n" not in str(got.value) and said in str(got.value), str(got.value)
