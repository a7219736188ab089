"""No false alarms from a busy machine's noise (issue 29 item 7), at the rule level: what the rules
saw in balanced runs on a loaded 2-core box (one rank's data loading 20-60 ms for a few steps,
one slow batch, throughput swinging 2x with other jobs) raises nothing; a real slowdown of the
same runs still does. End-to-end with the trainer: test_straggler_ddp_model.py."""
from __future__ import annotations

import random

from test_diagnosis_rules import feed, metrics, names, only, phases


def jittery(seed: int, n: int, base_s: float = 0.15, jitter_s: float = 0.03) -> list[float]:
    rng = random.Random(seed)
    return [max(0.05, rng.gauss(base_s, jitter_s)) for _ in range(n)]


def run(step_times: list[float], slow: dict[int, tuple[int, float]], first_step: int = 11) -> list[dict]:
    """Aggregated records of 2 ranks: {step index: (rank, extra data-loading s)}, the rest balanced."""
    recs = []
    for i, st in enumerate(step_times):
        dl = [0.003, 0.003]
        rank, extra = slow.get(i, (0, 0.0))
        dl[rank] += extra
        times = {"data_loading": dl, "forward": [0.03, 0.03], "backward": [st * 0.5, st * 0.5],
                 "optimizer": [0.01, 0.01]}
        recs.append(phases(first_step + i, times, ranks=(0, 1), step_time=st + extra))
    return recs


def test_a_burst_of_cpu_contention_in_one_ranks_data_loading_is_no_straggler():
    # As measured: rank 0's data loading 30-65 ms for 8 log steps, step times 0.1-0.3 s.
    times = jittery(1, 80)
    burst = {40 + k: (0, x) for k, x in enumerate((0.06, 0.045, 0.046, 0.051, 0.062, 0.062, 0.055, 0.057))}
    assert feed(only("straggler"), run(times, burst)) == []


def test_a_real_slowdown_beside_the_same_noise_is_named_within_ten_steps():
    times = jittery(2, 80)
    slow = {i: (1, 0.15) for i in range(40, 80)}
    ev = feed(only("straggler"), run(times, slow))
    assert names(ev) == ["diagnosis/straggler"] and ev[0]["rank"] == 1
    assert ev[0]["data"]["phase"] == "data_loading" and ev[0]["data"]["step"] < 11 + 40 + 10
    assert ev[0]["data"]["noise_s"] > 0


def test_one_slow_batch_is_not_a_data_bound_run():
    # As measured: 36 % of one step against a median of 10 %.
    recs = [metrics(s, {"perf/data_loading_ratio": 0.36 if s == 50 else 0.10}) for s in range(11, 90)]
    assert feed(only("data_bound"), recs) == []
    recs = [metrics(s, {"perf/data_loading_ratio": 0.36 if 50 <= s < 55 else 0.10}) for s in range(11, 90)]
    assert names(feed(only("data_bound"), recs)) == ["diagnosis/data_bound"]


def test_throughput_swinging_with_other_jobs_is_no_drop():
    rng = random.Random(3)
    # A shared box: tokens/s between 8k and 30k as other jobs come and go, then 5 steps at 6.9k.
    recs = [metrics(s, {"perf/tokens_per_second": rng.uniform(8e3, 3e4)}) for s in range(11, 60)]
    recs += [metrics(s, {"perf/tokens_per_second": 6.9e3}) for s in range(60, 65)]
    assert feed(only("throughput_drop"), recs) == []
    # The same drop in a steady run is one.
    recs = [metrics(s, {"perf/tokens_per_second": 1.7e4 + (s % 3) * 200}) for s in range(11, 60)]
    recs += [metrics(s, {"perf/tokens_per_second": 6.9e3}) for s in range(60, 66)]
    assert names(feed(only("throughput_drop"), recs)) == ["diagnosis/throughput_drop"]
