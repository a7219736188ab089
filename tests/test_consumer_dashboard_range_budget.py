"""Range reads (/api/range) are held to the dashboard's memory budget: each answer's bytes are
reserved before it is built (budget.Reservations), so concurrent full-range reads of a big run
cannot add up past --memory-mb; one beyond the share is answered 503 with Retry-After and
counted (`ranges_refused`). The old code built every answer at once: 32 concurrent full-range
reads took a 256 MB dashboard to 608 MB."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

from testkit.dashboard_proc import Dashboard

MEMORY_MB = 128
NUM_NAMES = 64
NUM_STEPS = 3000
NUM_READERS = 32


def _write_run(root: Path) -> Path:
    tel = root / "big" / "telemetry"
    tel.mkdir(parents=True)
    names = [f"grp{i % 8}/m{i}" for i in range(NUM_NAMES)]
    with open(tel / "metrics.jsonl", "w") as f:
        for step in range(1, NUM_STEPS + 1):
            values = {n: (step * 7 + i) % 1000 / 7.0 for i, n in enumerate(names)}
            f.write(json.dumps({"kind": "metrics", "t": 1.7e9 + step, "step": step, "values": values}) + "\n")
    return root / "big"


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_concurrent_full_range_reads_stay_in_the_budget_and_refusals_are_counted(tmp_path):
    dash = Dashboard(str(_write_run(tmp_path)), "--memory-mb", str(MEMORY_MB), ready_timeout_s=300)
    try:
        run = dash.get_json("api/data")["runs"][0]
        keys = sorted(s["key"] for s in run["series"] if s["key"].startswith("grp"))
        assert len(keys) == NUM_NAMES and not any(s["thinned"] for s in run["series"])
        path = (f"api/range?run={run['id']}&x0=0&x1={NUM_STEPS}&width=8000"
                + "".join(f"&key={k}" for k in keys))
        results: list[tuple[int, dict, str | None]] = []
        lock = threading.Lock()
        go = threading.Event()

        def read() -> None:
            go.wait()
            try:
                with urllib.request.urlopen(dash.request(path), timeout=300) as r:
                    got = (r.status, json.loads(r.read()), None)
            except urllib.error.HTTPError as exc:
                got = (exc.code, json.loads(exc.read()), exc.headers.get("Retry-After"))
            with lock:
                results.append(got)

        threads = [threading.Thread(target=read) for _ in range(NUM_READERS)]
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join(600)
        assert len(results) == NUM_READERS
        # RSS sampled as a generous ceiling: the budget itself (the old code: several times it).
        peak_mb = _peak_rss_mb(dash.proc.pid)
        assert peak_mb <= MEMORY_MB, f"peak RSS {peak_mb:.0f} MB against --memory-mb {MEMORY_MB}"
        ok = [body for code, body, _ in results if code == 200]
        refused = [(body, retry) for code, body, retry in results if code != 200]
        assert ok, "one answer alone always goes"
        for body in ok:     # every key, over the whole range (cut to fewer columns to fit its share)
            assert sorted(body["series"]) == keys
            for sr in body["series"].values():
                assert sr["x"][0] == 1 and sr["x"][-1] == NUM_STEPS and sr["x"] == sorted(sr["x"])
        # Those that found no room in time (how many depends on the box's speed) were refused.
        assert all(code == 503 for code, _, _ in results if code != 200)
        assert all(retry is not None and int(retry) >= 1 for _, retry in refused)
        # Counted, exactly: the next answer (alone) carries the count.
        after = dash.get_json(path)
        assert after["ranges_refused"] == len(refused)
    finally:
        assert dash.stop() == 0


def test_reservations_refuse_and_count_what_does_not_fit_beside_answers_in_flight():
    from telemetry.consumers.dashboard.budget import Reservations

    r = Reservations(100)
    assert r.reserve(500)                     # alone: goes, whatever it costs
    assert not r.reserve(1, wait_s=0.0)       # nothing fits beside it
    r.release(500)
    assert r.reserve(60) and r.reserve(40)    # together within the share
    assert not r.reserve(1, wait_s=0.0)
    # One waiting for room goes once an answer in flight is done.
    waiter = threading.Thread(target=lambda: results.append(r.reserve(30, wait_s=60.0)))
    results: list[bool] = []
    waiter.start()
    r.release(60)
    waiter.join(60)
    assert results == [True]
    assert r.num_refused == 2 and r.num_in_flight == 2 and r.num_bytes == 70


def test_a_range_answer_too_big_for_its_share_alone_is_cut_to_fewer_columns():
    from telemetry.consumers.dashboard.budget import MIN_RANGE_BUCKETS, fit_range, range_bytes

    lengths = [3000] * 64
    assert fit_range(lengths, 0, 4000, 1 << 40) == (4000, range_bytes(lengths, 0, 4000))   # fits: as asked
    buckets, cost = fit_range(lengths, 0, 4000, 4 << 20)
    assert MIN_RANGE_BUCKETS <= buckets < 4000 and cost <= 4 << 20
    assert range_bytes(lengths, 0, buckets * 2) > 4 << 20      # the most columns that fit, to a halving
    assert fit_range(lengths, 0, 4000, 1) == (4000, range_bytes(lengths, 0, 4000))  # none fits: as asked (alone)
    # A zoom into 60 steps sends no more than 60 points a key, whatever the columns: it fits as asked.
    assert fit_range(lengths, 12, 4000, 4 << 20, span=60) == (4000, range_bytes(lengths, 12, 4000, span=60))
