"""A rank whose wall clock is far off is judged on the daemon's clock, not its own.

A real daemon, real clients in their own processes, one of them with time.time_ns shifted by
600 s (its records' "t" are that far off): while it logs every 10 ms, rank_stopped must stay
quiet; once it is killed, rank_stopped speaks (the rule was live all along).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from daemon_util import ROOT

SILENCE_S = 2.0
# The skewed rank logs this long (daemon time) before it is killed: several silence limits and
# several diagnosis ticks (1 s), enough for the old rule to have fired many times over.
SKEWED_FOR_S = 4 * SILENCE_S + 2

CLIENT = textwrap.dedent("""
    import sys, time
    endpoint, rank, offset_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    _time_ns, _time = time.time_ns, time.time
    time.time_ns = lambda: _time_ns() + int(offset_s * 1e9)   # this rank's clock is off
    time.time = lambda: _time() + offset_s
    from telemetry import TelemetryClient
    tm = TelemetryClient(endpoint=endpoint, rank=rank)
    step = 0
    while True:
        step += 1
        tm.log(step, {"train/loss": 1.0})
        time.sleep(0.01)
""")


def _client(endpoint: str, rank: int, offset_s: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLIENT, endpoint, str(rank), str(offset_s)], cwd=ROOT)


def _stopped(recs: list[dict]) -> list[dict]:
    return [r for r in recs if r.get("kind") == "event" and r.get("name") == "diagnosis/rank_stopped"]


@pytest.mark.slow
@pytest.mark.parametrize("offset_s", [-600.0, 600.0])
@pytest.mark.parametrize("world, per_rank", [(1, False), (2, True)], ids=["one-rank-aggregated", "two-ranks-per-rank"])
def test_a_rank_with_a_skewed_clock_is_not_reported_stopped(make_daemon, world, per_rank, offset_s):
    d = make_daemon(world_size=world, per_rank=per_rank, config={
        "diagnosis": {"rank_silence_s": SILENCE_S, "min_interval_s": 0.5, "hang_enabled": False},
        "aggregator": {"step_timeout_s": 120.0},
        "pollers": {"nvml_enabled": False, "host_enabled": False}})
    skewed = world - 1   # the last rank's clock is off; rank 0 (with two) keeps the daemon's
    procs = [_client(d.ingest, r, offset_s if r == skewed else 0.0) for r in range(world)]
    try:
        # The skewed rank's records arrive, carrying its clock (the test's premise).
        kind_rank = (lambda r: r.get("rank") == skewed) if per_rank else (lambda r: "rank" not in r)
        recs = d.wait_for(lambda rs: any(r.get("kind") == "metrics" and kind_rank(r) for r in rs), timeout_s=60)
        first = next(r for r in recs if r.get("kind") == "metrics" and kind_rank(r))
        assert abs(first["t"] - time.time() - offset_s) < 120, first
        started = time.monotonic()
        # It keeps logging for several silence limits of the daemon's clock; the daemon keeps
        # seeing new steps from it (not a stalled client).
        step_then = first["step"]
        d.wait_for(lambda rs: time.monotonic() - started >= SKEWED_FOR_S and any(
            r.get("kind") == "metrics" and kind_rank(r) and r["step"] > step_then + 10 for r in rs[-200:]),
            timeout_s=SKEWED_FOR_S + 60)
        killed_at = time.time()
        procs[skewed].kill()
        procs[skewed].wait(30)
        recs = d.wait_for(lambda rs: _stopped(rs), timeout_s=60)
        early = [e for e in _stopped(recs) if e["t"] < killed_at]
        assert not early, f"rank_stopped while the skewed rank was logging: {early}"
        ev = _stopped(recs)[0]
        if world == 1:
            assert ev["rank"] is None and "no rank has reported" in ev["data"]["message"], ev
        else:
            assert ev["rank"] == skewed and ev["data"]["silent_s"] >= SILENCE_S, ev
    finally:
        for p in procs:
            p.kill()
            p.wait(30)
