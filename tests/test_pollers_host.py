"""HostPoller with real psutil values of real child processes."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from telemetry.daemon.pollers import PollersConfig, make_pollers
from telemetry.daemon.pollers.host import HostPoller

# A child that holds ~200 MB resident and burns CPU on 1 thread plus 3 idle threads.
BUSY_CHILD = r"""
import threading, time, sys
buf = bytearray(200 * 10**6)
for i in range(0, len(buf), 4096): buf[i] = 1   # touch every page so it is resident
for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
f = open(sys.executable, "rb")                   # one extra open file
print("ready", flush=True)
end = time.time() + 60
while time.time() < end: pass
"""


@pytest.fixture
def busy_child():
    p = subprocess.Popen([sys.executable, "-c", BUSY_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        yield p
    finally:
        p.kill()
        p.wait(10)


@pytest.fixture
def idle_child():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield p
    finally:
        p.kill()
        p.wait(10)


def test_host_totals_are_real(tmp_path):
    poller = HostPoller(PollersConfig(host="h1"))
    # generate disk writes between polls so the write rate has something to count
    (tmp_path / "x.bin").write_bytes(b"\0" * 10**6)
    [rec] = poller.poll_once()
    assert rec["kind"] == "system" and rec["host"] == "h1"
    v = rec["values"]
    assert 0.0 <= v["system/cpu_percent"] <= 100.0
    ncores = psutil.cpu_count()
    assert [f"system/cpu_percent_core{i}" in v for i in range(ncores)] == [True] * ncores
    assert v["system/memory_total_gb"] == pytest.approx(psutil.virtual_memory().total / 1e9)
    assert 0 < v["system/memory_percent"] < 100
    assert 0 <= v["system/swap_percent"] <= 100
    assert v["system/load_1m"] >= 0
    for k in ("system/net_rx_mb_s", "system/net_tx_mb_s"):
        assert v[k] >= 0
    if psutil.disk_io_counters() is not None:
        assert v["system/disk_read_mb_s"] >= 0 and v["system/disk_write_mb_s"] >= 0
    assert "system/rss_gb" not in v  # no ranks known yet


def test_rank_process_values_are_real(busy_child, idle_child):
    poller = HostPoller(PollersConfig(host_per_core=False))
    poller.set_rank_pids({0: busy_child.pid, 1: idle_child.pid})
    [first] = poller.poll_once()
    v = first["values"]
    # first sight of a process: no cpu_percent yet (psutil needs a previous sample)
    assert "system/rank0/cpu_percent" not in v
    assert not any(k.startswith("system/cpu_percent_core") for k in v)
    # Truth, not a rate (a spinning thread's share of a core is whatever the machine's load
    # leaves it): the share reported over the gap between two polls, times that gap, is CPU
    # time the child really used, measured by us around both polls. The loop waits until the
    # spinning child has been scheduled since the previous poll.
    child = psutil.Process(busy_child.pid)
    for _ in range(200):
        cpu_before = sum(child.cpu_times()[:2])
        gap_start = time.monotonic()              # after the previous poll ended
        threading.Event().wait(0.3)
        gap_s = time.monotonic() - gap_start      # at most the gap psutil divides by
        [rec] = poller.poll_once()
        cpu_used_s = sum(child.cpu_times()[:2]) - cpu_before
        v = rec["values"]
        if v["system/rank0/cpu_percent"] > 0:
            break
    assert v["system/rank0/cpu_percent"] > 0, v
    tick_s = 1 / os.sysconf("SC_CLK_TCK")         # /proc's CPU times come in clock ticks
    assert v["system/rank0/cpu_percent"] / 100 * gap_s <= cpu_used_s + 2 * tick_s, (v, gap_s, cpu_used_s)
    assert v["system/rank1/cpu_percent"] < v["system/rank0/cpu_percent"]
    rss0 = psutil.Process(busy_child.pid).memory_info().rss / 1e9
    assert v["system/rank0/rss_gb"] == pytest.approx(rss0, rel=0.1) and v["system/rank0/rss_gb"] > 0.19
    assert v["system/rank0/num_threads"] >= 4
    assert v["system/rank0/num_fds"] == psutil.Process(busy_child.pid).num_fds()
    assert v["system/rss_gb"] == pytest.approx(v["system/rank0/rss_gb"] + v["system/rank1/rss_gb"])
    assert v["system/num_ranks_polled"] == 2


def test_exited_rank_is_dropped_and_others_continue(busy_child, idle_child):
    poller = HostPoller(PollersConfig())
    poller.set_rank_pids({0: busy_child.pid, 1: idle_child.pid})
    poller.poll_once()
    idle_child.kill()
    idle_child.wait(10)
    [rec] = poller.poll_once()
    v = rec["values"]
    assert "system/rank1/rss_gb" not in v and "system/rank0/rss_gb" in v
    assert v["system/num_ranks_polled"] == 1
    # a rank map update forgets pids no longer listed
    poller.set_rank_pids({0: busy_child.pid})
    poller.poll_once()
    assert set(poller._procs) == {busy_child.pid}


def test_unknown_pid_is_not_an_error():
    poller = HostPoller(PollersConfig())
    poller.set_rank_pids({3: 2**22 + 12345})  # above the default pid_max: never a live process
    [rec] = poller.poll_once()
    assert rec["values"]["system/num_ranks_polled"] == 0


def test_thread_emits_and_close_is_idempotent():
    got, ready = [], threading.Event()

    def emit(rec):
        got.append(rec)
        ready.set()

    [host] = [p for p in make_pollers(PollersConfig(nvml_enabled=False, host_interval_s=0.1))]
    host.start(emit)
    assert ready.wait(10)
    host.close()
    host.close()
    assert not host.running and got[0]["kind"] == "system"
    assert host.stats()["poll_cpu_s"] > 0


def test_a_failing_poll_is_counted_and_the_thread_keeps_going(monkeypatch):
    host = HostPoller(PollersConfig(host_interval_s=0.1))
    calls = {"n": 0}
    real = host.poll_once

    def flaky():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real()

    monkeypatch.setattr(host, "poll_once", flaky)
    ok = threading.Event()
    host.start(lambda rec: ok.set())
    assert ok.wait(10)
    host.close()
    assert host.num_poll_errors == 1


def test_cpu_percent_is_real_on_the_poll_thread(busy_child):
    """Built on one thread, polled on another (as in the daemon): the first poll already counts
    the CPU a spinning child burns. (psutil.cpu_percent keeps its baseline per thread, so a poller
    relying on it reported 0.0 here.)"""
    poller = HostPoller(PollersConfig())
    threading.Event().wait(0.5)
    out = []
    t = threading.Thread(target=lambda: out.extend(poller.poll_once()))
    t.start()
    t.join(10)
    v = out[0]["values"]
    one_core_share = 100.0 / psutil.cpu_count()
    assert v["system/cpu_percent"] > 0.5 * one_core_share, v  # at least half a core of the box is busy
    assert max(v[f"system/cpu_percent_core{i}"] for i in range(psutil.cpu_count())) > 30
