"""Collect one rank's evidence for a forensics bundle. Each part is optional and never fatal:
what could not be had is said in the part's place ("error": why)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

PY_SPY_TIMEOUT_S = 10.0


def signal_stacks(pids_files: dict[int, tuple[int, str, int]], wait_s: float) -> dict[int, str | dict]:
    """Send each rank its stacks signal and read what faulthandler appended to its file.

    pids_files: rank -> (pid, file, signal). Returns rank -> the dump's text, or {"error": why}.
    All signals go out first, then one wait: the ranks dump at the same moment."""
    sizes: dict[int, int] = {}
    out: dict[int, str | dict] = {}
    for rank, (pid, path, sig) in pids_files.items():
        try:
            sizes[rank] = os.path.getsize(path)
            os.kill(pid, sig)
        except OSError as exc:
            out[rank] = {"error": f"{type(exc).__name__}: {exc}"}
    deadline = time.monotonic() + wait_s
    pending = set(sizes)
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        for rank in list(pending):
            try:
                if os.path.getsize(pids_files[rank][1]) > sizes[rank]:
                    pending.discard(rank)
            except OSError:
                pending.discard(rank)
    time.sleep(0.1)     # a dump that started is written in one go by the signal handler; let it end
    for rank, size in sizes.items():
        path = pids_files[rank][1]
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                f.seek(size)
                text = f.read()
        except OSError as exc:
            out[rank] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[rank] = text if text.strip() else {"error": f"no dump within {wait_s} s (the process may be "
                                                         f"stopped, or blocking signals)"}
    return out


def py_spy_exe() -> str | None:
    """py-spy on PATH, else beside this interpreter (a venv's bin/, which a daemon started as
    .venv/bin/python -m telemetry does not have on its PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def py_spy(pid: int, enabled: bool) -> dict[str, Any]:
    """`py-spy dump --native --pid` (native frames too). Needs ptrace: see README, Hang forensics."""
    if not enabled:
        return {"error": "off (diagnosis.hang_py_spy: false)"}
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


def process_state(pid: int) -> dict[str, Any]:
    try:
        import psutil

        p = psutil.Process(pid)
        with p.oneshot():
            state = {"status": p.status(), "num_threads": p.num_threads(),
                     "cpu_times_s": dict(p.cpu_times()._asdict()), "rss_bytes": p.memory_info().rss,
                     "create_time": p.create_time(), "cmdline": p.cmdline()[:20]}
        state["cpu_percent"] = p.cpu_percent(interval=0.2)
        return state
    except Exception as exc:   # psutil missing, process gone, access denied: never fatal
        return {"error": f"{type(exc).__name__}: {exc}"}


def exit_status(pid: int) -> tuple[bool, int | None, str]:
    """(gone, exit code or signal number, how) of a process we are not the parent of.

    A zombie (exited, not yet reaped by its parent) still has its wait status in
    /proc/<pid>/stat (field 52, Linux >= 3.5); once reaped, nothing is left to read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except FileNotFoundError:
        return True, None, "gone (reaped; exit code unknown)"
    except OSError:
        return False, None, ""
    fields = stat[stat.rfind(")") + 2:].split()   # after "pid (comm) ": field 3 onwards
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
