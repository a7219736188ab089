"""Daemon crashes and stops: SIGKILL mid-run and restart; SIGTERM with full queues."""
from __future__ import annotations

from benchmarks import reliability


def test_sigkill_and_restart(tmp_path):
    r = reliability.kill_restart(tmp_path, num_ranks=2, n=6000, rate=2000, kill_at_s=1.0, down_s=1.0)
    # The restarted daemon cut the torn line the crash left and appended after it.
    assert r["repaired_bytes"] == len(b'{"kind": "metrics", "t": 1.0, "step": 12')
    assert r["integrity"]["bad_lines"] == 0 and r["integrity"]["ends_with_newline"]
    assert r["exit_code"] == 0
    for rank, fig in r["per_rank"].items():
        # The trainer never blocked, counted what it could not send, and reconnected by itself
        # (records were delivered after the restart: more than the first second's worth).
        assert fig["worst_log_s"] < 0.5, fig          # a hang detector; timings: benchmarks/RESULTS.md
        assert fig["dropped"] > 0, fig
        assert fig["delivered_metrics"] > 3000, fig
        # What nobody counted: the records inside the killed daemon. Bounded, measured.
        assert 0 <= fig["silent_loss"] <= 2000, fig


def test_sigterm_drains_everything_accepted(tmp_path):
    r = reliability.sigterm_drain(tmp_path, num_ranks=2, n=20_000)
    assert r["exit_code"] == 0
    assert r["accepted"] > 0
    assert r["lost_after_accept"] == 0, r                # zero loss of what was accepted
    assert r["integrity"]["bad_lines"] == 0 and r["integrity"]["ends_with_newline"]
    assert r["exit_s"] < 5.0 + 5.0, r                     # drain_timeout_s (5 s) + process teardown
