"""The dashboard's line when a run's series budget fills names the run, whose name may come from
a hello (wandb.init's name; on a TCP PUB, anyone's): one line on stderr, escape sequences shown
as text, never sent to the terminal."""
from __future__ import annotations

from types import SimpleNamespace

from telemetry.consumers import dashboard


def test_the_series_budget_line_is_one_printable_line(capsys):
    store = SimpleNamespace(name='r"} evil\n#\x1b]0;title\x07\x1b[2J', series={"a": 1, "b": 2})
    dashboard._said_once(store)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n")
    assert "\x1b" not in err and "\x07" not in err
    assert "2 series kept" in err and "evil" in err
