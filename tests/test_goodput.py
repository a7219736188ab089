"""The goodput ledger (telemetry/consumers/goodput.py): where a run's wall-clock time went.

Synthetic record streams with known times check the arithmetic of every bucket, a restart (work
redone, a hang, recovery) and that the buckets sum to the wall time; a real run of the trainer
on 2 CPU ranks, with the `debug:` section injecting a slow data loader and slow checkpoint
saves, checks the buckets against the ranks' own figures and the run's timeline (on the dev box
within 0.2-0.8 % of the wall time of the injected truth); a real hang, kill and restart of the
trainer checks the launches, the work redone and the hang."""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry.consumers.goodput import BUCKETS, ledger, text
from telemetry.consumers.readjsonl import find_log_dir
from test_straggler_ddp_model import SMALL   # the trainer runs below test the ledger, not a step's compute

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_800_000_000.0


def _hello(t: float, rank: int, started_at: float) -> dict:
    return {"kind": "hello", "t": t, "rank": rank, "info": {"rank": rank, "pid": 100 + rank, "started_at": started_at}}


def _step(t: float, step: int, step_time: float, data: float = 0.0, **more: float) -> dict:
    return {"kind": "metrics", "t": t, "step": step,
            "values": {"perf/step_time": step_time, "perf/data_loading_time": data, "train/loss": 1.0, **more}}


def _event(t: float, name: str, rank: int = 0, **data) -> dict:
    return {"kind": "event", "t": t, "rank": rank, "name": name, "data": data}


def _sums_to_wall(led: dict) -> None:
    assert sum(led["buckets_s"].values()) == pytest.approx(led["wall_s"], abs=1e-9)
    assert set(led["buckets_s"]) == set(BUCKETS)


def test_one_launch_every_bucket_from_known_times():
    # Processes start at T0 and T0 + 0.5; the first step (1 s long) ends at T0 + 11: start-up 10 s.
    recs = [_hello(T0 + 2, 0, T0), _hello(T0 + 2, 1, T0 + 0.5)]
    t = T0 + 11
    recs.append(_step(t, 1, 1.0, data=0.25))
    for step in range(2, 11):          # nine more steps of 1 s, 0.25 s of it waiting for data
        t += 1.0
        extra = {}
        if step == 5:                  # a straggler in forward: the others waited 0.5 s
            extra = {"perf/straggler_excess_s": 0.5, "perf/straggler_phase_index": 1.0,
                     "perf/straggler_median_s": 0.1}
        if step == 6:                  # a straggler in data loading: its excess is not data loading too
            extra = {"perf/straggler_excess_s": 0.4, "perf/straggler_phase_index": 0.0,
                     "perf/straggler_median_s": 0.25}
        if step == 10:                 # an eval after the step: 2 s
            extra = {"perf/eval_time": 2.0}
        # (the trainer logs the eval's values at the step after the eval: the record's t is its end)
        recs.append(_step(t + (2.0 if step == 10 else 0.0), step, 1.0, data=0.25 if step != 6 else 0.45, **extra))
    t += 2.0                           # the eval
    recs += [_event(t + 3.0, "checkpoint_saved", 0, step=10, duration_s=3.0),
             _event(t + 3.0, "checkpoint_saved", 1, step=10, duration_s=2.5)]    # the slowest rank's counts
    t += 3.0
    recs += [_event(t + 0.5, "train_end", 0, step=10), {"kind": "bye", "t": t + 0.5, "rank": 0, "stats": {}}]
    led = ledger(recs)
    b = led["buckets_s"]
    assert led["wall_s"] == pytest.approx(t + 0.5 - T0)
    assert b["startup"] == pytest.approx(10.0)
    assert b["data_loading"] == pytest.approx(10 * 0.25)
    assert b["straggler"] == pytest.approx(0.5 + 0.4)
    assert b["productive"] == pytest.approx(10 * 1.0 - 10 * 0.25 - 0.9)
    assert b["eval"] == pytest.approx(2.0) and b["checkpoint_save"] == pytest.approx(3.0)
    assert b["unexplained"] == pytest.approx(0.5)          # train_end came 0.5 s after the save
    assert b["hang"] == b["redone"] == b["recovery"] == b["checkpoint_restore"] == 0.0
    assert led["goodput"] == pytest.approx(b["productive"] / led["wall_s"])
    assert led["steps"] == 10 and led["launches"] == 1 and led["steps_missing"] == 0
    _sums_to_wall(led)
    out = text(led, "run")
    assert out.startswith("goodput of run: ") and "biggest loss: start-up" in out


def test_each_rank_gets_its_own_ledger_from_the_per_rank_records():
    """The daemon's --per-rank records, written before their step's aggregated record: rank 1 is
    slow in forward by 0.3 s at every step (rank 0 waits that long), rank 0 waits 0.2 s for data
    and rank 1 0.05 s; each saves for its own time; rank 1 is killed after step 6 (no bye: its
    process seen gone 1.5 s later), rank 0 ends with a bye; rank 1 restored a checkpoint for 0.8 s
    before its first step (an event before its ledger's first step record). Each rank's ledger is
    its own."""
    recs = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0 + 0.5),
            _event(T0 + 3, "checkpoint_restored", 1, step=0, duration_s=0.8)]
    t = T0 + 5.0
    for step in range(1, 7):
        t += 1.0
        own = {0: {"perf/step_time": 1.0, "perf/data_loading_time": 0.2, "perf/forward_time": 0.1},
               1: {"perf/step_time": 1.0, "perf/data_loading_time": 0.05, "perf/forward_time": 0.4}}
        for r in (0, 1):
            recs.append({"kind": "metrics", "t": t - 0.01 * r, "step": step, "rank": r, "values": own[r]})
        recs.append(_step(t, step, 1.0, data=0.125, **{"perf/straggler_rank": 1.0, "perf/straggler_excess_s": 0.3,
                                                       "perf/straggler_phase_index": 1.0,
                                                       "perf/straggler_median_s": 0.1}))
        if step == 3:
            recs += [_event(t + 0.5, "checkpoint_saved", 0, step=3, duration_s=0.4),
                     _event(t + 0.5, "checkpoint_saved", 1, step=3, duration_s=0.5)]
            t += 0.5
    recs.append({"kind": "metrics", "t": t + 1.0, "step": 7, "rank": 0, "values": {"perf/step_time": 9.0}})  # never closed
    recs.append(_event(t + 3.0, "diagnosis/rank_exited", 1, exited_rank=1, gone_for_s=1.5))
    recs.append({"kind": "bye", "t": t + 4.0, "rank": 0, "stats": {}})
    led = ledger(recs)
    r0, r1 = led["ranks"][0], led["ranks"][1]
    b0, b1 = r0["buckets_s"], r1["buckets_s"]
    assert r0["steps"] == r1["steps"] == 6 and r0["launches"] == r1["launches"] == 1
    assert b0["data_loading"] == pytest.approx(6 * 0.2) and b1["data_loading"] == pytest.approx(6 * 0.05)
    assert b0["straggler"] == pytest.approx(6 * 0.3) and b1["straggler"] == 0.0      # rank 0 waited for rank 1
    assert b0["productive"] == pytest.approx(6 * (1.0 - 0.2 - 0.3))
    assert b1["productive"] == pytest.approx(6 * (1.0 - 0.05))
    assert b0["checkpoint_save"] == pytest.approx(0.4) and b1["checkpoint_save"] == pytest.approx(0.5)
    # Its own process start to its own first step's beginning (rank 1's records are 0.01 s earlier).
    assert b0["startup"] == pytest.approx(6.0 - 1.0) and b1["startup"] == pytest.approx(5.99 - 1.0 - 0.5 - 0.8)
    assert b1["checkpoint_restore"] == pytest.approx(0.8) and b0["checkpoint_restore"] == 0.0
    # Rank 0 left (its bye); rank 1 was killed: from its last step until it was seen gone.
    assert b0["hang"] == 0.0 and b1["hang"] == pytest.approx(1.5 + 0.01)
    assert r0["wall_s"] == pytest.approx(t + 4.0 - T0) and r1["wall_s"] == pytest.approx(t + 1.5 - (T0 + 0.5))
    for rl in (r0, r1):
        assert sum(rl["buckets_s"].values()) == pytest.approx(rl["wall_s"], abs=1e-9)
        assert rl["goodput"] == pytest.approx(rl["buckets_s"]["productive"] / rl["wall_s"])
    assert "rank 0" in text(led) and "waited for other ranks 1.80 s" in text(led)
    # Without per-rank records, no per-rank ledger; the job's is the same either way.
    job_only = ledger([r for r in recs if not (r["kind"] == "metrics" and "rank" in r)])
    assert "ranks" not in job_only and job_only["buckets_s"] == led["buckets_s"]


def test_a_rank_that_began_a_step_late_waited_no_longer_than_its_step():
    """Rank 1 is slow in data loading by 0.3 s a step; at step 2 rank 0 began late (descheduled
    between steps on a busy host): its own step took 0.35 s, 0.2 s of it data loading, so it
    waited 0.15 s for rank 1 there, not the step's 0.3 s excess; its buckets still sum to its
    wall time and none is negative."""
    recs = [_hello(T0, 0, T0), _hello(T0, 1, T0)]
    t = T0 + 1.0
    for step, st0 in ((1, 0.6), (2, 0.35), (3, 0.6)):
        t += 0.6
        recs += [{"kind": "metrics", "t": t, "step": step, "rank": 0,
                  "values": {"perf/step_time": st0, "perf/data_loading_time": 0.2}},
                 {"kind": "metrics", "t": t, "step": step, "rank": 1,
                  "values": {"perf/step_time": 0.6, "perf/data_loading_time": 0.5}},
                 _step(t, step, 0.6, data=0.35, **{"perf/straggler_rank": 1.0, "perf/straggler_excess_s": 0.3,
                                                   "perf/straggler_phase_index": 0.0,
                                                   "perf/straggler_median_s": 0.2})]
    recs.append({"kind": "bye", "t": t, "rank": 0, "stats": {}})
    b0 = ledger(recs)["ranks"][0]["buckets_s"]
    assert b0["straggler"] == pytest.approx(0.3 + 0.15 + 0.3) and b0["data_loading"] == pytest.approx(3 * 0.2)
    assert b0["productive"] == pytest.approx(0.1 + 0.0 + 0.1) and min(b0.values()) >= 0.0
    assert sum(b0.values()) == pytest.approx(ledger(recs)["ranks"][0]["wall_s"], abs=1e-9)


def test_per_rank_records_the_ledger_cannot_keep_are_counted(monkeypatch):
    from telemetry.shared import goodput

    monkeypatch.setattr(goodput, "MAX_RANK_BOOKS", 1)
    recs = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)]
    t = T0 + 2
    for step in range(1, goodput.PENDING_STEPS + 11):   # 10 steps more than are held: never closed
        recs += [{"kind": "metrics", "t": t + step, "step": step, "rank": r, "values": {"perf/step_time": 1.0}}
                 for r in (0, 1)]
    for step in (1000, 1001):                           # closed: rank 1 has no ledger (one is kept)
        recs += [{"kind": "metrics", "t": t + step, "step": step, "rank": r, "values": {"perf/step_time": 1.0}}
                 for r in (0, 1)]
        recs.append(_step(t + step, step, 1.0))
    led = ledger(recs)
    assert list(led["ranks"]) == [0] and led["ranks"][0]["steps"] == 2
    # The 10 beyond the hold, and one more to make room for step 1000 (then closed).
    assert led["rank_steps_unmatched"] == 2 * 11 and led["rank_records_not_kept"] == 2


def test_a_hang_a_kill_and_a_restart_from_the_last_checkpoint():
    recs = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)]
    t = T0 + 5                                          # start-up 4 s (the first step is 1 s)
    for step in range(1, 9):
        recs.append(_step(t, step, 1.0))
        if step == 4:
            t += 0.5
            recs.append(_event(t, "checkpoint_saved", 0, step=4, duration_s=0.5))
        t += 1.0
    last_step_t = t - 1.0                               # step 8 ended; then rank 1 hangs
    killed = last_step_t + 30.0                         # killed after 30 s; the daemon says so 3.5 s later
    recs.append(_event(killed + 1.0, "diagnosis/rank_stopped", 1, silent_s=31.0))   # the daemon's: not the ranks'
    recs.append(_event(killed + 3.5, "diagnosis/rank_exited", 1, exit_code=-9, gone_for_s=3.5))
    restarted = killed + 7.0                            # the job supervisor relaunches 7 s later
    recs += [_hello(restarted + 3, 0, restarted), _hello(restarted + 3, 1, restarted + 0.2)]
    recs.append(_event(restarted + 4, "checkpoint_restored", 0, step=4, duration_s=1.5))
    t = restarted + 6.0                                 # first step of the new launch ends here
    for step in range(5, 11):
        recs.append(_step(t, step, 1.0))
        t += 1.0
    recs.append(_event(t, "train_end", 0, step=10))
    led = ledger(recs)
    b = led["buckets_s"]
    assert led["launches"] == 2 and led["steps"] == 8 + 6
    assert b["startup"] == pytest.approx(4.0)
    assert b["redone"] == pytest.approx(4 * 1.0)         # steps 5..8 of the first launch, done again
    assert b["hang"] == pytest.approx(30.0)
    assert b["checkpoint_restore"] == pytest.approx(1.5)
    assert b["recovery"] == pytest.approx((restarted + 5.0) - killed - 1.5)   # the failure -> the first step
    assert b["productive"] == pytest.approx(4 * 1.0 + 6 * 1.0)
    assert b["checkpoint_save"] == pytest.approx(0.5)
    _sums_to_wall(led)


def _bye(t: float, rank: int) -> dict:
    return {"kind": "bye", "t": t, "rank": rank, "stats": {}}


def _steps(t: float, first: int, last: int, step_time: float = 1.0) -> tuple[list[dict], float]:
    """Steps first..last of step_time each, the first ending at t: their records and the last's t."""
    recs = []
    for step in range(first, last + 1):
        recs.append(_step(t, step, step_time))
        t += step_time
    return recs, t - step_time


def _no_negative(led: dict) -> None:
    # (the records' times are seconds since the epoch: float64 resolves them to ~0.2 µs)
    assert all(v >= -1e-6 for v in led["buckets_s"].values()), led["buckets_s"]


def test_the_hung_rank_killed_while_its_peer_says_bye_after_its_error_is_a_hang_then_recovery():
    """Rank 1 hangs after step 8; the daemon says diagnosis/hang; rank 1 is SIGKILLed (the
    daemon sees it gone 0.01 s after, says rank_exited 3 s later); rank 0 gets the collective's
    error, saves an emergency checkpoint and says its bye; the job resumes from step 4. The
    last step -> the kill is the hang; the kill -> the new launch's first step, less its restore
    and rank 0's emergency save, is recovery; nothing of it unexplained."""
    recs = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)]
    steps, last = _steps(T0 + 5, 1, 8)
    recs += steps[:4] + [_event(last - 4, "checkpoint_saved", 0, step=4, duration_s=0.0)] + steps[4:]
    recs.append(_event(last + 20.0, "diagnosis/hang", 0, stalled_s=20.0))
    killed = last + 24.0
    recs.append(_event(killed + 0.2, "checkpoint_saved", 0, step=8, duration_s=0.15, reason="exception"))
    recs.append(_event(killed + 0.21, "emergency_checkpoint", 0, step=8, reason="exception"))
    recs.append(_bye(killed + 0.3, 0))
    recs.append(_event(killed + 3.0, "diagnosis/rank_exited", 1, exit_code=-9, gone_for_s=3.0))
    restarted = killed + 5.0
    recs += [_hello(restarted + 2, 0, restarted), _hello(restarted + 2, 1, restarted)]
    recs.append(_event(restarted + 3, "checkpoint_restored", 0, step=4, duration_s=1.0))
    more, end = _steps(restarted + 4.0, 5, 10)
    recs += more + [_event(end + 0.1, "train_end", 0, step=10), _bye(end + 0.2, 0), _bye(end + 0.2, 1)]
    led = ledger(recs)
    b = led["buckets_s"]
    _sums_to_wall(led)
    _no_negative(led)
    assert b["hang"] == pytest.approx(killed - last)
    assert b["recovery"] == pytest.approx((restarted + 3.0) - killed - 1.0 - 0.15)
    assert b["redone"] == pytest.approx(4.0) and b["checkpoint_save"] == pytest.approx(0.15)
    assert b["unexplained"] == pytest.approx(0.2)        # train_end -> the byes: it finished


def test_a_rank_that_raised_and_its_peers_error_byes_are_a_hang_to_the_end():
    """Rank 1's DataLoader worker is killed after step 6: rank 1 raises, saves an emergency
    checkpoint, says its bye; rank 0 waits in the collective until it errors, saves, says its
    bye. No train_end, every rank said bye: the emergency checkpoint says it failed; the last
    step -> the last record is the hang, less the saves."""
    recs = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)]
    steps, last = _steps(T0 + 3, 1, 6)
    recs += steps
    recs += [_event(last + 1.5, "checkpoint_saved", 1, step=6, duration_s=0.5, reason="exception"),
             _event(last + 1.5, "emergency_checkpoint", 1, step=6, reason="exception"), _bye(last + 1.6, 1),
             _event(last + 9.0, "checkpoint_saved", 0, step=6, duration_s=0.7, reason="exception"),
             _event(last + 9.0, "emergency_checkpoint", 0, step=6, reason="exception"), _bye(last + 9.1, 0)]
    led = ledger(recs)
    b = led["buckets_s"]
    _sums_to_wall(led)
    _no_negative(led)
    assert b["checkpoint_save"] == pytest.approx(0.7)      # the slowest rank's, per step
    assert b["hang"] == pytest.approx(9.1 - 0.7)
    assert b["unexplained"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("hang_first", [False, True], ids=["hang after the byes", "hang between the byes"])
def test_a_hang_decided_as_the_ranks_left_ends_no_later_than_their_byes(hang_first):
    """As test_a_rank_that_raised_and_its_peers_error_byes_are_a_hang_to_the_end, but the
    daemon's diagnosis/hang (decided when no step had come for its threshold, the last bye still
    on its way) is stamped 0.07 s after rank 0's bye: read after both byes, or between them. The
    ranks' byes say they left: the hang ends at the last bye, not at the diagnosis (seen in a
    fresh clone beside a CPU hog: the ledger's hang 0.07 s, once 3 s, past the ranks' exits)."""
    recs = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)]
    steps, last = _steps(T0 + 3, 1, 6)
    recs += steps + [_event(last + 0.01, "train_end", 1, step=6, status="failed", exit_code=1), _bye(last + 0.02, 1)]
    hang = _event(last + 4.43, "diagnosis/hang", None, ranks=[], step=6)
    tail = [_event(last + 4.35, "train_end", 0, step=6, status="failed", exit_code=1), _bye(last + 4.36, 0)]
    recs += ([hang] + tail) if hang_first else (tail + [hang])
    led = ledger(recs)
    b = led["buckets_s"]
    _sums_to_wall(led)
    _no_negative(led)
    assert b["hang"] == pytest.approx(4.36) and led["wall_s"] == pytest.approx(last + 4.36 - T0), (b, led["wall_s"])


def test_hung_ranks_a_launcher_tore_down_are_a_hang_until_the_scripts_exit():
    """Rank 1 hangs, the daemon says diagnosis/hang; `telemetry run`'s launcher is SIGTERMed and
    kills the ranks after its grace: no bye, and no rank_exited (the drain came within the
    daemon's exit grace). The drain's script_exit (exit code 1) is the launch's end: the last
    step -> it is hang, in a launch that was resumed (then recovery to the next first step) as in
    the last one (its wall ends there), never the hang's diagnosis alone; in each rank's ledger too."""
    recs = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)]
    steps, last = _steps(T0 + 5, 1, 8)
    recs += steps[:5] + [_event(steps[4]["t"] + 0.1, "checkpoint_saved", 0, step=5, duration_s=0.1)] + steps[5:]
    recs.append(_event(last + 4.6, "diagnosis/hang", 1))
    exited = last + 349.0
    alone = recs + [{"kind": "event", "t": exited, "rank": None, "name": "script_exit", "data": {"exit_code": 1}}]
    led = ledger(alone)
    _sums_to_wall(led)
    _no_negative(led)
    assert led["wall_s"] == pytest.approx(exited - T0)
    assert led["buckets_s"]["hang"] == pytest.approx(349.0)
    assert led["buckets_s"]["unexplained"] == pytest.approx(0.0, abs=1e-6)
    # Each rank's own ledger (its per-rank records 0.01 s before the step's) likewise, but for a
    # rank that said its bye (rank 0, after its collective's error): it ended there.
    per_rank = []
    for rec in alone[:-1] + [_bye(last + 1.0, 0), alone[-1]]:
        if rec["kind"] == "metrics":
            per_rank += [{"kind": "metrics", "t": rec["t"] - 0.01, "step": rec["step"], "rank": k,
                          "values": {"perf/step_time": 1.0}} for k in (0, 1)]
        per_rank.append(rec)
    ranks = ledger(per_rank)["ranks"]
    assert ranks[1]["buckets_s"]["hang"] == pytest.approx(349.0 + 0.01)
    assert ranks[0]["buckets_s"]["hang"] == pytest.approx(1.0 + 0.01)
    for rl in ranks.values():
        assert sum(rl["buckets_s"].values()) == pytest.approx(rl["wall_s"], abs=1e-6)
    restarted = exited + 27.0
    resumed = alone + [_hello(restarted + 2, 0, restarted), _hello(restarted + 2, 1, restarted),
                       _event(restarted + 3, "checkpoint_restored", 0, step=5, duration_s=0.5)]
    more, end = _steps(restarted + 6.0, 6, 12)
    resumed += more + [_event(end + 0.1, "train_end", 0, step=12), _bye(end + 0.2, 0), _bye(end + 0.2, 1)]
    led = ledger(resumed)
    b = led["buckets_s"]
    _sums_to_wall(led)
    _no_negative(led)
    assert led["launches"] == 2
    assert b["hang"] == pytest.approx(349.0)
    assert b["recovery"] == pytest.approx((restarted + 5.0) - exited - 0.5)
    assert b["redone"] == pytest.approx(3.0 - 0.1)     # steps 6-8, the first booked from the save's end
    # A script that exited 0, or that finished training first, keeps its end where it was.
    for data in ({"exit_code": 0}, {"exit_code": 1}):
        done = recs[:-1] + [_event(last + 0.5, "train_end", 0, step=8)] * (data["exit_code"] == 1) + \
            [{"kind": "event", "t": exited, "rank": None, "name": "script_exit", "data": data}]
        assert ledger(done)["wall_s"] < exited - T0


def test_the_scripts_exit_time_from_its_drain_request_is_the_launchs_end_not_the_drain():
    """`telemetry run` stamps when the script's wait returned (exited_at) in its drain request;
    the daemon's script_exit event comes the drain's latency later (0.8 s here). The launch ends
    at exited_at, in the job's ledger, each rank's, and a resumed job's recovery; without it (an
    older `telemetry run`, a bad value) at the event, as before; never after the event."""
    recs = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)]
    steps, last = _steps(T0 + 5, 1, 8)
    recs += steps + [_event(last + 4.6, "diagnosis/hang", 1)]
    exited, drained = last + 30.0, last + 30.8

    def exit_event(**data) -> dict:
        return {"kind": "event", "t": drained, "rank": None, "name": "script_exit", "data": {"exit_code": 1, **data}}

    for data, end in (({"exited_at": exited}, exited), ({}, drained), ({"exited_at": "soon"}, drained),
                      ({"exited_at": float("inf")}, drained), ({"exited_at": True}, drained),
                      ({"exited_at": drained + 5.0}, drained)):
        stream = recs + [exit_event(**data)]
        led = ledger(stream)
        _sums_to_wall(led)
        _no_negative(led)
        assert led["wall_s"] == pytest.approx(end - T0), data
        assert led["buckets_s"]["hang"] == pytest.approx(end - last), data
        assert led["buckets_s"]["unexplained"] == pytest.approx(0.0, abs=1e-6), data
        # Each rank's ledger (its per-rank records 0.01 s before the step's): rank 1 hung to the end.
        per_rank = []
        for rec in stream:
            if rec["kind"] == "metrics":
                per_rank += [{"kind": "metrics", "t": rec["t"] - 0.01, "step": rec["step"], "rank": k,
                              "values": {"perf/step_time": 1.0}} for k in (0, 1)]
            per_rank.append(rec)
        for rl in ledger(per_rank)["ranks"].values():
            assert rl["buckets_s"]["hang"] == pytest.approx(end - last + 0.01), data
            assert sum(rl["buckets_s"].values()) == pytest.approx(rl["wall_s"], abs=1e-6)
    # Resumed: recovery runs from the script's exit to the new launch's first step (less its restore).
    restarted = drained + 20.0
    more, end = _steps(restarted + 6.0, 9, 12)
    resumed = recs + [exit_event(exited_at=exited), _hello(restarted + 2, 0, restarted), _hello(restarted + 2, 1, restarted),
                      _event(restarted + 3, "checkpoint_restored", 0, step=8, duration_s=0.5)] + \
        more + [_event(end + 0.1, "train_end", 0, step=12), _bye(end + 0.2, 0), _bye(end + 0.2, 1)]
    led = ledger(resumed)
    _sums_to_wall(led)
    _no_negative(led)
    assert led["launches"] == 2
    assert led["buckets_s"]["hang"] == pytest.approx(exited - last)
    assert led["buckets_s"]["recovery"] == pytest.approx((restarted + 5.0) - exited - 0.5)


def test_a_launch_that_ends_after_the_next_one_began_is_never_counted_twice():
    """The job supervisor relaunched while the old launch's last record was still to come (a
    rank's late record): the old launch ends when the new one's processes start, so its hang,
    the recovery and the new launch's restore do not overlap, and no bucket is below zero."""
    recs = [_hello(T0 + 1, 0, T0)]
    steps, last = _steps(T0 + 3, 1, 6)
    recs += steps
    restarted = last + 10.0
    recs.append(_event(restarted + 1.0, "note", 0))              # the old launch's, its last
    recs.append(_hello(restarted + 1.2, 0, restarted))           # the new one's, begun before it
    recs.append(_event(restarted + 1.9, "checkpoint_restored", 0, step=6, duration_s=1.5))
    more, end = _steps(restarted + 3.0, 7, 9)
    recs += more + [_event(end, "train_end", 0, step=9), _bye(end, 0)]
    led = ledger(recs)
    b = led["buckets_s"]
    _sums_to_wall(led)
    _no_negative(led)
    assert led["launches"] == 2
    assert b["hang"] + b["recovery"] + b["checkpoint_restore"] == pytest.approx((restarted + 2.0) - last)


def test_the_slowest_ranks_times_never_overlap_on_the_jobs_timeline():
    """Each phase's figure is the slowest rank's; when ranks are offset, the slowest rank's step
    began while another rank still did what came before (the step before, a save, a restore):
    a step's time is booked from the end of what came before it, so nothing is counted twice and
    no bucket goes below zero."""
    recs = [_hello(T0 + 0.5, 0, T0), _hello(T0 + 0.5, 1, T0)]
    recs.append(_event(T0 + 2.0, "checkpoint_restored", 1, step=0, duration_s=1.0))   # [T0+1, T0+2]
    recs.append(_step(T0 + 3.0, 1, 1.4))            # rank 0 restored sooner: its step began at T0+1.6
    recs.append(_step(T0 + 4.0, 2, 1.3))            # rank 1 ended step 1 0.3 s before the last rank
    recs.append(_event(T0 + 4.5, "checkpoint_saved", 1, step=2, duration_s=0.6))   # began before step 2's record
    recs.append(_step(T0 + 5.5, 3, 1.2))            # began during rank 1's save
    recs += [_event(T0 + 5.5, "train_end", 0, step=3), _bye(T0 + 5.5, 0), _bye(T0 + 5.5, 1)]
    led = ledger(recs)
    b = led["buckets_s"]
    _sums_to_wall(led)
    _no_negative(led)
    assert b["productive"] == pytest.approx(1.0 + 1.0 + 1.0)
    assert b["checkpoint_restore"] == pytest.approx(1.0) and b["checkpoint_save"] == pytest.approx(0.5)
    assert b["startup"] == pytest.approx(1.0) and b["unexplained"] == pytest.approx(0.0, abs=1e-6)


def test_a_hang_the_daemon_saw_lasts_at_least_until_it_said_so():
    """The whole job killed with nothing more said of it (no exit watcher where its ranks ran):
    the launch lasted until the daemon said diagnosis/hang, and that time is the hang."""
    recs = [_hello(T0 + 1, 0, T0)]
    steps, last = _steps(T0 + 3, 1, 4)
    recs += steps + [_event(last + 60.0, "diagnosis/hang", 0, stalled_s=60.0)]
    led = ledger(recs)
    _sums_to_wall(led)
    assert led["buckets_s"]["hang"] == pytest.approx(60.0) and led["wall_s"] == pytest.approx(last + 60.0 - T0)


def test_a_long_save_the_daemon_took_for_a_hang_before_train_end_is_no_hang():
    recs = [_hello(T0 + 1, 0, T0)]
    steps, last = _steps(T0 + 3, 1, 4)
    recs += steps + [_event(last + 60.0, "diagnosis/hang", 0, stalled_s=60.0),
                     _event(last + 90.0, "checkpoint_saved", 0, step=4, duration_s=90.0),
                     _event(last + 90.0, "train_end", 0, step=4), _bye(last + 90.1, 0)]
    b = ledger(recs)["buckets_s"]
    assert b["hang"] == 0.0 and b["checkpoint_save"] == pytest.approx(90.0)
    assert b["unexplained"] == pytest.approx(0.1)


def test_a_script_that_sends_no_step_time_gets_a_ledger_from_its_records_times():
    """A W&B script's rows carry no perf/step_time: the time between its steps' records is its
    step time; start-up runs to the first; a failed finish (train_end status failed) makes the
    time from the last step a hang. The buckets sum to the wall time."""
    recs = [_hello(T0 + 0.5, 0, T0)]
    t = T0 + 4.0                                    # the first row: 4 s after the process began
    for step in range(0, 10):
        recs.append({"kind": "metrics", "t": t, "step": step, "values": {"loss": 1.0 / (step + 1)}})
        t += 0.5
    last = t - 0.5
    recs.append({"kind": "metrics", "t": last + 0.25, "step": 9, "values": {"val/loss": 0.1}})   # the same row, later
    recs += [_event(last + 2.0, "train_end", 0, status="failed", exit_code=1), _bye(last + 2.1, 0)]
    led = ledger(recs)
    b = led["buckets_s"]
    _sums_to_wall(led)
    _no_negative(led)
    assert led["steps"] == 10 and led["wall_s"] == pytest.approx(last + 2.1 - T0)
    assert b["startup"] == pytest.approx(4.0)
    assert b["productive"] == pytest.approx(9 * 0.5 + 0.25)
    assert b["hang"] == pytest.approx(2.1 - 0.25) and b["unexplained"] == pytest.approx(0.0, abs=1e-6)
    fine = [r for r in recs if r.get("name") != "train_end"] + [_event(last + 2.0, "train_end", 0, status="finished",
                                                                       exit_code=0)]
    b = ledger(sorted(fine, key=lambda r: r["t"]))["buckets_s"]
    assert b["hang"] == 0.0 and b["unexplained"] == pytest.approx(2.1 - 0.25)


def test_each_rank_of_a_script_that_times_nothing_gets_a_ledger_too():
    """--per-rank records of two ranks that send no perf/step_time: each rank's ledger takes its
    own records' times, as the job's does; it sums to its wall time."""
    recs = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0 + 0.5)]
    for step in range(5):
        t = T0 + 3.0 + step
        recs += [{"kind": "metrics", "t": t - 0.1 * r, "step": step, "rank": r, "values": {"loss": 1.0}} for r in (0, 1)]
        recs.append({"kind": "metrics", "t": t, "step": step, "values": {"loss": 1.0}})
    recs += [_bye(T0 + 7.5, 0), _bye(T0 + 7.5, 1)]
    led = ledger(recs)
    assert led["steps"] == 5 and led["buckets_s"]["productive"] == pytest.approx(4.0)
    for r in (0, 1):
        rl = led["ranks"][r]
        assert rl["steps"] == 5 and rl["buckets_s"]["productive"] == pytest.approx(4.0), rl
        assert rl["buckets_s"]["startup"] == pytest.approx(3.0 - 0.1 * r - 0.5 * r), rl
        assert sum(rl["buckets_s"].values()) == pytest.approx(rl["wall_s"], abs=1e-6)


def test_a_loop_of_your_own_that_closes_its_client_has_no_hang():
    """No train_end event (your own loop does not send one): its bye says it left; the time from
    its last step to the bye is unexplained, not a hang."""
    recs = [_hello(T0 + 1, 0, T0), _step(T0 + 3, 1, 1.0), _step(T0 + 4, 2, 1.0),
            {"kind": "bye", "t": T0 + 4.5, "rank": 0, "stats": {}}]
    b = ledger(recs)["buckets_s"]
    assert b["hang"] == 0.0 and b["unexplained"] == pytest.approx(0.5) and b["startup"] == pytest.approx(2.0)


def test_no_steps_is_said_not_divided_by_zero():
    led = ledger([_hello(T0, 0, T0 - 1), _event(T0 + 1, "note", 0)])
    assert led["goodput"] is None and led["wall_s"] == 0.0
    assert "nothing to account" in text(led)
    assert ledger([])["launches"] == 0


@pytest.mark.slow
def test_the_trainer_on_two_ranks_against_the_injected_truth(tmp_path):
    """2 CPU ranks under `telemetry run`: every rank waits 0.4 s for data per step and every
    checkpoint save sleeps 1.5 s first. The data bucket lies within the ranks' own data loading
    times (their loss logs, written apart from telemetry); the data and checkpoint buckets are the
    injected time within 1 % of the wall time, and the saves match the run's timeline; the buckets
    sum to the wall time; start-up, eval and slow steps are the run's own timeline's within 1 % of
    the wall time too; straggler at most what the ranks' own phase times say one waited for the
    other (all ranks slept alike, but a loaded machine can slow one rank for steps on end: a real
    straggler); unexplained at most 2 %, no bucket below zero; `telemetry goodput` prints it and
    writes the JSON."""
    steps, slow_data, slow_save, saves = 20, 0.4, 1.5, 2
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="disabled", TELEMETRY_RUNTIME_DIR=str(tmp_path / "rt"))
    (tmp_path / "d.yaml").write_text(json.dumps({"aggregator": {"per_rank": True}}))    # the ranks' own records
    p = subprocess.run([sys.executable, "-m", "telemetry", "run", "--quiet", "--nproc", "2", "--run-dir",
                        str(run_dir), "--daemon-config", str(tmp_path / "d.yaml"), "--", "-m", "trainer.train", "--config", str(ROOT / "launch/configs/tiny.yaml"),
                        f"run_dir={run_dir}", f"steps={steps}", "log_every=1", "eval.every_steps=10",
                        "checkpoint.every_steps=10", "debug.slow_rank=-1", "debug.slow_phase=data",
                        f"debug.slow_s={slow_data}", f"debug.slow_checkpoint_s={slow_save}",
                        f"debug_loss_log={tmp_path}/loss{{rank}}.jsonl", "eval.num_batches=1", *SMALL],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = subprocess.run([sys.executable, "-m", "telemetry", "goodput", str(run_dir), "--json", str(tmp_path / "g.json")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    led = json.loads((tmp_path / "g.json").read_text())
    b, wall = led["buckets_s"], led["wall_s"]
    assert led["steps"] == steps and led["launches"] == 1 and led["steps_missing"] == 0
    assert sum(b.values()) == pytest.approx(wall, abs=1e-6)
    # The ranks' own record of their data loading, step by step.
    own_log = [{json.loads(line)["step"]: json.loads(line) for line in (tmp_path / f"loss{r}.jsonl").read_text().splitlines()}
               for r in (0, 1)]
    own = [{s: row["data_loading_time"] for s, row in own_log[r].items()} for r in (0, 1)]
    mean = sum((own[0][s] + own[1][s]) / 2 for s in range(1, steps + 1))
    least = sum(min(own[0][s], own[1][s]) for s in range(1, steps + 1))
    most = sum(max(own[0][s], own[1][s]) for s in range(1, steps + 1))
    # The ranks' mean, but for a step whose straggler was slow in data loading: the others' wait
    # for data then (the excess is the straggler bucket's), unless that excess is within the
    # run's own noise, which stays in data loading: at most the slowest rank's own data time.
    assert least - 1e-6 <= b["data_loading"] <= most + 1e-6 and least >= steps * slow_data, (b, least, mean, most)
    print(f"data bucket - injected {b['data_loading'] - steps * slow_data:.3f} s, checkpoint bucket - injected "
          f"{b['checkpoint_save'] - saves * slow_save:.3f} s, of {wall:.2f} s wall")
    # The truth within 1 % of the wall time, each part measured apart from telemetry: the data
    # bucket is the injected sleeps plus what the loader itself took (the ranks' own timer,
    # above); the checkpoint bucket is, per save, the slowest rank's own save time, which is the
    # injected sleep (as slept) plus torch.save's own work (the ranks' save logs). The real work
    # is the machine's: on the loaded dev box the saves' own work was 0.07-0.23 s, up to 1.04 %
    # of the wall, and the loader's 0.08-0.15 s (then with a loader worker), so the injected time
    # alone is no 1 % bound.
    assert abs(b["data_loading"] - steps * slow_data) <= 0.01 * wall + (least - steps * slow_data), (b, wall)
    own_saves = {}
    for r in (0, 1):
        for line in (tmp_path / f"loss{r}.jsonl.saves").read_text().splitlines():
            row = json.loads(line)
            own_saves.setdefault(row["step"], []).append(row)
    assert sorted(own_saves) == [10, 20] and all(len(rows) == 2 for rows in own_saves.values()), own_saves
    slept = sum(max(row["injected_s"] for row in rows) for rows in own_saves.values())
    truth = sum(max(row["duration_s"] for row in rows) for rows in own_saves.values())
    assert slept >= saves * slow_save and abs(b["checkpoint_save"] - truth) <= 0.01 * wall, (b, truth, slept, wall)
    print(f"checkpoint: injected {slept:.3f} s as slept, the saves' own work {truth - slept:.3f} s")
    # The saves on the run's own timeline: a save follows the eval of steps 10 and 20 (whose
    # record is stamped when the eval ended), and the next step begins (its end less its step
    # time), or training ends, when the save is done.
    log_dir = find_log_dir(run_dir)
    recs = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    steps_at = {r["step"]: r for r in recs if r["kind"] == "metrics" and "rank" not in r}
    end = max(r["t"] for r in recs if r["kind"] == "event" and r["name"] == "train_end")
    on_timeline = (steps_at[11]["t"] - steps_at[11]["values"]["perf/step_time"] - steps_at[10]["t"]) \
        + (end - steps_at[20]["t"])
    # The timeline starts at the later rank's eval end, the slowest save at the earlier rank's: they
    # differ by that skew (0.03 s on the dev box, 0.2 % of the wall time); bounded loosely here
    # so a loaded machine's skew cannot fail it, tightly enough to catch a save counted twice.
    assert b["checkpoint_save"] >= saves * slow_save
    assert abs(b["checkpoint_save"] - on_timeline) <= 0.05 * wall, (b, on_timeline, wall)
    assert b["startup"] > 0 and b["eval"] > 0 and b["productive"] > 0
    assert b["hang"] == b["redone"] == b["recovery"] == b["checkpoint_restore"] == 0.0
    # Every other bucket against the run's own timeline, within 1 % of the wall time: start-up is
    # the first process's start (the kernel's, the hellos say it) -> the job's first step began
    # (from the first rank's beginning to the last's, by their own logs); an eval runs from its
    # step's end (the later rank's) to its save's start (the slowest rank's save, as its event
    # ends it), or to the next step's beginning; all ranks slept alike, so no slow step beyond
    # the noise. Straggler: at most what the straggler series says the others waited, each step's
    # excess exactly the two ranks' own figures for its phase (their per-rank records); a rank
    # the load slowed for steps on end is a real straggler (0.54 s of a 29.9 s wall once in CI).
    started = min(r["info"]["started_at"] for r in recs if r["kind"] == "hello")
    ends = {k: max(own_log[r][k]["t"] for r in (0, 1)) for k in (10, 20)}
    save_began = {k: max(e["t"] for e in recs if e.get("name") == "checkpoint_saved" and e["data"]["step"] == k)
                  - max(e["data"]["duration_s"] for e in recs if e.get("name") == "checkpoint_saved"
                        and e["data"]["step"] == k) for k in (10, 20)}
    truth = {"startup": _startup_truth(b["startup"], own_log, started),
             "eval": sum(save_began[k] - ends[k] for k in (10, 20)),
             "slow_steps": 0.0}
    for k, v in truth.items():
        assert abs(b[k] - v) <= 0.01 * wall, (k, b[k], v, wall, b)
    waited = sum(e for _, _, e in _straggler_series(recs, range(1, steps + 1)).values())
    assert 0.0 <= b["straggler"] <= waited + 1e-6, (b["straggler"], waited, b)
    print(f"straggler {b['straggler']:.3f} s booked of {waited:.3f} s the series says was waited")
    # The rest is what nothing times (logging, the bye): small, never a bucket counted twice.
    _no_negative(led)
    assert b["unexplained"] <= 0.02 * wall, (b, wall)
    assert f"{100 * led['goodput']:.1f} %" in out.stdout and "biggest loss:" in out.stdout
    # `telemetry run` closed the run with the same ledger: goodput.json and the summary's line.
    assert json.loads((log_dir / "goodput.json").read_text()) == led
    assert f"goodput            {100 * led['goodput']:.1f} % of" in p.stdout, p.stdout[-2000:]


WANDB_SCRIPT = """
import time, wandb
time.sleep(1.0)                                    # imports, a model, a data set
run = wandb.init(project="p", name="goodput")
for it in range(20):
    time.sleep(0.05)                               # a step
    wandb.log({"train/loss": 1.0 / (it + 1)})
time.sleep(0.5)                                    # what the script does after its last step
wandb.finish()
"""


@pytest.mark.slow
def test_a_wandb_scripts_run_has_a_ledger_that_sums_to_its_wall_time(tmp_path):
    """A W&B script under `telemetry run --as-wandb` sends no perf/step_time: its ledger takes
    the step times from its rows' own times; its buckets sum to its wall time; the steps' time,
    timed in the script, is productive within 1 % of the wall; `telemetry goodput` prints it."""
    (tmp_path / "train.py").write_text(WANDB_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update(WANDB_MODE="disabled", PYTHONPATH=str(ROOT), TELEMETRY_RUNTIME_DIR=str(tmp_path / "rt"))
    p = subprocess.run([sys.executable, "-m", "telemetry", "run", "--as-wandb", "--quiet", "--run-dir",
                        str(tmp_path / "r"), "--", "train.py"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = subprocess.run([sys.executable, "-m", "telemetry", "goodput", str(tmp_path / "r"), "--json",
                          str(tmp_path / "g.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "nothing to account" not in out.stdout, out.stdout + out.stderr
    led = json.loads((tmp_path / "g.json").read_text())
    b, wall = led["buckets_s"], led["wall_s"]
    print(out.stdout)
    assert led["steps"] == 20 and led["launches"] == 1, led
    _sums_to_wall(led)
    _no_negative(led)
    # The rows' own times: the first row's end -> the last's is the steps' time (the first
    # row's step is in start-up: nothing says when it began).
    rows = [json.loads(line) for line in (find_log_dir(tmp_path / "r") / "metrics.jsonl").read_text().splitlines()]
    t = sorted(r["t"] for r in rows if r["kind"] == "metrics" and "rank" not in r)
    assert abs(b["productive"] + b["telemetry"] - (t[-1] - t[0])) <= 0.01 * wall, (b, t[-1] - t[0], wall)
    assert b["productive"] >= 19 * 0.05 and b["startup"] >= 1.0 and b["hang"] == 0.0, b


def _checkpointed_step(log_dir: Path) -> int:
    """The last aggregated step in metrics.jsonl within what the daemon's checkpoint counts
    (sources.json's jsonl end); -1 before one."""
    try:
        end = json.loads((log_dir / "sources.json").read_bytes())["jsonl"]["end"]
    except (OSError, ValueError, KeyError):
        return -1
    steps = [rec["step"] for line in (log_dir / "metrics.jsonl").read_bytes()[:end].splitlines()
             if (rec := json.loads(line))["kind"] == "metrics" and "rank" not in rec]
    return max(steps, default=-1)


def _trainer(d, run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "trainer.train",
         "--config", str(ROOT / "launch/configs/tiny.yaml"), f"run_dir={run_dir}", "steps=12", "log_every=1",
         "eval.every_steps=0", "checkpoint.every_steps=5", f"telemetry_endpoint={d.ingest}", *SMALL, *extra],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)


@pytest.mark.slow
@pytest.mark.timeout(900)     # hang detectors below, generous for a loaded machine
def test_a_real_hang_kill_and_restart_of_the_trainer(make_daemon, tmp_path):
    """The trainer on 2 ranks, one daemon for the whole job: rank 1 hangs at step 9, the job is
    killed 4 s after step 8, and relaunched on the run dir; it resumes from the step-5 checkpoint
    and finishes. Two launches; steps 6-8 of the first are work redone, at their own step times;
    the restore is the trainer's own figure; the hang is the time from step 8 to the kill (within
    1 % of the wall time), and hang + recovery is exactly the time from step 8 to the new launch's
    first step less the restore; the buckets sum to the wall time."""
    import signal
    import time

    import psutil

    d = make_daemon(world_size=2, config={"pollers": {"nvml_enabled": False}})
    run_dir = tmp_path / "run"
    first = _trainer(d, run_dir, "debug.hang_step=9", "debug.hang_rank=1")
    try:
        steps = lambda rs: {r["step"]: r for r in rs if r["kind"] == "metrics" and "rank" not in r}   # noqa: E731
        recs = d.wait_for(lambda rs: 8 in steps(rs), timeout_s=300)
        time.sleep(4.0)
        # The whole job at once, as a scheduler's kill does: the ranks (torchrun starts them in
        # sessions of their own) and torchrun.
        job = [*psutil.Process(first.pid).children(recursive=True), psutil.Process(first.pid)]
        killed_at = time.time()
        for proc in job:
            proc.send_signal(signal.SIGKILL)
        first.wait(60)
        d.wait_for(lambda rs: sum(r.get("name") == "diagnosis/rank_exited" for r in rs) >= 2, timeout_s=120)
    finally:
        if first.poll() is None:
            for proc in psutil.Process(first.pid).children(recursive=True):
                proc.kill()
            first.kill()
            first.wait(30)
    second = _trainer(d, run_dir)
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-3000:]
    d.wait_for(lambda rs: any(r.get("name") == "train_end" for r in rs), timeout_s=120)
    d.drain()
    recs = d.read_jsonl()
    led = ledger(recs)
    b = led["buckets_s"]
    assert led["launches"] == 2, led
    _sums_to_wall(led)
    rows = [r for r in recs if r["kind"] == "metrics" and "rank" not in r]
    first_run = {r["step"]: r for r in rows if r["t"] <= killed_at}
    second_run = {r["step"]: r for r in rows if r["t"] > killed_at}
    assert sorted(first_run) == list(range(1, 9)) and sorted(second_run) == list(range(6, 13))
    assert led["steps"] == 8 + 7
    # At their step times as booked on the job's timeline: the slowest rank's, but never from
    # before the step before's record (ranks offset by a few ms).
    redone = sum(first_run[s]["values"]["perf/step_time"] for s in (6, 7, 8))
    assert b["redone"] <= redone + 1e-9 and abs(b["redone"] - redone) <= 0.01 * led["wall_s"], (b, redone)
    (restored,) = [r for r in recs if r.get("name") == "checkpoint_restored" and r["rank"] == 1] or \
        [r for r in recs if r.get("name") == "checkpoint_restored"][:1]
    assert restored["data"]["step"] == 5
    restore = max(r["data"]["duration_s"] for r in recs if r.get("name") == "checkpoint_restored")
    assert b["checkpoint_restore"] == pytest.approx(restore, rel=1e-9)
    hang_truth = killed_at - first_run[8]["t"]
    print(f"ledger {b}, wall {led['wall_s']:.3f} s, hang truth {hang_truth:.3f} s")
    # The hang ends when the ranks died: the daemon's exit watcher notes it to the millisecond
    # (the stage's own look, once a tick, came up to a second later). Within 1 % of the wall time.
    assert abs(b["hang"] - hang_truth) <= 0.01 * led["wall_s"], (b, hang_truth, led["wall_s"])
    # The first step began when its slowest rank's step time says, but not before the restore
    # ended on the last rank (what the slowest rank's step time holds of the wait for it is the
    # restore's).
    restored_at = max(r["t"] for r in recs if r.get("name") == "checkpoint_restored")
    began = max(second_run[6]["t"] - second_run[6]["values"]["perf/step_time"], restored_at)
    assert b["hang"] + b["recovery"] == pytest.approx(began - first_run[8]["t"] - restore, abs=1e-6)


HANG = {"hang_min_s": 4.0, "hang_factor": 10.0, "hang_stacks_wait_s": 2.0, "hang_py_spy": False, "warmup_steps": 2}


def _pid_of(recs: list[dict], rank: int) -> int:
    """The pid rank `rank`'s last hello says (the launch running now)."""
    return [r["info"]["pid"] for r in recs if r["kind"] == "hello" and r["rank"] == rank][-1]


def _watch_exit(pid: int) -> dict:
    """Watch the process `pid` (not our child) on a thread: the dict gets "at", when it was
    first seen gone (polled every 10 ms)."""
    import threading
    import time

    import psutil

    seen: dict = {}

    def watch() -> None:
        while True:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)
        seen["at"] = time.time()

    threading.Thread(target=watch, daemon=True).start()
    return seen


def _startup_truth(booked: float, own: list[dict], started: float) -> float:
    """Start-up's truth: the launch's start (`started`) to its first step's beginning, which is a
    range where the ranks began that step apart (tenths of a second on a loaded box, the first
    step's straggler): from the first rank's beginning to the last's, by their own logs. The
    ledger's figure (`booked`) where it lies within that range, else the nearer end."""
    began = [own[r][1]["t"] - own[r][1]["step_time"] for r in (0, 1)]
    return min(max(booked, min(began) - started), max(began) - started)


def _straggler_series(recs: list[dict], steps) -> dict[int, tuple[int, str, float]]:
    """Each of `steps` whose aggregated record names a straggler: (rank, phase, excess), the excess
    checked to be exactly what the two ranks' own figures for that phase say (their per-rank
    records)."""
    from telemetry.daemon.straggler_view import PHASES

    agg = {r["step"]: r["values"] for r in recs if r["kind"] == "metrics" and "rank" not in r}
    per_rank: dict = {}
    for r in recs:
        if r["kind"] == "metrics" and "rank" in r:     # an eval step's two parts, merged
            per_rank.setdefault((r["step"], r["rank"]), {}).update(r["values"])
    out = {}
    for s in steps:
        v = agg[s]
        if "perf/straggler_rank" not in v:
            continue
        named, phase = int(v["perf/straggler_rank"]), PHASES[int(v["perf/straggler_phase_index"])]
        key = f"perf/{phase}_time"
        assert v["perf/straggler_excess_s"] == pytest.approx(
            per_rank[(s, named)][key] - per_rank[(s, 1 - named)][key], abs=1e-9), (s, v)
        out[s] = (named, phase, v["perf/straggler_excess_s"])
    return out


def _against_truth(led: dict, truth: dict[str, float]) -> None:
    """Every bucket of `truth` within 1 % of the wall time of it; the rest of what nothing
    injected at most 2 % unexplained; no bucket below zero; the buckets sum to the wall time."""
    b, wall = led["buckets_s"], led["wall_s"]
    print("ledger - truth, % of wall:", {k: round(100 * (b[k] - v) / wall, 3) for k, v in truth.items()})
    _sums_to_wall(led)
    _no_negative(led)
    for k, v in truth.items():
        assert abs(b[k] - v) <= 0.01 * wall, (k, b[k], v, wall, b)
    assert b["unexplained"] <= 0.02 * wall, (b, wall)


def _own_log(path_of_rank) -> list[dict[int, dict]]:
    """Each rank's own per-step log (the trainer's debug_loss_log, written apart from telemetry):
    step -> its row (t: the step's end; step_time, data_loading_time: the rank's own timing)."""
    return [{json.loads(line)["step"]: json.loads(line) for line in path_of_rank(r).read_text().splitlines()}
            for r in (0, 1)]


def _own_steps(own: list[dict[int, dict]], steps) -> tuple[float, float]:
    """What the ranks' own logs say of `steps` (counted on the job's timeline): (data loading, the
    ranks' mean; the rest of the steps, the slowest rank's step time less that: the job's step
    time is the slowest rank's). A step one rank's log lacks (the last of a rank that raised: its
    log's writer thread went with it) is the other rank's alone."""
    rows = [[own[r][s] for r in (0, 1) if s in own[r]] for s in steps]
    data = sum(sum(row["data_loading_time"] for row in both) / len(both) for both in rows)
    step_time = sum(max(row["step_time"] for row in both) for both in rows)
    return data, step_time - data


def _rest_of_the_steps(led: dict, truth: float) -> None:
    """productive + straggler + slow steps against the rest of the steps' time by the ranks' own
    logs, within 1 % of the wall. Not each alone: with nothing injected, a busy box still makes
    one rank wait for the other now and then (seen: straggler 1.5 % of a 10 s wall beside a
    CPU hog), a real wait the ledger books as straggler, and the ranks' logs (a step's whole
    time) cannot tell it from compute."""
    b, wall = led["buckets_s"], led["wall_s"]
    rest = b["productive"] + b["straggler"] + b["slow_steps"]
    assert abs(rest - truth) <= 0.01 * wall, (rest, truth, wall, b)


def _own_saves(*paths: Path) -> float:
    """The saves the ranks' own logs time (<loss log>.saves), each its slowest rank's: a launch's
    files together (its saves' steps apart)."""
    slowest: dict[int, float] = {}
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                slowest[row["step"]] = max(slowest.get(row["step"], 0.0), row["duration_s"])
    return sum(slowest.values())


@pytest.mark.slow
@pytest.mark.timeout(900)     # hang detectors below, generous for a loaded machine
def test_a_hung_rank_killed_once_the_daemon_says_hang_then_a_resume(make_daemon, tmp_path):
    """The usual end of a hung job: rank 1 hangs in forward at step 9; once the daemon says
    diagnosis/hang, rank 1 alone is SIGKILLed; rank 0 gets the collective's error, saves an
    emergency checkpoint and says its bye; torchrun ends; the job is resumed from the step-5
    checkpoint and finishes. Timed from outside: the hang is rank 1's last step -> the kill; the
    recovery is the kill -> the new launch's first step, less its restore and rank 0's
    emergency save after the kill (the ranks' own save logs); work redone, the restore: the
    ranks' own figures; every other bucket too: start-up the first process's start -> the first
    step, data loading and the rest of the steps counted (the first launch's up to its
    checkpoint, the second's: productive, straggler and slow steps together) by the ranks' own
    logs, the saves theirs, nothing else lost (eval, exclusions: none run; the client's own
    time: a few ms). Each within 1 % of the wall time, unexplained at most 2 %, no bucket below
    zero."""
    import signal
    import time

    d = make_daemon(world_size=2, config={"pollers": {"nvml_enabled": False}, "diagnosis": HANG})
    run_dir = tmp_path / "run"
    first = _trainer(d, run_dir, "debug.hang_step=9", "debug.hang_rank=1", f"debug_loss_log={tmp_path}/a{{rank}}.jsonl")
    try:
        recs = d.wait_for(lambda rs: any(r.get("name") == "diagnosis/hang" for r in rs), timeout_s=300)
        killed_at = time.time()
        os.kill(_pid_of(recs, 1), signal.SIGKILL)
        first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(30)
    second = _trainer(d, run_dir, f"debug_loss_log={tmp_path}/b{{rank}}.jsonl")
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-3000:]
    d.wait_for(lambda rs: any(r.get("name") == "train_end" for r in rs), timeout_s=120)
    d.drain()
    recs = d.read_jsonl()
    led = ledger(recs)
    b = led["buckets_s"]
    rows = [r for r in recs if r["kind"] == "metrics" and "rank" not in r]
    first_run = {r["step"]: r for r in rows if r["t"] <= killed_at}
    second_run = {r["step"]: r for r in rows if r["t"] > killed_at}
    assert led["launches"] == 2 and sorted(first_run) == list(range(1, 9)), (led, sorted(first_run))
    began = second_run[6]["t"] - second_run[6]["values"]["perf/step_time"]
    restore = max(r["data"]["duration_s"] for r in recs if r.get("name") == "checkpoint_restored")
    saves = [json.loads(line) for r in (0, 1) for line in (tmp_path / f"a{r}.jsonl.saves").read_text().splitlines()]
    emergency = max((row["duration_s"] for row in saves if row["step"] > 5), default=0.0)
    print(f"ledger {b}, wall {led['wall_s']:.3f} s, hang truth {killed_at - first_run[8]['t']:.3f} s")
    own_a, own_b = _own_log(lambda r: tmp_path / f"a{r}.jsonl"), _own_log(lambda r: tmp_path / f"b{r}.jsonl")
    (a_data, a_rest), (b_data, b_rest) = _own_steps(own_a, range(1, 6)), _own_steps(own_b, range(6, 13))
    _rest_of_the_steps(led, a_rest + b_rest)
    started = min(r["info"]["started_at"] for r in recs if r["kind"] == "hello")
    _against_truth(led, {"hang": killed_at - first_run[8]["t"],
                         "recovery": began - killed_at - restore - emergency,
                         "redone": sum(first_run[s]["values"]["perf/step_time"] for s in (6, 7, 8)),
                         "checkpoint_restore": restore,
                         "startup": _startup_truth(b["startup"], own_a, started),
                         "data_loading": a_data + b_data,
                         "checkpoint_save": _own_saves(*(tmp_path / f"a{r}.jsonl.saves" for r in (0, 1)))
                         + _own_saves(*(tmp_path / f"b{r}.jsonl.saves" for r in (0, 1))),
                         "eval": 0.0, "telemetry": 0.0, "excluded": 0.0})


@pytest.mark.slow
@pytest.mark.timeout(900)     # hang detectors below, generous for a loaded machine
def test_a_straggler_that_begins_mid_run_against_the_injected_truth(make_daemon, tmp_path):
    """The trainer on 2 ranks: from step 6 on, rank 1 sleeps 0.2 s at the start of forward (rank 0
    waits for it in the all-reduce). Every bucket against what was injected or what the ranks'
    own logs time: data loading the ranks' mean, start-up the first process's start -> the first
    step, nothing else lost, each within 1 % of the wall time; straggler at least the slept time
    (every slow step's, its first ones too) and at most what the steps' straggler series says the
    others waited (each step's excess exactly the two ranks' own phase times' difference: a rank
    woken from its sleep computes its forward slower than the rank that ran it meanwhile, and the
    others waited for that as well); unexplained at most 2 %, no bucket below zero."""
    steps_n, slow_from, slow_s = 16, 6, 0.2
    d = make_daemon(world_size=2, config={"pollers": {"nvml_enabled": False}}, per_rank=True)
    p = _trainer(d, tmp_path / "run", f"steps={steps_n}", "checkpoint.every_steps=0", "checkpoint.save_final=false",
                 "debug.slow_rank=1", "debug.slow_phase=forward", f"debug.slow_s={slow_s}",
                 f"debug.slow_from_step={slow_from}", f"debug_loss_log={tmp_path}/a{{rank}}.jsonl")
    try:
        out, _ = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait(30)
    assert p.returncode == 0, out[-3000:]
    d.wait_for(lambda rs: any(r.get("name") == "train_end" for r in rs) and sum(r["kind"] == "bye" for r in rs) >= 2,
               timeout_s=120)
    d.drain()
    recs = d.read_jsonl()
    led = ledger(recs)
    own = [{json.loads(line)["step"]: json.loads(line) for line in (tmp_path / f"a{r}.jsonl").read_text().splitlines()}
           for r in (0, 1)]
    started = min(r["info"]["started_at"] for r in recs if r["kind"] == "hello")
    print(f"ledger {led['buckets_s']}, wall {led['wall_s']:.3f} s")
    assert led["launches"] == 1 and led["steps"] == steps_n, led
    slow_n = steps_n - slow_from + 1
    # The straggler series, step by step: whatever it names, its excess is exactly what the two
    # ranks' own figures for that phase say (their per-rank records).
    excess = sum(e for _, _, e in _straggler_series(recs, range(1, steps_n + 1)).values())
    b, wall = led["buckets_s"], led["wall_s"]
    # At least the slept time (a sleep only overshoots), at most what the series says was waited
    # (the ledger books no more than that; what it took for the run's noise stays where it was spent).
    assert slow_s * slow_n - 0.01 * wall <= b["straggler"] <= excess + 1e-6, (b["straggler"], slow_s * slow_n,
                                                                             excess, wall, b)
    _against_truth(led, {"startup": _startup_truth(b["startup"], own, started),
                         "data_loading": sum((own[0][s]["data_loading_time"] + own[1][s]["data_loading_time"]) / 2
                                             for s in range(1, steps_n + 1)),
                         "slow_steps": 0.0, "hang": 0.0, "recovery": 0.0, "redone": 0.0, "checkpoint_save": 0.0,
                         "checkpoint_restore": 0.0, "eval": 0.0, "excluded": 0.0})


@pytest.mark.slow
@pytest.mark.timeout(900)     # hang detectors below, generous for a loaded machine
def test_planned_maintenance_marked_from_the_cli_over_the_trainers_hang(tmp_path):
    """The trainer on 2 ranks under `telemetry run`: rank 1 hangs at step 6; once the daemon says
    diagnosis/hang, `telemetry goodput --exclude` marks a window over part of the hang, then rank 1
    is SIGKILLed; rank 0 gets the collective's error and the launcher ends. Timed from outside:
    the window is excluded; the hang is the last step -> the launcher's exit (the launch's end,
    its teardown included: `telemetry run`'s drain hands the daemon the script's exit code) less
    the window and rank 0's emergency save; start-up is the first process's start -> the first
    step. Each within 1 % of the wall time, unexplained at most 2 %, no bucket below zero."""
    import signal
    import time

    import psutil

    run_dir = tmp_path / "run"
    (tmp_path / "d.yaml").write_text(json.dumps({"pollers": {"nvml_enabled": False}, "diagnosis": HANG}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="disabled", TELEMETRY_RUNTIME_DIR=str(tmp_path / "rt"))
    p = subprocess.Popen([sys.executable, "-m", "telemetry", "run", "--quiet", "--nproc", "2", "--run-dir", str(run_dir),
                          "--daemon-config", str(tmp_path / "d.yaml"), "--", "-m", "trainer.train", "--config",
                          str(ROOT / "launch/configs/tiny.yaml"), f"run_dir={run_dir}", "steps=8", "log_every=1",
                          "eval.every_steps=0", "checkpoint.every_steps=0", "checkpoint.save_final=false",
                          "debug.hang_step=6", "debug.hang_rank=1", f"debug_loss_log={tmp_path}/a{{rank}}.jsonl", *SMALL],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)

    def recs() -> list[dict]:
        try:
            return [json.loads(line) for line in (find_log_dir(run_dir) / "metrics.jsonl").read_text().splitlines()
                    if line.endswith("}")]
        except FileNotFoundError:
            return []

    try:
        deadline = time.monotonic() + 300
        while not any(r.get("name") == "diagnosis/hang" for r in recs()):
            assert p.poll() is None and time.monotonic() < deadline, p.stdout.read()[-3000:] if p.poll() else ""
            time.sleep(0.2)
        (launcher,) = [c for c in psutil.Process(p.pid).children() if any("trainer.launch" in a for a in c.cmdline())]
        launcher_gone = _watch_exit(launcher.pid)
        own = [{json.loads(line)["step"]: json.loads(line) for line in (tmp_path / f"a{r}.jsonl").read_text().splitlines()}
               for r in (0, 1)]
        last = max(own[r][5]["t"] for r in (0, 1))          # the job's last step ended (its later rank's end)
        a, b = last + 0.5, time.time()
        out = subprocess.run([sys.executable, "-m", "telemetry", "goodput", "--exclude", repr(a), repr(b)], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "excluded from goodput" in out.stdout, out
        time.sleep(1.0)
        os.kill(_pid_of(recs(), 1), signal.SIGKILL)
        out, _ = p.communicate(timeout=300)
        assert p.returncode != 0, out[-3000:]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
    ended = launcher_gone["at"]
    saves = [json.loads(line) for r in (0, 1) if (f := tmp_path / f"a{r}.jsonl.saves").exists()
             for line in f.read_text().splitlines()]
    emergency = max((row["duration_s"] for row in saves), default=0.0)
    rs = recs()
    started = min(r["info"]["started_at"] for r in rs if r["kind"] == "hello")
    led = ledger(rs)
    print(f"ledger {led['buckets_s']}, wall {led['wall_s']:.3f} s, window {b - a:.3f} s, launcher exit "
          f"{ended - last:.3f} s after the last step")
    assert led["launches"] == 1 and led["steps"] == 5, led
    _against_truth(led, {"excluded": b - a, "hang": ended - last - (b - a) - emergency, "checkpoint_save": emergency,
                         "startup": _startup_truth(led["buckets_s"]["startup"], own, started),
                         "recovery": 0.0, "redone": 0.0})


@pytest.mark.slow
@pytest.mark.timeout(900)     # hang detectors below, generous for a loaded machine
def test_a_rank_whose_dataloader_worker_was_killed(make_daemon, tmp_path):
    """Rank 1's DataLoader worker is SIGKILLed after step 6: rank 1 raises and ends (a train_end
    that says failed, its bye); rank 0 gets the collective's error or torchrun's SIGTERM and ends
    too. The launch failed (the evidence: the failed train_end, the byes after the last step):
    from the job's last progress (the last step's end, as the ranks' own logs time it, apart from
    telemetry) to the launch's end (its ranks' exits, seen from outside) is hang (less any
    emergency save: checkpoint_save), within 1 % of the wall; never more (what a process does
    after its bye, its DataLoader's and gloo's teardown, is after its last record: the wall ends
    there); every other bucket against the ranks' own logs (start-up, data loading; productive,
    straggler and slow steps together) or nothing (no eval, restore, recovery, redone work or
    exclusion in this run; the client's own time: a few ms), each within 1 % of the wall;
    unexplained at most 2 % of the wall, no bucket below zero."""
    import signal
    import time

    import psutil

    d = make_daemon(world_size=2, config={"pollers": {"nvml_enabled": False}, "diagnosis": HANG})
    run_dir = tmp_path / "run"
    first = _trainer(d, run_dir, "data.num_workers=1", "steps=400", "checkpoint.every_steps=0",
                     f"debug_loss_log={tmp_path}/a{{rank}}.jsonl")
    try:
        steps = lambda rs: {r["step"] for r in rs if r["kind"] == "metrics" and "rank" not in r}   # noqa: E731
        recs = d.wait_for(lambda rs: 6 in steps(rs), timeout_s=300)
        (worker,) = psutil.Process(_pid_of(recs, 1)).children()
        exits = [_watch_exit(_pid_of(recs, r)) for r in (0, 1)]
        killed_at = time.time()
        worker.send_signal(signal.SIGKILL)
        out, _ = first.communicate(timeout=300)
        assert first.returncode != 0 and "DataLoader worker" in out, out[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(30)
    # Each rank's end as the daemon learns it: its bye, or its process seen gone without one.
    d.wait_for(lambda rs: all(any(r.get("rank") == k and (r["kind"] == "bye" or r.get("name") == "diagnosis/rank_exited")
                                  for r in rs) for k in (0, 1)), timeout_s=120)
    ended = max(e["at"] for e in exits)      # torchrun waited for them: seen gone already
    d.drain()
    recs = d.read_jsonl()
    led = ledger(recs)
    b, wall = led["buckets_s"], led["wall_s"]
    last = max(r["step"] for r in recs if r["kind"] == "metrics" and "rank" not in r)
    own = [{json.loads(line)["step"]: json.loads(line) for line in (tmp_path / f"a{r}.jsonl").read_text().splitlines()}
           for r in (0, 1)]
    # The job's last step ended (its later rank's end; a rank that raised may have lost its log's last row).
    progress = max(own[r][last]["t"] for r in (0, 1) if last in own[r])
    saves_file = [tmp_path / f"a{r}.jsonl.saves" for r in (0, 1)]
    saves = [json.loads(line) for p in saves_file if p.exists() for line in p.read_text().splitlines()]
    # The wall ends at the ranks' last record (their byes, each stamped by its rank): what a
    # process does after it (its DataLoader's and gloo's teardown, 0.05-0.1 s here, seconds on a
    # loaded box) is after the run as any ledger of a long-lived daemon can see it. So the tail's
    # end is the later of the byes when every rank sent one, else the exits seen from outside.
    byes = [r["t"] for r in recs if r["kind"] == "bye" and r.get("rank") in (0, 1)]
    end = min(ended, max(byes)) if len(byes) == 2 else ended
    truth = end - progress
    lost = b["hang"] + b["checkpoint_save"]
    print(f"ledger {b}, wall {wall:.3f} s, lost {lost:.3f} s, truth {truth:.3f} s (kill {killed_at - progress:.3f} s "
          f"after the last step), saves {saves}")
    assert led["launches"] == 1 and b["hang"] > 0
    _sums_to_wall(led)
    _no_negative(led)
    assert truth - 0.01 * wall <= lost <= truth + 1e-3, (b, truth, wall)
    assert lost >= killed_at - progress
    # The same split by bucket: the emergency saves (the ranks' own save logs) are checkpoint_save,
    # the rest of the tail hang; and every other bucket. (The truth's end, the ranks' exits, is
    # later than the ledger's, their last bye, by their teardown after it: under 0.1 s here,
    # ~1.8 s beside a CPU hog, past 1 % of this short wall. A long-lived daemon's ledger has no
    # word of a process's exit after its bye; under `telemetry run` the script's exit ends it.)
    emergency = _own_saves(*saves_file)
    started = min(r["info"]["started_at"] for r in recs if r["kind"] == "hello")
    data, rest = _own_steps(own, range(1, last + 1))
    _rest_of_the_steps(led, rest)
    _against_truth(led, {"hang": truth - emergency, "checkpoint_save": emergency,
                         "startup": _startup_truth(b["startup"], own, started),
                         "data_loading": data, "eval": 0.0, "checkpoint_restore": 0.0, "recovery": 0.0,
                         "redone": 0.0, "telemetry": 0.0, "excluded": 0.0})


@pytest.mark.slow
@pytest.mark.timeout(900)     # hang detectors below, generous for a loaded machine
def test_a_daemon_sigkilled_and_restarted_mid_run_leaves_one_launch_and_the_injected_truth(make_daemon, tmp_path):
    """The trainer on 2 ranks, rank 1 a straggler: it waits 0.2 s more for data at every step; the
    step-10 save sleeps 1.5 s first. The daemon (with --per-rank) is SIGKILLed after step 4 and a
    new one is started on the same endpoints and log directory, as an operator would. The ranks
    never stopped: one launch, no hang, no recovery, no work redone; the steps the dead daemon
    took with it are counted as missing. Against the ranks' own figures (their loss logs, written
    apart from telemetry): every step names rank 1 slow in data loading by exactly what the two
    ranks' data times say; the job's straggler bucket holds the injected 0.2 s a step, its data
    bucket what rank 0 waited; per rank, rank 0 waited for rank 1 that long (and each rank for
    the other on the steps the series names the other), each rank's data bucket is its own, its
    save bucket its own save. The buckets sum
    to the wall time, and the new daemon's live ledger is the file's. (On the dev box: all 16
    steps reached the new daemon, the client's queue held them across the restart.)"""
    import time

    steps_n, slow_data, slow_save = 16, 0.2, 1.5
    cfg = {"pollers": {"nvml_enabled": False}}
    d = make_daemon(world_size=2, config=cfg, per_rank=True)
    run_dir = tmp_path / "run"
    p = _trainer(d, run_dir, f"steps={steps_n}", "checkpoint.every_steps=10", "checkpoint.save_final=false",
                 "debug.slow_rank=1", "debug.slow_phase=data", f"debug.slow_s={slow_data}",
                 f"debug.slow_checkpoint_s={slow_save}", f"debug_loss_log={tmp_path}/loss{{rank}}.jsonl")
    try:
        # Killed once step 4 is in the file and in the daemon's checkpoint: what a daemon writes
        # after its last checkpoint, the next one moves aside (counted lost; tested in
        # test_multinode_head_restart.py), and this test is about the ledger across the restart.
        d.wait_for(lambda rs: _checkpointed_step(d.log_dir) >= 4, timeout_s=300)
        d.kill()
        d2 = make_daemon(world_size=2, config=cfg, log_dir=d.log_dir, endpoints=(d.ingest, d.pub, d.control),
                         tmp_path=tmp_path / "second", per_rank=True)
        out, _ = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait(30)
    assert p.returncode == 0, out[-3000:]
    # Everything the ranks sent: train_end and both byes (the daemon holds a bye up to 2 s).
    d2.wait_for(lambda rs: any(r.get("name") == "train_end" for r in rs) and sum(r["kind"] == "bye" for r in rs) >= 2,
                timeout_s=120)
    recs = d2.read_jsonl()
    led = ledger(recs)
    # The new daemon's own ledger (seeded from the file the first one wrote, then fed as it
    # writes) settles on what the whole file says.
    def same(live: dict) -> bool:
        return live.get("steps") == led["steps"] and live.get("launches") == led["launches"] and \
            all(abs(live["buckets_s"][k] - v) <= 1e-3 for k, v in led["buckets_s"].items())   # status: ms

    deadline = time.monotonic() + 120
    while not same(live := d2.status()["goodput"]):
        assert time.monotonic() < deadline, (live, led)
        time.sleep(0.2)
    assert live["ranks"] == {str(r): round(rl["goodput"], 4) for r, rl in led["ranks"].items()}, live
    out = subprocess.run([sys.executable, "-m", "telemetry", "status", "--control", d2.control], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    low = min(live["ranks"], key=lambda r: live["ranks"][r])
    assert f"goodput per rank (lowest first): rank {low} {100 * live['ranks'][low]:.1f} %" in out.stdout, out
    d2.drain()
    b, wall = led["buckets_s"], led["wall_s"]
    _sums_to_wall(led)
    written = sorted(r["step"] for r in recs if r["kind"] == "metrics" and "rank" not in r)
    assert led["launches"] == 1 and led["steps"] == len(written), led
    assert led["steps_missing"] == steps_n - len(written) and written[-1] == steps_n, (written, led)
    assert b["hang"] == b["recovery"] == b["redone"] == b["checkpoint_restore"] == 0.0, b
    rows = [[json.loads(line) for line in (tmp_path / f"loss{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    own = [{row["step"]: row["data_loading_time"] for row in rows[r]} for r in (0, 1)]
    own_st = [{row["step"]: row["step_time"] for row in rows[r]} for r in (0, 1)]
    agg = {r["step"]: r["values"] for r in recs if r["kind"] == "metrics" and "rank" not in r}
    # A step written without a rank (its record went to the killed daemon): the ranks it has.
    present = {r["step"]: [k for k in (0, 1) if k not in r.get("missing_ranks", ())]
               for r in recs if r["kind"] == "metrics" and "rank" not in r}
    missing = {s for s, ks in present.items() if len(ks) < 2}
    print(f"ledger {b}, wall {wall:.3f} s, {len(written)} steps written of {steps_n}, "
          f"written without a rank: {sorted(missing)}")
    # The straggler series, step by step, against the ranks' own figures: where it names rank 1
    # in data loading (the injected delay; on a loaded box another rank's real excess elsewhere
    # may win a step, CAUSE_ORDER), the excess is exactly what the two ranks' data times say;
    # on every step, whatever it names is what the per-rank records say.
    series = _straggler_series(recs, written)
    # A step written without a rank (its record went to the killed daemon): no view to check.
    assert all(s in missing for s in written if s not in series), (series, written, missing)
    data_named = []
    for s, (named, phase, excess_s) in series.items():
        if (named, phase) == (1, "data_loading"):
            data_named.append(s)
            assert excess_s == pytest.approx(own[1][s] - own[0][s], abs=1e-9), (s, excess_s)
    viewed = [s for s in written if s not in missing]
    assert len(data_named) >= 0.75 * len(viewed), (data_named, written, missing)
    # The job: rank 1's 0.2 s a step (and what else its loader took beyond rank 0's) is straggler
    # time; the data bucket is what rank 0, the one that waited, waited for data on those steps
    # (the ranks' mean on the others; on a step written without a rank, the mean of those it has).
    # (an excess the ledger took for the run's own noise, a step named for another rank or phase
    # amid rank 1's, stays where it was spent: data loading for that phase, else productive)
    excess = sum(agg[s]["perf/straggler_excess_s"] for s in viewed)
    assert b["straggler"] <= excess + 1e-6, b
    assert b["straggler"] >= sum(slow_data - own[0][s] for s in data_named), b
    # The injected truth: on the steps it names rank 1's data loading, the injected 0.2 s a step
    # at least, within 1 % of the wall time (a sleep only overshoots: each step's excess is exactly
    # the ranks' own data times' difference, above, which holds the overshoot and the loader's
    # own time); on the others (data loading is the first cause looked for, so a step not named
    # for it is one whose largest excess beat it) no less.
    assert sum(agg[s]["perf/straggler_excess_s"] for s in data_named) >= slow_data * len(data_named) - 0.01 * wall, \
        (b, wall, data_named)
    assert b["straggler"] >= slow_data * len(viewed) - 0.01 * wall, (b, wall, viewed)
    waited = sum(own[0][s] if s in data_named else sum(own[k][s] for k in present[s]) / len(present[s])
                 for s in written)
    assert waited - 1e-6 <= b["data_loading"] <= waited + (excess - b["straggler"]) + 1e-6, (b, waited, excess)
    # The one save (step 10): the slowest rank's own figure, the injected sleep in it.
    saves = [r["data"]["duration_s"] for r in recs if r.get("name") == "checkpoint_saved"]
    # Booked on the job's timeline from the end of the step before it: a save the slowest rank
    # began while the other rank's step record was still to come is clipped by that overlap
    # (0.35 ms in a loaded fresh-clone run), never more than the issue's 1 % of the wall.
    assert len(saves) == 2 and max(saves) >= slow_save, saves
    assert max(saves) - 0.01 * wall <= b["checkpoint_save"] <= max(saves) + 1e-9, (b, saves, wall)
    # Each rank's own ledger (the daemons' --per-rank records): its data loading is its own
    # figure step by step, its straggler time what it waited for the other (the steps where the
    # other was the straggler), its save its own; one launch; its buckets sum to its wall time.
    for rank in (0, 1):
        rl = led["ranks"][rank]
        rb = rl["buckets_s"]
        mine = sorted(r["step"] for r in recs if r["kind"] == "metrics" and r.get("rank") == rank and r["step"] in agg)
        assert rl["launches"] == 1 and rl["steps"] == len(mine) > 0, (rank, rl, mine)
        assert rb["data_loading"] == pytest.approx(sum(own[rank][s] for s in mine), abs=1e-6), (rank, rb)
        # What it waited: the excess, but no more than its own step time less its own data
        # loading (its loss log's figures; a rank descheduled between steps on a busy host
        # begins the next one late and waits that much less).
        waited = sum(min(own_st[rank][s] - own[rank][s], agg[s].get("perf/straggler_excess_s", 0.0)) for s in mine
                     if agg[s].get("perf/straggler_rank") not in (None, rank))
        assert rb["straggler"] == pytest.approx(waited, abs=1e-9), (rank, rb, waited)
        own_save = [r["data"]["duration_s"] for r in recs if r.get("name") == "checkpoint_saved" and r["rank"] == rank]
        assert rb["checkpoint_save"] == pytest.approx(own_save[0], abs=1e-9)
        assert sum(rb.values()) == pytest.approx(rl["wall_s"], abs=1e-6)
        assert rb["hang"] == rb["recovery"] == rb["redone"] == 0.0, (rank, rb)
    # Rank 0 waited for rank 1's data on every step the series names it for that: the whole
    # excess, within 1 % of the wall time (less only where it began a step late).
    assert led["ranks"][0]["buckets_s"]["straggler"] >= \
        sum(agg[s]["perf/straggler_excess_s"] for s in data_named) - 0.01 * wall, (led["ranks"][0], wall)
    assert led["ranks"][1]["buckets_s"]["data_loading"] >= slow_data * led["ranks"][1]["steps"]


# ---- the ledger kept as records go by (telemetry/shared/goodput.py: Ledger) -------------------
def _job(seed: int) -> list[dict]:
    """Three launches of 2 ranks with random step times, data waits and stragglers; saves whose
    events come before or after their step's aggregated record (the daemon writes a step once
    every rank has it, events at once); each failed launch resumed from its last save."""
    import random

    rng = random.Random(seed)
    recs, t, step = [], T0, 0
    for launch in range(3):
        recs += [_hello(t + 1, 0, t), _hello(t + 1, 1, t + 0.1)]
        t += 3.0
        if launch:
            recs.append(_event(t, "checkpoint_restored", 0, step=step, duration_s=0.7))
            t += 0.7
        last_save = step
        for _ in range(rng.randint(30, 60)):
            step += 1
            st = rng.uniform(0.5, 1.5)
            t += st
            extra = {"perf/eval_time": 1.0} if step % 17 == 0 else {}
            if rng.random() < 0.2:
                extra.update({"perf/straggler_excess_s": rng.uniform(0, 0.3), "perf/straggler_median_s": 0.1,
                              "perf/straggler_phase_index": float(rng.choice([0, 1, 3]))})
            rec = _step(t, step, st, data=rng.uniform(0, 0.2), **extra)
            if step % 10 == 0:
                save = [_event(t + 0.2, "checkpoint_saved", r, step=step, duration_s=0.2 + r * 0.1) for r in (0, 1)]
                recs += save + [rec] if rng.random() < 0.5 else [rec] + save
                t += 0.3
                last_save = step
            else:
                recs.append(rec)
        if launch < 2:                        # it hangs, is killed; the next resumes from its last save
            recs.append(_event(t + 20, "diagnosis/rank_exited", 1, gone_for_s=2.0))
            t += 25
            step = last_save
        else:
            recs.append(_event(t + 0.5, "train_end", 0, step=step))
    return recs


@pytest.mark.parametrize("seed", range(5))
def test_the_ledger_kept_as_records_go_by_is_the_same_with_a_short_memory(seed, monkeypatch):
    import telemetry.shared.goodput as gp

    recs = _job(seed)
    whole = ledger(recs)
    assert whole["launches"] == 3 and whole["buckets_s"]["redone"] > 0 and whole["buckets_s"]["hang"] > 0
    _sums_to_wall(whole)
    monkeypatch.setattr(gp, "RECENT", 3)        # the steps after a save come from its running sums
    short = ledger(recs)
    assert "redone_estimated" not in short
    assert short["buckets_s"] == pytest.approx(whole["buckets_s"], abs=1e-9)
    # Live: the ledger after any prefix is the ledger of that prefix.
    live = gp.Ledger()
    for i, r in enumerate(recs):
        live.feed(r)
        if i % 37 == 0:
            assert live.result()["buckets_s"] == pytest.approx(ledger(recs[:i + 1])["buckets_s"], abs=1e-9)


def test_a_restore_from_a_checkpoint_it_never_saw_saved_is_charged_from_the_save_before():
    import telemetry.shared.goodput as gp

    recs = [_hello(T0 + 1, 0, T0)] + [_step(T0 + 2 + s, s, 1.0) for s in range(1, 101)]
    recs.insert(41, _event(T0 + 42, "checkpoint_saved", 0, step=40, duration_s=0.0))   # as step 40 ended
    t = T0 + 150
    recs += [_hello(t + 1, 0, t), _event(t + 2, "checkpoint_restored", 0, step=70, duration_s=0.0)]
    recs += [_step(t + 3 + s, 71 + s, 1.0) for s in range(5)]
    exact = ledger(recs)
    assert exact["buckets_s"]["redone"] == pytest.approx(30.0) and "redone_estimated" not in exact
    old = gp.RECENT
    try:
        gp.RECENT = 10                  # step 70 is no longer among the steps kept one by one
        short = gp.Ledger().feed_all(recs).result()
    finally:
        gp.RECENT = old
    assert short["redone_estimated"] is True
    assert short["buckets_s"]["redone"] == pytest.approx(60.0)     # from the save at step 40
    _sums_to_wall(short)


def test_the_daemon_keeps_the_ledger_live_and_a_restarted_daemon_continues_it(make_daemon, tmp_path):
    """Steps sent by a real client: `telemetry status` and the daemon records carry the ledger
    so far; a daemon restarted on the same log directory reads it back and goes on."""
    import time

    from telemetry import TelemetryClient

    log_dir = tmp_path / "telemetry"
    d = make_daemon(world_size=1, log_dir=log_dir, config={"daemon_record_interval_s": 0.5})
    tm = TelemetryClient(d.ingest, rank=0)
    for s in range(1, 11):
        tm.log(s, {"perf/step_time": 0.05, "perf/data_loading_time": 0.01, "train/loss": 1.0})
        time.sleep(0.05)
    tm.close()
    d.wait_for(lambda rs: sum(r["kind"] == "metrics" for r in rs) >= 10)

    def settled(status: dict) -> bool:
        return status["goodput"].get("steps") == 10

    deadline = time.monotonic() + 60
    while not settled(st := d.status()) and time.monotonic() < deadline:
        time.sleep(0.2)
    g = st["goodput"]
    assert g["steps"] == 10 and g["launches"] == 1, g
    assert g["buckets_s"]["productive"] == pytest.approx(10 * 0.04, abs=1e-3)
    assert g["buckets_s"]["data_loading"] == pytest.approx(10 * 0.01, abs=1e-3)
    assert 0 < g["goodput"] < 1 and sum(g["buckets_s"].values()) == pytest.approx(g["wall_s"], abs=0.01)
    recs = d.wait_for(lambda rs: any("goodput/fraction" in r.get("values", {}) for r in rs if r["kind"] == "daemon"))
    last = [r for r in recs if r["kind"] == "daemon" and "goodput/fraction" in r["values"]][-1]["values"]
    assert last["goodput/productive_s"] > 0 and last["goodput/wall_s"] >= last["goodput/productive_s"]
    out = subprocess.run([sys.executable, "-m", "telemetry", "status", "--control", d.control], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "goodput " in out.stdout and "10 steps, 1 launch(es)" in out.stdout, out
    # Killed once step 10 is in the daemon's checkpoint: the lines a SIGKILLed daemon wrote after
    # its last checkpoint are moved aside and counted lost by its successor (continuity.py), and
    # on a loaded box the kill came before that checkpoint (step 10 then missing: a chain run).
    d.wait_for(lambda rs: _checkpointed_step(log_dir) >= 10, timeout_s=120)
    d.kill()                                      # SIGKILL: nothing of it is drained
    d2 = make_daemon(world_size=1, log_dir=log_dir, tmp_path=tmp_path / "second")
    tm2 = TelemetryClient(d2.ingest, rank=0)
    for s in range(11, 16):
        tm2.log(s, {"perf/step_time": 0.05, "perf/data_loading_time": 0.01, "train/loss": 1.0})
        time.sleep(0.05)        # the step time it says (a step takes no less on the job's timeline)
    tm2.close()
    deadline = time.monotonic() + 60
    while (st := d2.status())["goodput"].get("steps") != 15 and time.monotonic() < deadline:
        time.sleep(0.2)
    g2 = st["goodput"]
    assert g2["steps"] == 15 and g2["records_seeded"] > 0, g2
    assert g2["buckets_s"]["productive"] == pytest.approx(15 * 0.04, abs=1e-3)
    # What the offline ledger of the same file says, once the second daemon has written it all.
    d2.drain()
    off = ledger(d2.read_jsonl())
    assert off["steps"] == 15 and off["buckets_s"]["productive"] == pytest.approx(g2["buckets_s"]["productive"], abs=1e-3)


def test_telemetrys_own_time_is_taken_out_of_productive():
    # The client's cumulative time in its calls (telemetry/client_s, the slowest rank's), per
    # launch its largest: 0.3 s of the 10 s of steps.
    recs = [_hello(T0 + 1, 0, T0)]
    for s in range(1, 11):
        own = {"telemetry/client_s": 0.03 * s} if s % 3 == 0 else {}
        recs.append(_step(T0 + 2 + s, s, 1.0, **own))
    recs.append(_step(T0 + 13, 11, 1.0, **{"telemetry/client_s": 0.3}))
    led = ledger(recs)
    assert led["buckets_s"]["telemetry"] == pytest.approx(0.3)
    assert led["buckets_s"]["productive"] == pytest.approx(11 * 1.0 - 0.3)
    _sums_to_wall(led)


def test_the_client_sends_the_time_it_spent_in_its_calls(make_daemon, monkeypatch):
    """Every record carries it here (the client times each log() call and adds the total at most
    once a second): it grows, and it is no more than the time the calls took as the caller
    measured them."""
    import time

    import telemetry.client.core as core
    from telemetry import TelemetryClient

    monkeypatch.setattr(core, "OWN_TIME_EVERY_NS", 0)
    d = make_daemon(world_size=1)
    tm = TelemetryClient(d.ingest, rank=0)
    spent = 0.0
    for s in range(1, 51):
        t0 = time.perf_counter()
        tm.log(s, {"perf/step_time": 0.01, "train/loss": 1.0})
        spent += time.perf_counter() - t0
    tm.close()
    recs = d.wait_for(lambda rs: sum(r["kind"] == "metrics" for r in rs) >= 50)
    own = [r["values"]["telemetry/client_s"] for r in recs if r["kind"] == "metrics"]
    assert len(own) == 50 and own[0] == 0.0 and own == sorted(own) and 0 < own[-1] <= spent, (own[-3:], spent)


def test_a_restarted_daemons_stage_reads_only_what_the_ledger_needs_from_the_files(tmp_path):
    """What metrics.jsonl (and its rotated pieces) held when the daemon started: hellos, steps,
    events and byes are fed; GPU, host and daemon records are told by their first bytes and
    skipped; a line that is no record is counted; what is written after the start is not read
    (it comes through the stage live)."""
    from telemetry.daemon.goodput_stage import GoodputStage

    def line(rec: dict) -> str:         # as the daemon writes them: compact
        return json.dumps(rec, separators=(",", ":"))

    lines = [line(_hello(T0 + 1, 0, T0)), line(_step(T0 + 2, 1, 1.0)),
             line({"kind": "gpu", "t": T0 + 2, "host": "h", "gpu": 0, "values": {"gpu/util_percent": 1.0}}),
             "{not json", line({"kind": "daemon", "t": T0 + 2, "values": {"goodput/fraction": 0.5}})]
    (tmp_path / "metrics.jsonl.1").write_text("\n".join(lines) + "\n")
    (tmp_path / "metrics.jsonl").write_text(line(_step(T0 + 3, 2, 1.0)) + "\n")
    stage = GoodputStage(tmp_path, "metrics.jsonl")
    with open(tmp_path / "metrics.jsonl", "a") as f:      # this daemon's own first line
        f.write(line(_step(T0 + 4, 3, 1.0)) + "\n")
    stage.start()
    st = stage.stats()
    assert st["records_seeded"] == 3 and st["seed_lines_bad"] == 1 and st["steps"] == 2, st
    assert st["buckets_s"]["productive"] == pytest.approx(2.0)


def test_each_ranks_ledger_without_per_rank_records_and_across_a_daemon_sigkill(make_daemon, tmp_path):
    """A daemon that does not write per-rank records (no --per-rank, the default) still keeps a
    ledger per rank, from each rank's own records: its own data loading, step by step. It keeps
    them in goodput_ranks.json (what `telemetry goodput` shows of them); a daemon SIGKILLed and
    restarted on the run continues each from there, the steps it never wrote unexplained."""
    import time

    from telemetry import TelemetryClient
    from telemetry.shared.goodput import RANKS_FILE

    log_dir = tmp_path / "telemetry"
    own = {0: {"perf/step_time": 0.05, "perf/data_loading_time": 0.02, "train/loss": 1.0},
           1: {"perf/step_time": 0.05, "perf/data_loading_time": 0.005, "train/loss": 1.0}}

    def train(clients, first: int, last: int) -> None:
        for s in range(first, last + 1):
            for r, tm in enumerate(clients):
                tm.log(s, own[r])
            time.sleep(0.06)                       # each step at least its step time

    def ranks_file(pred) -> dict:
        deadline, doc = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            try:
                doc = json.loads((log_dir / RANKS_FILE).read_text())
                if pred(doc["ranks"]):
                    return doc["ranks"]
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"{RANKS_FILE} never held what was asked: {doc}, status {d.status()['goodput']}")

    d = make_daemon(world_size=2, log_dir=log_dir)
    clients = [TelemetryClient(d.ingest, rank=r) for r in (0, 1)]
    train(clients, 1, 10)
    # Written while the run goes on (every RANKS_WRITE_S), not only at the end.
    first = ranks_file(lambda rs: len(rs) == 2 and all(v["steps"] == 10 for v in rs.values()))
    for r in (0, 1):
        b = first[str(r)]["buckets_s"]
        assert b["data_loading"] == pytest.approx(10 * own[r]["perf/data_loading_time"], abs=1e-9), (r, b)
        assert "since" not in first[str(r)] and first[str(r)]["launches"] == 1
    assert set(d.status()["goodput"]["ranks"]) == {"0", "1"}
    d.wait_for(lambda rs: _checkpointed_step(log_dir) >= 10, timeout_s=120)   # as in the test above
    d.kill()                                       # SIGKILL: nothing drained
    recs = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in recs if r["kind"] == "metrics" and "rank" in r], "per-rank records were written"
    killed_at = time.time()
    time.sleep(1.0)
    d2 = make_daemon(world_size=2, log_dir=log_dir, tmp_path=tmp_path / "second")
    for tm in clients:                             # the same processes go on: one launch
        tm.close()
    clients = [TelemetryClient(d2.ingest, rank=r) for r in (0, 1)]
    train(clients, 11, 16)
    for tm in clients:
        tm.close()
    d2.wait_for(lambda rs: any(r["kind"] == "metrics" and r.get("step") == 16 for r in rs))
    d2.drain()
    ranks = json.loads((log_dir / RANKS_FILE).read_text())["ranks"]
    out = subprocess.run([sys.executable, "-m", "telemetry", "goodput", str(log_dir), "--json", str(tmp_path / "g.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    led = json.loads((tmp_path / "g.json").read_text())
    assert led["steps"] == 16 and led["ranks_from"] == RANKS_FILE, led
    assert "rank 0" in out.stdout and "rank 1" in out.stdout
    for r in (0, 1):
        rl = ranks[str(r)]
        assert rl == led["ranks"][str(r)], (rl, led["ranks"])      # what `telemetry goodput` shows
        b = rl["buckets_s"]
        assert rl["steps"] == 16, (r, rl)
        assert b["data_loading"] == pytest.approx(16 * own[r]["perf/data_loading_time"], abs=1e-9), (r, b)
        assert sum(b.values()) == pytest.approx(rl["wall_s"], abs=1e-6)
        # The daemon was down from the kill to its successor's first step of the rank: unexplained.
        assert b["unexplained"] >= 1.0 and rl["until"] > killed_at, (r, rl)
        assert rl["launches"] == 1 and "since" not in rl, (r, rl)     # the same processes, from their start
        # Its wall: its process start to its last record, the job's but for the ranks' skew.
        assert rl["wall_s"] == pytest.approx(led["wall_s"], abs=0.5), (r, rl, led["wall_s"])


def test_per_rank_ledgers_that_begin_mid_run_say_since_when_and_join_what_came_before():
    """RankBooks after a daemon restart on a run whose per-rank records are on no file: a rank
    whose process ran before begins with its first step from now (`since`), a process started
    after the restart from its own start; with the ledgers a daemon before left (prior), each
    goes on from there and the time between is unexplained, exactly."""
    from telemetry.shared.goodput import Ledger

    restart = T0 + 100.0

    def feed(led: Ledger, steps: range, t0: float) -> float:
        t = t0
        for s in steps:
            t += 1.0
            for r in (0, 1):
                led.feed({"kind": "metrics", "t": t, "step": s, "rank": r,
                          "values": {"perf/step_time": 1.0, "perf/data_loading_time": 0.1 * (r + 1)}})
            led.feed(_step(t, s, 1.0, data=0.15))
        return t

    led = Ledger()
    led.feed(_hello(T0 + 1, 0, T0))                # a hello from before the restart: of the old process
    led.ranks.begin_partial(restart)
    led.feed(_hello(restart + 2, 1, restart + 1))  # rank 1's process started after it
    end = feed(led, range(50, 55), restart + 5)
    ranks = led.result()["ranks"]
    assert ranks[0]["since"] == restart + 6 - 1.0 and ranks[0]["steps"] == 5 and ranks[0]["launches"] == 1
    assert ranks[0]["wall_s"] == pytest.approx(end - (restart + 5)) and ranks[0]["buckets_s"]["startup"] == 0.0
    assert ranks[1]["since"] == restart + 1 and ranks[1]["buckets_s"]["startup"] == pytest.approx(4.0)
    assert ranks[0]["buckets_s"]["data_loading"] == pytest.approx(5 * 0.1)

    # With the ledgers the daemon before left: rank 0 continues its launch, rank 1 is a new one.
    prior_b = {k: 0.0 for k in BUCKETS}
    prior_b.update(productive=40.0, data_loading=5.0, startup=5.0)
    prior = {r: {"goodput": 0.8, "wall_s": 50.0, "steps": 45, "launches": 1, "until": T0 + 50.0,
                 "buckets_s": dict(prior_b)} for r in (0, 1)}
    led = Ledger()
    led.ranks.prior = prior
    led.ranks.begin_partial(restart)
    led.feed(_hello(restart + 2, 1, restart + 1))
    end = feed(led, range(50, 55), restart + 5)
    ranks = led.result()["ranks"]
    r0, r1 = ranks[0], ranks[1]
    assert "since" not in r0 and r0["launches"] == 1 and r0["steps"] == 50 and r0["until"] == end
    # From the prior's end to its first step's start (restart + 5): unexplained.
    assert r0["buckets_s"]["unexplained"] == pytest.approx((restart + 5) - (T0 + 50.0))
    assert r0["wall_s"] == pytest.approx(end - T0) and r0["buckets_s"]["data_loading"] == pytest.approx(5.0 + 0.5)
    # Rank 1's new launch: from the prior's end to its first step's start is its restart's,
    # recovery, as the job's ledger names it.
    assert r1["launches"] == 2 and r1["buckets_s"]["unexplained"] == 0.0
    assert r1["buckets_s"]["recovery"] == pytest.approx((restart + 5) - (T0 + 50.0))
    assert r1["buckets_s"]["startup"] == pytest.approx(5.0)
    for rl in (r0, r1):
        assert sum(rl["buckets_s"].values()) == pytest.approx(rl["wall_s"], abs=1e-9)
        assert rl["goodput"] == pytest.approx(rl["buckets_s"]["productive"] / rl["wall_s"])


def test_per_rank_ledgers_the_daemon_kept_are_read_back_with_what_they_could_not_count(tmp_path):
    """goodput_ranks.json as the stage writes it: `telemetry goodput` (with_ranks_file) shows its
    ledgers where the files hold no per-rank records, and says when they are incomplete; a file
    that is not one is said, not a traceback."""
    from telemetry.shared.goodput import RANKS_FILE, ranks_file_data, with_ranks_file

    b = {k: 0.0 for k in BUCKETS}
    b.update(productive=8.0, data_loading=2.0)
    ranks = {0: {"goodput": 0.8, "wall_s": 10.0, "steps": 10, "launches": 1, "until": T0 + 10, "buckets_s": b}}
    (tmp_path / RANKS_FILE).write_bytes(ranks_file_data(ranks, T0 + 11, {"rank_records_dropped": 120}))
    led = ledger([_hello(T0, 0, T0)] + [_step(T0 + s, s, 1.0) for s in range(1, 11)])
    assert "ranks" not in led
    full = with_ranks_file(led, tmp_path)
    assert full["ranks"] == {0: {**ranks[0], "goodput": pytest.approx(0.8)}} and full["ranks_from"] == RANKS_FILE
    assert full["rank_records_dropped"] == 120
    assert "incomplete: rank_records_dropped 120" in text(full) and "rank 0" in text(full)
    (tmp_path / RANKS_FILE).write_text('{"t": 1, "ranks": {"0": {"wall_s": "x"}}}')
    bad = with_ranks_file(led, tmp_path)
    assert "ranks" not in bad and "not a per-rank ledger file" in bad["ranks_file_problem"]
    # A FIFO there (someone's trap on a shared run dir) is refused, not read (a read would wait forever).
    import os

    (tmp_path / RANKS_FILE).unlink()
    os.mkfifo(tmp_path / RANKS_FILE)
    fifo = with_ranks_file(led, tmp_path)
    assert "ranks" not in fifo and RANKS_FILE in fifo["ranks_file_problem"], fifo


def _hang_and_resume_with_client_time() -> tuple[list[dict], int]:
    """The hang, kill and resume above, each step's record with the client's cumulative time in
    its calls; and the index of rank 1's kill's first record (launch 1 is over, not yet seen so)."""
    recs = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)]
    t = T0 + 5
    for step in range(1, 9):
        recs.append(_step(t, step, 1.0, **{"telemetry/client_s": 0.01 * step}))
        if step == 4:
            t += 0.5
            recs.append(_event(t, "checkpoint_saved", 0, step=4, duration_s=0.5))
        t += 1.0
    last = t - 1.0
    recs.append(_event(last + 20.0, "diagnosis/hang", 0, stalled_s=20.0))
    killed_at = len(recs)
    killed = last + 24.0
    recs.append(_bye(killed + 0.3, 0))
    recs.append(_event(killed + 3.0, "diagnosis/rank_exited", 1, exit_code=-9, gone_for_s=3.0))
    restarted = killed + 5.0
    recs += [_hello(restarted + 2, 0, restarted), _hello(restarted + 2, 1, restarted)]
    recs.append(_event(restarted + 3, "checkpoint_restored", 0, step=4, duration_s=1.0))
    t = restarted + 4.0
    for step in range(5, 11):
        recs.append(_step(t, step, 1.0, **{"telemetry/client_s": 0.01 * (step - 4)}))
        if step == 8:
            t += 0.5
            recs.append(_event(t, "checkpoint_saved", 0, step=8, duration_s=0.5))
        t += 1.0
    recs += [_event(t, "train_end", 0, step=10), _bye(t + 0.1, 0), _bye(t + 0.1, 1)]
    return recs, killed_at


def _settled_run(recs: list[dict]):
    """Each record fed to a live goodput stage: the daemon record's goodput values after each
    (its gauges and its counters), then the drain's (the stage closed)."""
    from telemetry.daemon.goodput_stage import GoodputStage, daemon_values

    stage = GoodputStage()
    seen = []
    for rec in recs:
        stage.ledger.feed(rec)
        seen.append({**daemon_values(stage.result()), **stage.settled_values()})
    stage.close()
    seen.append({**daemon_values(stage.result()), **stage.settled_values()})
    return stage, seen


def test_the_settled_ledger_never_goes_down_and_ends_as_the_ledger():
    """The counters (goodput/settled/*) never decrease though the ledger's live figures do (a
    live launch's hang or unexplained shrink when the next step comes, its steps after its last
    save become work redone); at the drain they are the ledger's buckets."""
    recs, killed_at = _hang_and_resume_with_client_time()
    stage, seen = _settled_run(recs)
    names = [f"goodput/settled/{k}_s" for k in BUCKETS] + ["goodput/settled/wall_s"]
    went_down = set()
    for before, after in zip(seen, seen[1:]):
        for k in BUCKETS:
            if f"goodput/{k}_s" in before and after.get(f"goodput/{k}_s", 0.0) < before[f"goodput/{k}_s"] - 1e-9:
                went_down.add(k)
        for name in names:
            assert after.get(name, 0.0) >= before.get(name, 0.0), (name, before, after)
    assert {"productive", "unexplained"} <= went_down     # as gauges they could not be summed as counters
    led = ledger(recs)
    _sums_to_wall(led)
    final = seen[-1]
    for k in BUCKETS:
        assert final[f"goodput/settled/{k}_s"] == pytest.approx(led["buckets_s"][k], abs=1e-5), k
    assert final["goodput/settled/wall_s"] == pytest.approx(led["wall_s"], abs=1e-5)
    assert "settled_ahead_s" not in stage.stats()
    # While launch 1 hung: its steps up to its save (4 of them, less their client time) settled,
    # its steps after it (redone once the next launch restored step 4) and its hang not yet.
    hung = seen[killed_at - 1]
    assert hung["goodput/settled/productive_s"] == pytest.approx(4.0 - 0.04)
    assert hung["goodput/settled/hang_s"] == 0.0 and hung["goodput/settled/redone_s"] == 0.0
    assert hung["goodput/settled/wall_s"] == pytest.approx(4.0 + 4.0 + 0.5)     # start-up, 4 steps, the save
    assert hung["goodput/productive_s"] == pytest.approx(8.0 - 0.08)            # the gauge: all 8 steps
    # The client time in the steps redone is theirs (in redone), not telemetry's.
    assert led["buckets_s"]["telemetry"] == pytest.approx(0.04 + 0.06)
    assert led["buckets_s"]["redone"] == pytest.approx(4.0)


def test_a_launch_that_resumed_from_an_older_checkpoint_holds_the_counters_and_says_by_how_much():
    # Launch 1 saves at steps 2 and 4 and fails; launch 2 restores step 2: steps 3 and 4, settled
    # as productive, are redone, and launch 2 does less than that before it ends. The counter holds; the stage's stats say what it showed ahead.
    recs = [_hello(T0 + 1, 0, T0)]
    steps, last = _steps(T0 + 2, 1, 6)
    recs += steps[:2] + [_event(T0 + 3.2, "checkpoint_saved", 0, step=2, duration_s=0.1)] + steps[2:4] + \
        [_event(T0 + 5.2, "checkpoint_saved", 0, step=4, duration_s=0.1)] + steps[4:]
    recs += [_hello(last + 5, 0, last + 4), _event(last + 6, "checkpoint_restored", 0, step=2, duration_s=0.5)]
    more, end = _steps(last + 7, 3, 3)          # one step, and it finished
    recs += more + [_event(end, "train_end", 0, step=3), _bye(end, 0)]
    stage, seen = _settled_run(recs)
    led = ledger(recs)
    assert led["buckets_s"]["redone"] > 3.0          # steps 3..6 (less the saves' time within them)
    final = seen[-1]
    assert final["goodput/settled/productive_s"] > led["buckets_s"]["productive"]
    assert stage.stats()["settled_ahead_s"] == pytest.approx(
        final["goodput/settled/productive_s"] - led["buckets_s"]["productive"], abs=1e-3)
    for before, after in zip(seen, seen[1:]):
        assert all(after.get(k, 0.0) >= v for k, v in before.items() if k.startswith("goodput/settled/"))


def test_the_settled_ledger_goes_out_as_prometheus_and_otlp_counters_in_seconds():
    """Through the exporters themselves: Prometheus counters in seconds (_seconds_total) and
    OTLP monotonic cumulative sums in s, never lower from one daemon record to the next, their
    last values the ledger's buckets."""
    from prometheus_client import CollectorRegistry, generate_latest

    from telemetry.consumers.prometheus import Collector, LatestValues
    from telemetry.daemon.sinks.base import Out
    from telemetry.daemon.sinks.otlp import OtlpSink
    from test_sinks_otlp import Receiver

    recs, _ = _hang_and_resume_with_client_time()
    _, seen = _settled_run(recs)
    led = ledger(recs)
    latest = LatestValues()
    receiver = Receiver()
    sink = OtlpSink(endpoint=receiver.url, run_name="r", export_interval_s=3600.0)
    sink.start()
    prom_before, otel_before = {}, {}
    try:
        for i, values in enumerate(seen):
            rec = {"kind": "daemon", "t": T0 + i, "run": "r", "values": values}
            latest.consume("daemon", rec)
            registry = CollectorRegistry(auto_describe=False)
            registry.register(Collector(latest))
            text = generate_latest(registry).decode()
            prom = {m[1]: float(m[2]) for m in re.finditer(
                r"^telemetry_goodput_settled_(\w+)_seconds_total\{run=\"r\"\} (\S+)$", text, re.M)}
            if "goodput/settled/productive_s" in values:
                assert re.search(r"^# TYPE telemetry_goodput_settled_productive_seconds(_total)? counter$", text, re.M)
            assert all(prom[k] >= v for k, v in prom_before.items()), (prom_before, prom)
            prom_before = prom
            sink.consume([Out("daemon", rec, b"")])
            if i % 8 == 0 or i == len(seen) - 1:
                n = len(receiver.requests)
                sink._provider.force_flush()
                got = {name.removeprefix("goodput.settled."): m for name, m in receiver.latest(n).items()
                       if name.startswith("goodput.settled.")}
                for m in got.values():
                    assert m["kind"] == "sum" and m["monotonic"] and m["unit"] == "s"
                    assert m["temporality"] == 2          # cumulative
                otel = {k: next(iter(m["points"].values())) for k, m in got.items()}
                assert all(otel[k] >= v for k, v in otel_before.items()), (otel_before, otel)
                otel_before = otel
    finally:
        sink.close()
        receiver.close()
    for k in BUCKETS:
        assert prom_before[k] == pytest.approx(led["buckets_s"][k], abs=1e-5), k
        assert otel_before[k] == pytest.approx(led["buckets_s"][k], abs=1e-5), k
    assert prom_before["wall"] == pytest.approx(led["wall_s"], abs=1e-5)


def test_a_real_daemons_records_carry_the_settled_counters_and_its_last_is_the_ledger(make_daemon, tmp_path):
    """A real daemon and client: steps, a save, more steps, a pause, the end. In the daemon's own
    records on file, goodput/settled/* never go down, and the drain's last record has the ledger
    of the same file, bucket by bucket."""
    import time

    from telemetry import TelemetryClient

    d = make_daemon(world_size=1, log_dir=tmp_path / "telemetry", config={"daemon_record_interval_s": 0.1})
    tm = TelemetryClient(d.ingest, rank=0)
    for s in range(1, 13):
        tm.log(s, {"perf/step_time": 0.05, "train/loss": 1.0})
        time.sleep(0.05)
        if s == 6:
            time.sleep(0.1)
            tm.event("checkpoint_saved", {"step": 6, "duration_s": 0.1})
        if s == 9:
            time.sleep(0.5)         # daemon records while the launch is silent
    tm.event("train_end", {"step": 12})
    tm.close()
    d.wait_for(lambda rs: sum(r["kind"] == "metrics" for r in rs) >= 12)
    d.drain()
    recs = d.read_jsonl()
    daemon = [r["values"] for r in recs if r["kind"] == "daemon" and "goodput/settled/wall_s" in r["values"]]
    assert len(daemon) >= 2
    for before, after in zip(daemon, daemon[1:]):
        for k, v in before.items():
            if k.startswith("goodput/settled/"):
                assert after[k] >= v, (k, before, after)
    led = ledger(recs)
    assert led["steps"] == 12
    for k in BUCKETS:
        assert daemon[-1][f"goodput/settled/{k}_s"] == pytest.approx(led["buckets_s"][k], abs=1e-5), k
    assert daemon[-1]["goodput/settled/wall_s"] == pytest.approx(led["wall_s"], abs=1e-5)


def test_planned_maintenance_the_jobs_client_marks_is_excluded_from_the_gap_it_covers():
    """Launch 1 stops cleanly for maintenance (rank 0 says goodput/exclude_begin before its last
    save), the machine is down, launch 2 says goodput/exclude_end during its start-up: the part
    of the window in the time between the launches is `excluded`, not recovery, and goodput is
    productive over the wall less it."""
    recs = [_hello(T0 + 1, 0, T0)]
    steps, last = _steps(T0 + 5, 1, 5)
    recs += steps + [_event(last + 0.1, "goodput/exclude_begin", 0, reason="kernel upgrade"),
                     _event(last + 0.6, "checkpoint_saved", 0, step=5, duration_s=0.5),
                     _event(last + 0.7, "train_end", 0, step=5), _bye(last + 1.0, 0)]
    restarted = last + 60.0
    recs += [_hello(restarted + 2, 0, restarted),
             _event(restarted + 3, "checkpoint_restored", 0, step=5, duration_s=1.0),
             _event(last + 80.0, "goodput/exclude_end", 0)]
    more, end = _steps(restarted + 26.0, 6, 8)           # its first step began at restarted + 25
    recs += more + [_event(end, "train_end", 0, step=8), _bye(end, 0)]
    led = ledger(recs)
    b = led["buckets_s"]
    _sums_to_wall(led)
    _no_negative(led)
    gap = (restarted + 25.0) - (last + 1.0) - 1.0        # the first launch's end -> the first step, less the restore
    assert b["excluded"] == pytest.approx((last + 80.0) - (last + 1.0))
    assert b["recovery"] == pytest.approx(gap - b["excluded"])
    assert b["productive"] == pytest.approx(8.0)
    assert led["goodput"] == pytest.approx(8.0 / (led["wall_s"] - b["excluded"]))
    out = text(led)
    assert "79.0 s excluded" in out and "(planned maintenance)" in out and "biggest loss: excluded" not in out


def test_a_window_given_whole_after_the_fact_is_taken_from_the_hang_and_the_recovery():
    """The `goodput/exclude` event (start, end: what `telemetry goodput-exclude` has the daemon
    write, late, with no rank): the part of the window in the hang and in the recovery is
    excluded; it keeps no launch alive (the wall is unchanged). A window still open (a begin
    without an end) runs to the end."""
    recs = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)]
    steps, last = _steps(T0 + 5, 1, 8)
    recs += steps[:4] + [_event(last - 4, "checkpoint_saved", 0, step=4, duration_s=0.0)] + steps[4:]
    killed = last + 24.0
    recs.append(_event(killed + 3.0, "diagnosis/rank_exited", 1, exit_code=-9, gone_for_s=3.0))
    restarted = killed + 10.0
    recs += [_hello(restarted + 2, 0, restarted), _hello(restarted + 2, 1, restarted)]
    recs.append(_event(restarted + 3, "checkpoint_restored", 0, step=4, duration_s=1.0))
    more, end = _steps(restarted + 4.0, 5, 10)
    recs += more + [_event(end + 0.1, "train_end", 0, step=10), _bye(end + 0.2, 0), _bye(end + 0.2, 1)]
    before = ledger(recs)
    window = {"kind": "event", "t": end + 500.0, "rank": None, "name": "goodput/exclude",
              "data": {"start": last + 20.0, "end": killed + 4.0, "reason": "planned"}}
    led = ledger(recs + [window])
    b, b0 = led["buckets_s"], before["buckets_s"]
    _sums_to_wall(led)
    _no_negative(led)
    assert led["wall_s"] == pytest.approx(before["wall_s"])
    assert b["excluded"] == pytest.approx((killed - (last + 20.0)) + 4.0)
    assert b["hang"] == pytest.approx(b0["hang"] - (killed - (last + 20.0)))
    assert b["recovery"] == pytest.approx(b0["recovery"] - 4.0)
    assert led["goodput"] > before["goodput"]
    # A begin never closed: to the end of the wall (here all of the recovery after it).
    opened = _event(killed + 1.0, "goodput/exclude_begin", 0)
    led = ledger(recs[:-9] + [opened] + recs[-9:])
    assert led["buckets_s"]["excluded"] == pytest.approx(b0["recovery"] + 0.0)
    assert led["buckets_s"]["recovery"] == pytest.approx(0.0)


def test_telemetry_goodput_exclude_has_the_running_daemon_write_the_window_into_its_run(make_daemon, tmp_path):
    """`telemetry goodput --exclude START END --reason R` against a real daemon: the daemon writes
    a goodput/exclude event of its own into the run; the part of the window in the start-up is
    excluded, in the daemon's live ledger and in the offline one of the file alike. Bad windows
    and a RUN_DIR with it are one line and exit code 2."""
    import time

    from telemetry import TelemetryClient

    d = make_daemon(world_size=1, log_dir=tmp_path / "telemetry", config={"daemon_record_interval_s": 0.2})
    tm = TelemetryClient(d.ingest, rank=0)
    for s in range(1, 6):
        tm.log(s, {"perf/step_time": 0.05, "train/loss": 1.0})
        time.sleep(0.05)
    tm.close()
    recs = d.wait_for(lambda rs: sum(r["kind"] == "metrics" for r in rs) >= 5)
    # A window in the middle of its start-up: from its process start to its first step's start.
    started = next(r["info"]["started_at"] for r in recs if r["kind"] == "hello")
    first_began = next(r["t"] - r["values"]["perf/step_time"] for r in recs if r["kind"] == "metrics")
    a, b = started + 0.25 * (first_began - started), started + 0.75 * (first_began - started)
    cmd = [sys.executable, "-m", "telemetry", "goodput", "--control", d.control, "--exclude"]
    out = subprocess.run(cmd + [repr(a), repr(b), "--reason", "kernel upgrade"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "excluded from goodput" in out.stdout, out
    for bad in (["now", repr(a)], ["yesterday", "now"]):
        out = subprocess.run(cmd + bad, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out
    # It needs the daemon's control token, as a drain does (another local user cannot book time away).
    out = subprocess.run(cmd + ["1", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TELEMETRY_CONTROL_TOKEN": "not-the-token"})
    assert out.returncode == 2 and "not authorised" in out.stderr, out
    out = subprocess.run(cmd[:4] + [str(tmp_path), "--exclude", "1", "2"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "no RUN_DIR" in out.stderr, out
    d.wait_for(lambda rs: any(r["kind"] == "event" and r["name"] == "goodput/exclude" for r in rs))
    d.drain()
    recs = d.read_jsonl()
    ev = [r for r in recs if r["kind"] == "event" and r["name"] == "goodput/exclude"]
    assert len(ev) == 1 and ev[0]["rank"] is None and ev[0]["data"]["reason"] == "kernel upgrade"
    led = ledger(recs)
    _sums_to_wall(led)
    assert led["buckets_s"]["excluded"] == pytest.approx(b - a, abs=1e-5)
    assert led["goodput"] == pytest.approx(led["buckets_s"]["productive"] / (led["wall_s"] - (b - a)))
    live = [r["values"] for r in recs if r["kind"] == "daemon" and "goodput/excluded_s" in r["values"]][-1]
    assert live["goodput/excluded_s"] == pytest.approx(b - a, abs=1e-5)
    assert live["goodput/settled/excluded_s"] == pytest.approx(b - a, abs=1e-5)


def test_slow_steps_are_booked_against_the_runs_ideal_step_time_beyond_its_noise():
    """100 steps of ~1 s (a 2 % jitter, the run's own noise), three of them 3 s (a GC pause, a
    throttled GPU): `slow_steps` is what those three took beyond the run's ideal (its usual step,
    the median), taken out of productive; the jitter is no slow step, nor is a slow step in the
    launch's warm-up (its first steps compile and fill caches)."""
    import random

    rnd = random.Random(7)
    recs, t = [_hello(T0 + 1, 0, T0)], T0 + 2.0
    truth = 0.0
    for s in range(1, 101):
        st = 1.0 + rnd.uniform(-0.02, 0.02)
        if s in (3, 40, 70, 90):          # step 3 is in the warm-up: not judged
            st = 3.0
            truth += 2.0 if s != 3 else 0.0
        t += st
        recs.append(_step(t, s, st, data=0.1))
    led = ledger(recs)
    b = led["buckets_s"]
    _sums_to_wall(led)
    _no_negative(led)
    # (the ideal is the median compute time, 0.9 s here, to its 1 % bin)
    assert b["slow_steps"] == pytest.approx(truth, rel=0.02)
    assert b["data_loading"] == pytest.approx(100 * 0.1)
    assert b["productive"] == pytest.approx(sum(r["values"]["perf/step_time"] for r in recs[1:]) - 10.0 - b["slow_steps"])
    assert "slow_steps" in text(led)


def test_a_steady_run_with_its_own_jitter_has_no_slow_steps():
    import random

    rnd = random.Random(3)
    recs, t = [_hello(T0 + 1, 0, T0)], T0 + 2.0
    for s in range(1, 301):
        st = rnd.uniform(0.9, 1.1)      # a busy machine's spread: noise, not slowness
        t += st
        recs.append(_step(t, s, st))
    led = ledger(recs)
    assert led["buckets_s"]["slow_steps"] == 0.0
    _sums_to_wall(led)


def _two_ranks(n: int, slow_steps: range, slow_s: float, seed: int) -> tuple[list[dict], float]:
    """Two alike ranks on a busy machine (each phase's time jitters by 30 ms), rank 1 slower by
    slow_s in forward in `slow_steps`: the daemon's aggregated steps as its straggler view writes
    them (the slower rank's forward minus the other's), and the excess injected."""
    import random

    rnd = random.Random(seed)
    recs, t, injected = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)], T0 + 2.0, 0.0
    for s in range(1, n + 1):
        fwd = [0.5 + rnd.gauss(0.0, 0.03), 0.5 + rnd.gauss(0.0, 0.03)]
        if s in slow_steps:
            fwd[1] += slow_s
            injected += slow_s
        slow = 0 if fwd[0] > fwd[1] else 1
        st = 0.5 + max(fwd)
        t += st
        recs.append(_step(t, s, st, **{"perf/straggler_rank": float(slow), "perf/straggler_phase_index": 1.0,
                                       "perf/straggler_excess_s": abs(fwd[0] - fwd[1]),
                                       "perf/straggler_median_s": min(fwd)}))
    return recs, injected


def test_a_balanced_run_on_a_busy_machine_books_no_straggler_beyond_its_own_noise():
    """Which rank is slowest by a little changes step to step: that is the run's noise, no
    straggler; it stays productive time."""
    recs, _ = _two_ranks(400, range(0), 0.0, seed=5)
    led = ledger(recs)
    b = led["buckets_s"]
    _sums_to_wall(led)
    noise = sum(r["values"]["perf/straggler_excess_s"] for r in recs[2:])
    assert noise > 0.01 * led["wall_s"]                     # what the old sum booked as straggler
    assert b["straggler"] <= 0.005 * led["wall_s"], (b["straggler"], noise, led["wall_s"])   # the truth is 0
    assert b["productive"] + b["straggler"] + b["slow_steps"] == pytest.approx(
        sum(r["values"]["perf/step_time"] for r in recs[2:]))


def test_a_straggler_amid_the_noise_is_booked_at_what_was_injected():
    """Rank 1 slower by 0.3 s in forward for 81 steps of 300, the machine's jitter throughout:
    the straggler bucket is the injected time (within 0.5 % of the wall), not it plus the noise
    of every other step."""
    recs, injected = _two_ranks(300, range(100, 181), 0.3, seed=11)
    led = ledger(recs)
    b, wall = led["buckets_s"], led["wall_s"]
    _sums_to_wall(led)
    noise = sum(r["values"]["perf/straggler_excess_s"] for r in recs[2:]) - injected
    assert noise > 0.01 * wall                       # what the old sum booked on top
    assert abs(b["straggler"] - injected) <= 0.005 * wall, (b["straggler"], injected, wall)


def test_each_ranks_ledger_takes_the_jobs_planned_maintenance_windows():
    """Both windows of a job's planned maintenance, the one `telemetry goodput --exclude` has the
    daemon write (no rank) and the one rank 0's client opens and closes, lie in both ranks'
    start-up: each rank's ledger excludes them as the job's does (the ranks' books saw neither
    the daemon's event nor the other rank's before), and rank 0's events keep rank 1's process
    alive no longer than it was."""
    recs = [_hello(T0 + 0.2, 0, T0), _hello(T0 + 0.2, 1, T0 + 0.5),
            {"kind": "event", "t": T0 + 30.0, "rank": None, "name": "goodput/exclude",
             "data": {"start": T0 + 1.0, "end": T0 + 3.0, "reason": "planned"}},
            _event(T0 + 4.0, "goodput/exclude_begin", 0), _event(T0 + 6.0, "goodput/exclude_end", 0)]
    t = T0 + 10.0
    for step in range(1, 6):
        t += 1.0
        for r in (0, 1):
            recs.append({"kind": "metrics", "t": t, "step": step, "rank": r, "values": {"perf/step_time": 1.0}})
        recs.append(_step(t, step, 1.0))
    recs += [_event(t + 0.5, "goodput/exclude_begin", 0), _bye(t + 1.0, 0), _bye(t + 0.2, 1)]
    led = ledger(recs)
    assert led["buckets_s"]["excluded"] == pytest.approx(4.0)
    for r in (0, 1):
        rl = led["ranks"][r]
        assert rl["buckets_s"]["excluded"] == pytest.approx(4.0), (r, rl)
        assert rl["buckets_s"]["startup"] == pytest.approx(10.0 - (0.5 if r else 0.0) - 4.0), (r, rl)
        assert sum(rl["buckets_s"].values()) == pytest.approx(rl["wall_s"], abs=1e-9)
    # Rank 0's last begin (after rank 1's bye) is no record of rank 1's: its wall ends at its bye.
    assert led["ranks"][1]["wall_s"] == pytest.approx(t + 0.2 - (T0 + 0.5))
    assert led["ranks"][0]["wall_s"] == pytest.approx(t + 1.0 - T0)


@pytest.mark.parametrize("via", ["event", "exclude"])
def test_a_window_a_client_marks_with_its_events_is_excluded_in_every_ledger(make_daemon, via):
    """Rank 0's client sends goodput/exclude_begin and goodput/exclude_end (client.event, or
    `with tm.exclude(reason):`, which sends them) during the start-up of a 2-rank job, through a
    real daemon that writes per-rank records: the job's ledger, rank 1's as well as rank 0's, and
    the daemon's live one exclude exactly the window between the two events (at least the time
    slept in it)."""
    import contextlib
    import time

    from telemetry import TelemetryClient

    d = make_daemon(world_size=2, per_rank=True, config={"pollers": {"nvml_enabled": False}})
    tms = [TelemetryClient(d.ingest, rank=r) for r in (0, 1)]
    with tms[0].exclude("maintenance") if via == "exclude" else contextlib.nullcontext():
        if via == "event":
            tms[0].event("goodput/exclude_begin", {"reason": "maintenance"})
        t0 = time.perf_counter()
        time.sleep(0.3)
        slept = time.perf_counter() - t0
        if via == "event":
            tms[0].event("goodput/exclude_end", {"reason": "maintenance"})
    for s in range(1, 6):
        time.sleep(0.02)
        for tm in tms:
            tm.log(s, {"perf/step_time": 0.02, "train/loss": 1.0})
    for tm in tms:
        tm.event("train_end", {"step": 5})
        tm.close()
    d.wait_for(lambda rs: sum(r["kind"] == "bye" for r in rs) >= 2)
    d.drain()
    recs = d.read_jsonl()
    at = {r["name"]: r["t"] for r in recs if r["kind"] == "event" and r["name"].startswith("goodput/")}
    window = at["goodput/exclude_end"] - at["goodput/exclude_begin"]
    assert window >= slept
    led = ledger(recs)
    _sums_to_wall(led)
    _no_negative(led)
    assert led["steps"] == 5 and led["buckets_s"]["excluded"] == pytest.approx(window, abs=1e-6)
    for r in (0, 1):
        assert led["ranks"][r]["buckets_s"]["excluded"] == pytest.approx(window, abs=1e-6), (r, led["ranks"][r])
    live = [r["values"] for r in recs if r["kind"] == "daemon" and "goodput/excluded_s" in r["values"]][-1]
    assert live["goodput/excluded_s"] == pytest.approx(window, abs=1e-5)


def test_the_drains_last_ledger_and_counters_take_a_scripts_non_zero_exit(make_daemon):
    """A script that closes its client (a bye, no train_end) and then exits 1: the drain request
    of its launcher carries the exit code, the daemon writes script_exit, and the offline ledger
    books the time from the last step to the bye as hang. The daemon's last record (its live
    ledger and the settled counters, all of the ledger at the drain) must say the same."""
    import time

    from telemetry import TelemetryClient
    from telemetry.shared import control

    d = make_daemon(world_size=1, config={"pollers": {"nvml_enabled": False}})
    tm = TelemetryClient(d.ingest, rank=0)
    for s in range(1, 6):
        time.sleep(0.02)
        tm.log(s, {"perf/step_time": 0.02, "train/loss": 1.0})
    time.sleep(0.3)                     # the script's tail, then its error
    tm.close()
    d.wait_for(lambda rs: any(r["kind"] == "bye" for r in rs))
    control.request(d.control, "drain", timeout_s=60, exit_code=1)
    d.proc.wait(60)
    recs = d.read_jsonl()
    assert [r["data"]["exit_code"] for r in recs if r["kind"] == "event" and r["name"] == "script_exit"] == [1]
    led = ledger(recs)
    hang = led["buckets_s"]["hang"]
    assert hang >= 0.3, led["buckets_s"]
    last = [r["values"] for r in recs if r["kind"] == "daemon" and "goodput/hang_s" in r["values"]][-1]
    assert last["goodput/hang_s"] == pytest.approx(hang, abs=1e-5), last
    assert last["goodput/settled/hang_s"] == pytest.approx(hang, abs=1e-5), last


def test_a_rank_a_busy_host_slowed_for_the_first_steps_only_by_the_runs_noise_is_no_straggler():
    """Two alike ranks; for the run's first 40 steps the host's load falls on rank 0, slowest at
    every one of them by no more than the run's own jitter shows later (as a real run beside a
    CPU hog did): before the noise bound is known that excess is booked for now (its rank was the
    straggler of most recent steps); once the bound is known it goes back to productive, and the
    ledger books what it books of the same run without that start (its noise's tail). A rank
    slow beyond the noise from the start stays a straggler."""
    import random

    def run(bias, first_s: float = 0.0) -> tuple[list[dict], float]:
        rnd, more = random.Random(3), random.Random(4)
        recs, t, early = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)], T0 + 2.0, 0.0
        for s in range(1, 301):
            fwd = [0.5 + rnd.gauss(0.0, 0.03), 0.5 + rnd.gauss(0.0, 0.03)]
            if bias and s <= 40:         # rank 0 the slower one, by as much as the run's jitter
                fwd[0] = max(fwd) + (first_s or abs(more.gauss(0.0, 0.03)))
                early += fwd[0] - fwd[1]
            slow = 0 if fwd[0] > fwd[1] else 1
            st = 0.5 + max(fwd)
            t += st
            recs.append(_step(t, s, st, **{"perf/straggler_rank": float(slow), "perf/straggler_phase_index": 1.0,
                                           "perf/straggler_excess_s": abs(fwd[0] - fwd[1]),
                                           "perf/straggler_median_s": min(fwd)}))
        return recs, early

    ref = ledger(run(False)[0])["buckets_s"]["straggler"]
    recs, early = run(True)
    led = ledger(recs)
    b = led["buckets_s"]
    _sums_to_wall(led)
    assert early > 0.005 * led["wall_s"]           # what the old ledger booked on top
    assert b["straggler"] <= ref + 0.001 * led["wall_s"], (b["straggler"], ref, early, led["wall_s"])
    assert b["productive"] + b["straggler"] + b["slow_steps"] == pytest.approx(
        sum(r["values"]["perf/step_time"] for r in recs[2:]))
    # 0.3 s beyond the other rank at each of the first 40 steps: far beyond the noise, booked.
    recs, early = run(True, 0.3)
    b = ledger(recs)["buckets_s"]
    assert b["straggler"] >= early, (b["straggler"], early)


def test_a_busy_hosts_lone_spikes_on_alike_ranks_are_no_straggler():
    """Two alike ranks; every 20th step the host deschedules one of them (either) for 0.15 s, a
    step at a time, far beyond the run's usual jitter (a CPU hog beside the job does it): each
    spike is a single step, the next one's straggler not that rank beyond the noise, so it is the
    run's noise (productive, or a slow step), no straggler. Rank 1 slow for 3 steps running is
    one."""
    import random

    def run(episode: int) -> tuple[list[dict], float]:
        rnd = random.Random(8)
        recs, t, spikes = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)], T0 + 2.0, 0.0
        for s in range(1, 301):
            fwd = [0.5 + rnd.gauss(0.0, 0.03), 0.5 + rnd.gauss(0.0, 0.03)]
            if s % 20 == 0:
                r = rnd.randrange(2)
                fwd[r] = max(fwd) + 0.15
                spikes += fwd[r] - fwd[1 - r]
            if episode <= s < episode + 3:
                fwd[1] = max(fwd) + 0.3
            slow = 0 if fwd[0] > fwd[1] else 1
            st = 0.5 + max(fwd)
            t += st
            recs.append(_step(t, s, st, **{"perf/straggler_rank": float(slow), "perf/straggler_phase_index": 1.0,
                                           "perf/straggler_excess_s": abs(fwd[0] - fwd[1]),
                                           "perf/straggler_median_s": min(fwd)}))
        return recs, spikes

    recs, spikes = run(10_000)
    led = ledger(recs)
    b = led["buckets_s"]
    _sums_to_wall(led)
    assert spikes > 0.005 * led["wall_s"]           # what the old ledger booked
    assert b["straggler"] <= 0.001 * led["wall_s"], (b["straggler"], spikes, led["wall_s"])
    assert b["productive"] + b["straggler"] + b["slow_steps"] == pytest.approx(
        sum(r["values"]["perf/step_time"] for r in recs[2:]))
    recs, _ = run(150)                              # rank 1 0.3 s slower at steps 150-152
    b = ledger(recs)["buckets_s"]
    assert 3 * 0.3 <= b["straggler"] <= 3 * 0.3 + 0.001 * led["wall_s"] + 0.2, b


def _forward_stragglers(plan: list[tuple[int, float]]) -> list[dict]:
    """Two ranks' hellos and one step a (slowest rank, its excess in forward) of `plan`: each
    step 0.3 s plus that excess."""
    recs, t = [_hello(T0 + 1, 0, T0), _hello(T0 + 1, 1, T0)], T0 + 2.0
    for s, (slow, excess) in enumerate(plan, start=1):
        st = 0.3 + excess
        t += st
        recs.append(_step(t, s, st, **{"perf/straggler_rank": float(slow), "perf/straggler_phase_index": 1.0,
                                       "perf/straggler_excess_s": excess, "perf/straggler_median_s": 0.1}))
    return recs


@pytest.mark.parametrize("first", [[0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1], [0]])
def test_a_stragglers_onset_is_booked_when_another_rank_was_slowest_before(first):
    """A short run (no noise bound yet): a busy host made rank 0 the slowest, by a little, of
    the first steps; from then on rank 1 is 0.2 s slow at every step. Its first slow steps are
    not yet most recent steps' straggler (judged noise for now), but they were its onset: the
    whole 0.2 s x its steps is booked (they were lost under load in a real 2-rank run)."""
    led = ledger(_forward_stragglers([(slow, 0.004) for slow in first] + [(1, 0.2)] * 11))
    _sums_to_wall(led)
    _no_negative(led)
    early = sum(0.004 for s in first if s == 1)           # rank 1's own early noise may be booked with it
    assert 11 * 0.2 - 1e-9 <= led["buckets_s"]["straggler"] <= 11 * 0.2 + early + 0.004 * len(first) + 1e-9, led["buckets_s"]


@pytest.mark.parametrize("gap_step", [7, 9])
def test_a_stragglers_onset_survives_a_step_it_was_not_slowest(gap_step):
    """As above, rank 1 0.2 s slow from step 6, but at one step of its onset rank 0 is the
    slowest, by a little (a busy host's jitter). Rank 1 is still the straggler of most recent
    steps soon after, and its slow steps before that step were its onset as much as those
    after: all of them are booked."""
    plan = [(0, 0.004) if s <= 5 or s == gap_step else (1, 0.2) for s in range(1, 17)]
    slow_steps = sum(rank == 1 for rank, _ in plan)
    led = ledger(_forward_stragglers(plan))
    _sums_to_wall(led)
    _no_negative(led)
    early = 0.004 * 6                                   # rank 0's own early noise may be booked too
    assert slow_steps * 0.2 - 1e-9 <= led["buckets_s"]["straggler"] <= slow_steps * 0.2 + early + 1e-9, led["buckets_s"]
