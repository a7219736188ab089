"""Collect one rank's evidence for a forensics bundle. Each part is optional and never fatal:
what could not be had is said in the part's place ("error": why). Every function here takes a
rank verified by verify.py (a LocalRank), never a pid, signal or path from a hello."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from telemetry.daemon.forensics.verify import LocalRank, catches, open_stacks, read_status, same_process

PY_SPY_TIMEOUT_S = 10.0
# The most of a dump read into a bundle (faulthandler writes at most 100 frames of 100 threads).
MAX_DUMP_BYTES = 4 << 20


def signal_stacks(ranks: dict[int, LocalRank], wait_s: float) -> dict[int, str | dict]:
    """Send each verified rank its stacks signal and read what faulthandler appended to its file.

    ranks: rank -> LocalRank with a stacks_signal (verify.py). Returns rank -> the dump's text,
    or {"error": why}. All signals go out first, then one wait: the ranks dump at the same
    moment. The file is read through the descriptor opened (and checked) before the signal."""
    out: dict[int, str | dict] = {}
    held: dict[int, tuple[int, int]] = {}          # rank -> (descriptor, size before the signal)
    try:
        for rank, lr in ranks.items():
            try:
                fd = open_stacks(lr)
            except OSError as exc:
                out[rank] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            held[rank] = (fd, os.fstat(fd).st_size)
            why = _send(lr)
            if why:
                out[rank] = {"error": why}
        pending = {r for r in held if r not in out}
        deadline = time.monotonic() + wait_s
        while pending and time.monotonic() < deadline:
            time.sleep(0.05)
            for rank in list(pending):
                fd, size = held[rank]
                if os.fstat(fd).st_size > size:
                    pending.discard(rank)
        time.sleep(0.1)     # a dump that started is written in one go by the signal handler; let it end
        for rank, (fd, size) in held.items():
            if rank in out:
                continue
            text = os.pread(fd, MAX_DUMP_BYTES, size).decode("utf-8", "replace")
            out[rank] = text if text.strip() else {"error": f"no dump within {wait_s} s (the process may be "
                                                             f"stopped, or blocking signals)"}
    finally:
        for fd, _ in held.values():
            os.close(fd)
    return out


def _send(lr: LocalRank) -> str:
    """Send the rank its stacks signal, or say why not. Through a pidfd where the kernel has them:
    once it is open, the start time checked after it names the process the signal reaches; and
    only while /proc says the process still catches the signal (a rank that is exiting restores
    the default action, which would end it)."""
    pidfd = None
    try:
        try:
            pidfd = os.pidfd_open(lr.pid)
        except (AttributeError, OSError):
            pidfd = None            # an older kernel: the start time check below, then kill()
        if not same_process(lr.pid, lr.start_time):
            return "the process is gone"
        status = read_status(lr.pid)
        if lr.stacks_signal is None or status is None or not catches(status, lr.stacks_signal):
            return f"the process no longer catches signal {lr.stacks_signal}"
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, lr.stacks_signal)
        else:
            os.kill(lr.pid, lr.stacks_signal)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return ""


def py_spy_exe() -> str | None:
    """py-spy on PATH, else beside this interpreter (a venv's bin/, which a daemon started as
    .venv/bin/python -m telemetry does not have on its PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def py_spy(lr: LocalRank, enabled: bool) -> dict[str, Any]:
    """`py-spy dump --native --pid` (native frames too) of a verified rank. Needs ptrace: see
    README, Hang forensics."""
    if not enabled:
        return {"error": "off (diagnosis.hang_py_spy: false)"}
    pid = lr.pid
    if not same_process(pid, lr.start_time):
        return {"error": "the process is gone"}
    exe = py_spy_exe()
    if exe is None:
        return {"error": "py-spy not installed (pip install py-spy)"}
    try:
        res = subprocess.run([exe, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                             timeout=PY_SPY_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if res.returncode != 0:
        return {"error": (res.stderr or res.stdout).strip()[-2000:] or f"exit code {res.returncode}"}
    return {"text": res.stdout}


def process_state(lr: LocalRank) -> dict[str, Any]:
    """psutil's view of a verified rank's process."""
    try:
        import psutil

        p = psutil.Process(lr.pid)
        if not same_process(lr.pid, lr.start_time):
            return {"error": "the process is gone"}
        with p.oneshot():
            state = {"status": p.status(), "num_threads": p.num_threads(),
                     "cpu_times_s": dict(p.cpu_times()._asdict()), "rss_bytes": p.memory_info().rss,
                     "create_time": p.create_time(), "cmdline": p.cmdline()[:20]}
        state["cpu_percent"] = p.cpu_percent(interval=0.2)
        return state
    except Exception as exc:   # psutil missing, process gone, access denied: never fatal
        return {"error": f"{type(exc).__name__}: {exc}"}


def exit_status(lr: LocalRank) -> tuple[bool, int | None, str]:
    """(gone, exit code or signal number, how) of a verified rank we are not the parent of.

    A zombie (exited, not yet reaped by its parent) still has its wait status in
    /proc/<pid>/stat (field 52, Linux >= 3.5); once reaped, nothing is left to read. A pid that
    names a process with another start time is the pid reused: the rank is gone."""
    try:
        with open(f"/proc/{lr.pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except FileNotFoundError:
        return True, None, "gone (reaped; exit code unknown)"
    except OSError:
        return False, None, ""
    fields = stat[stat.rfind(")") + 2:].split()   # after "pid (comm) ": field 3 onwards
    if len(fields) > 19 and fields[19] != str(lr.start_time):
        return True, None, "gone (reaped, its pid reused; exit code unknown)"
    if not fields or fields[0] not in ("Z", "X"):
        return False, None, ""
    try:
        status = int(fields[49])                   # field 52 of the whole line
    except (IndexError, ValueError):
        return True, None, "exited (exit code unknown)"
    if status & 0x7F:
        sig = status & 0x7F
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return True, -sig, f"killed by {name}"
    return True, status >> 8, f"exited with code {status >> 8}"
