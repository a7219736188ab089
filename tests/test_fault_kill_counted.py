"""Across a daemon SIGKILL and restart on the same log directory, what the dead daemon had
accepted and never wrote is counted by its successor (sources.json), once the client's next
records arrive: sent == written + counted lost, exactly (issue 18)."""
from __future__ import annotations

from testkit import faults


def test_what_dies_with_a_killed_daemon_is_counted(tmp_path):
    r = faults.kill_counted(tmp_path, n_before=1000, n_stopped=300, n_after=200)
    assert r["written_by_first"] == 1000, r
    assert r["unaccounted"] == 0, r                 # 300 before the fix: nothing counted them
    assert r["counted_lost"] == r["lost_in_transit"] == r["sent"] - r["written"], r
    assert r["lines_written_twice"] == 0, r
