"""Daemon crashes and stops: SIGKILL mid-run and restart; SIGTERM with full queues."""
from __future__ import annotations

import pytest

from testkit import faults


@pytest.mark.timeout(900)     # a hang detector for a loaded machine; the scenario waits on counts
def test_sigkill_and_restart(tmp_path):
    sndhwm = 1000
    r = faults.kill_restart(tmp_path, num_ranks=2, rate=2000, before=2000, during=2 * sndhwm, after=2000,
                            sndhwm=sndhwm)
    # The restarted daemon cut the torn line the crash left and appended after it.
    assert r["repaired_bytes"] == len(b'{"kind": "metrics", "t": 1.0, "step": 12')
    assert r["integrity"]["bad_lines"] == 0 and r["integrity"]["ends_with_newline"]
    assert r["exit_code"] == 0
    for rank, fig in r["per_rank"].items():
        # The trainer never blocked on the dead daemon: the daemon stayed down until each rank had
        # made twice as many log calls as its queue holds (kill_restart waits on that, a hang
        # detector naming what it saw); what did not fit was dropped and counted.
        assert fig["log_calls_while_down"] >= 2 * sndhwm, fig
        assert fig["dropped"] >= fig["log_calls_while_down"] - sndhwm - 100, fig   # 100: the progress file's grain
        # It reconnected by itself: every record logged once the new daemon had its records again
        # was written.
        assert fig["logged_after_restart"] == 2000, fig
        assert fig["written_after_restart"] == fig["logged_after_restart"], fig
        # What nobody counted: the records inside the killed daemon. Bounded, measured.
        assert 0 <= fig["silent_loss"] <= 2000, fig


def test_sigterm_drains_everything_accepted(tmp_path):
    # A drain deadline no loaded machine reaches with 40,000 records: the daemon reports whether
    # every stage finished within it (drain.json "drained"); a wait past 120 s is a hang.
    r = faults.sigterm_drain(tmp_path, num_ranks=2, n=20_000, drain_timeout_s=60.0)
    assert r["exit_code"] == 0
    assert r["accepted"] > 0
    assert r["lost_after_accept"] == 0, r                # zero loss of what was accepted
    assert r["integrity"]["bad_lines"] == 0 and r["integrity"]["ends_with_newline"]
    assert r["stop_reason"] == "SIGTERM" and r["drained"] and r["unfinished_sinks"] == [], r
