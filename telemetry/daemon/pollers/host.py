"""HostPoller: host CPU, memory, disk and network, and each training rank's process, via psutil.

Everything is computed from deltas between two polls of the kernel's counters (CPU times, I/O
bytes), so a poll never sleeps. The poller keeps its own previous samples rather than using
psutil.cpu_percent(interval=None), whose baseline is per calling thread and shared with any
other caller. Counters are primed when the poller is built; a rank's process is primed the
first time its pid is seen, and its cpu_percent appears from the second poll on.

One record per poll:
    {"kind": "system", "t": <unix s>, "host": str, "values": {...}}
Values (GB = 1e9 bytes, MB = 1e6 bytes, rates per second of wall time between polls):
    system/cpu_percent              all cores, 0-100
    system/cpu_percent_core<i>      per core, 0-100 (pollers.host_per_core)
    system/load_1m, _5m, _15m       load average
    system/memory_percent           RAM in use, 0-100 (psutil: (total - available) / total)
    system/memory_used_gb, system/memory_available_gb, system/memory_total_gb
    system/swap_percent, system/swap_used_gb
    system/disk_read_mb_s, system/disk_write_mb_s    all block devices
    system/net_rx_mb_s, system/net_tx_mb_s           all interfaces but loopback (RDMA traffic
                                                     bypasses the kernel and is not counted)
    system/rss_gb                   resident memory summed over the training ranks' processes
    system/num_ranks_polled         rank processes that could be read this poll
    system/rank<r>/cpu_percent      rank r's process, % of one core (can exceed 100)
    system/rank<r>/rss_gb           resident memory (includes pinned host buffers)
    system/rank<r>/num_threads
    system/rank<r>/num_fds          open file descriptors of every kind (files, sockets, pipes):
                                    the number that runs into `ulimit -n`
Rank processes only (not their DataLoader workers): workers show in the host totals.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any

from protocol.output import SystemRecord
from telemetry.daemon.pollers.base import Poller
from telemetry.daemon.pollers.config import PollersConfig

GB = 1e9
MB = 1e6


class HostPoller(Poller):
    """Poll the host and the training ranks' processes; see the module docstring for the fields.

    Args:
        cfg: PollersConfig (host_* fields and host).
    """

    name = "host"

    def __init__(self, cfg: PollersConfig | None = None) -> None:
        import psutil  # lazy: only the daemon needs it

        cfg = cfg if cfg is not None else PollersConfig()
        super().__init__(cfg.host_interval_s)
        self.cfg = cfg
        self.host = cfg.host or socket.gethostname()
        self._psutil = psutil
        self._procs: dict[int, Any] = {}  # pid -> psutil.Process, primed for cpu_percent
        # Prime the delta-based counters so the first poll_once already reports real rates.
        self._last_cpu = self._cpu_busy_total()
        self._last_t = time.monotonic()
        self._last_disk = self._disk_bytes()
        self._last_net = self._net_bytes()

    def _cpu_busy_total(self) -> list[tuple[float, float]]:
        """(busy, total) CPU seconds per core, from one read of /proc/stat.

        As psutil and htop count them: guest time is already inside user/nice, iowait is idle.
        """
        out = []
        for c in self._psutil.cpu_times(percpu=True):
            total = sum(c) - getattr(c, "guest", 0.0) - getattr(c, "guest_nice", 0.0)
            out.append((total - c.idle - getattr(c, "iowait", 0.0), total))
        return out

    def _cpu_percent(self, values: dict) -> None:
        now = self._cpu_busy_total()
        before, self._last_cpu = self._last_cpu, now
        if len(before) != len(now):  # a CPU went on/offline: restart the deltas
            return
        sum_busy = sum_total = 0.0
        for i, ((b0, t0), (b1, t1)) in enumerate(zip(before, now)):
            d_busy, d_total = max(0.0, b1 - b0), max(0.0, t1 - t0)
            sum_busy += d_busy
            sum_total += d_total
            if self.cfg.host_per_core:
                values[f"system/cpu_percent_core{i}"] = min(100.0, 100.0 * d_busy / d_total) if d_total else 0.0
        values["system/cpu_percent"] = min(100.0, 100.0 * sum_busy / sum_total) if sum_total else 0.0

    def _disk_bytes(self) -> tuple[int, int] | None:
        try:
            d = self._psutil.disk_io_counters()
        except Exception:  # no /proc/diskstats in some containers
            return None
        return None if d is None else (d.read_bytes, d.write_bytes)

    def _net_bytes(self) -> tuple[int, int] | None:
        try:
            nics = self._psutil.net_io_counters(pernic=True)
        except Exception:
            return None
        rx = tx = 0
        for name, c in nics.items():
            if name == "lo":  # loopback is the daemon's own ipc/tcp, not I/O
                continue
            rx += c.bytes_recv
            tx += c.bytes_sent
        return rx, tx

    def poll_once(self) -> list[SystemRecord]:
        """One system record (host totals plus one block of keys per training rank)."""
        ps = self._psutil
        t = time.time()
        now = time.monotonic()
        elapsed_s = now - self._last_t
        self._last_t = now
        values: dict[str, float | int] = {}
        self._cpu_percent(values)
        try:
            values["system/load_1m"], values["system/load_5m"], values["system/load_15m"] = os.getloadavg()
        except (OSError, AttributeError):
            pass
        vm = ps.virtual_memory()
        values["system/memory_percent"] = vm.percent
        values["system/memory_used_gb"] = (vm.total - vm.available) / GB
        values["system/memory_available_gb"] = vm.available / GB
        values["system/memory_total_gb"] = vm.total / GB
        sw = ps.swap_memory()
        values["system/swap_percent"] = sw.percent
        values["system/swap_used_gb"] = sw.used / GB
        disk, net = self._disk_bytes(), self._net_bytes()
        self._rates(values, "disk_read_mb_s", "disk_write_mb_s", self._last_disk, disk, elapsed_s)
        self._rates(values, "net_rx_mb_s", "net_tx_mb_s", self._last_net, net, elapsed_s)
        self._last_disk, self._last_net = disk, net
        if self.cfg.host_per_rank:
            self._poll_ranks(values)
        return [SystemRecord(t, self.host, values)]

    @staticmethod
    def _rates(values: dict, name_a: str, name_b: str, before: tuple[int, int] | None,
               after: tuple[int, int] | None, elapsed_s: float) -> None:
        if before is None or after is None or elapsed_s <= 0:
            return
        da, db = after[0] - before[0], after[1] - before[1]
        if da < 0 or db < 0:  # a counter reset (device or interface went away): skip one sample
            return
        values[f"system/{name_a}"] = da / MB / elapsed_s
        values[f"system/{name_b}"] = db / MB / elapsed_s

    def _poll_ranks(self, values: dict) -> None:
        ps = self._psutil
        rank_pids = self._rank_pids_snapshot()
        live = set(rank_pids.values())
        for pid in list(self._procs):
            if pid not in live:
                del self._procs[pid]
        rss_total = 0
        num_polled = 0
        for rank, pid in sorted(rank_pids.items()):
            proc = self._procs.get(pid)
            fresh = proc is None
            try:
                if fresh:
                    proc = ps.Process(pid)
                    self._procs[pid] = proc
                with proc.oneshot():  # one read of /proc/<pid>/stat for all fields
                    cpu = proc.cpu_percent(interval=None)
                    rss = proc.memory_info().rss
                    num_threads = proc.num_threads()
                    try:
                        num_fds = proc.num_fds()
                    except (AttributeError, ps.AccessDenied):  # Windows has no fds
                        num_fds = None
            except (ps.NoSuchProcess, ps.ZombieProcess):
                # The rank exited (or never existed): drop it; the diagnosis rules notice the silence.
                self._procs.pop(pid, None)
                continue
            except ps.AccessDenied:
                self._procs.pop(pid, None)
                continue
            prefix = f"system/rank{rank}/"
            if not fresh:  # the first cpu_percent call of a Process has nothing to compare against
                values[prefix + "cpu_percent"] = cpu
            values[prefix + "rss_gb"] = rss / GB
            values[prefix + "num_threads"] = num_threads
            if num_fds is not None:
                values[prefix + "num_fds"] = num_fds
            rss_total += rss
            num_polled += 1
        if rank_pids:
            values["system/rss_gb"] = rss_total / GB
            values["system/num_ranks_polled"] = num_polled
