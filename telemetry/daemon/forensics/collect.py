"""Collect one rank's evidence for a forensics bundle. Each part is optional and never fatal:
what could not be had is said in the part's place ("error": why). Every function here takes a
rank verified by verify.py (a LocalRank), never a pid, signal or path from a hello."""
from __future__ import annotations

import fcntl
import os
import select
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


def signal_stacks(ranks: dict[int, LocalRank], wait_s: float,
                  pidfds: dict[int, int] | None = None) -> dict[int, str | dict]:
    """Send each verified rank its stacks signal and read what faulthandler appended to its file.

    ranks: rank -> LocalRank with a stacks_signal (verify.py); pidfds: rank -> the pidfd held
    since it was verified (open_pidfd), the signal's way where given. Returns rank -> the dump's text,
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
            why = _send(lr, (pidfds or {}).get(rank))
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


def _send(lr: LocalRank, held: int | None = None) -> str:
    """Send the rank its stacks signal, or say why not. Through a pidfd where the kernel has them
    (`held`, the one kept since verification, else one opened here): once it is open, the start
    time checked after it names the process the signal reaches; and only while /proc says the
    process still catches the signal (a rank that is exiting restores the default action, which
    would end it)."""
    pidfd = None
    try:
        if held is None:
            try:
                pidfd = os.pidfd_open(lr.pid)
            except (AttributeError, OSError):
                pidfd = None        # an older kernel: the start time check below, then kill()
        if not same_process(lr.pid, lr.start_time):
            return "the process is gone"
        status = read_status(lr.pid)
        if lr.stacks_signal is None or status is None or not catches(status, lr.stacks_signal):
            return f"the process no longer catches signal {lr.stacks_signal}"
        fd = held if held is not None else pidfd
        if fd is not None:
            signal.pidfd_send_signal(fd, lr.stacks_signal)
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
    docs/daemon.md, "Hang and crash forensics"."""
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


# PIDFD_GET_INFO (linux/pidfd.h; Linux 6.13, PIDFD_INFO_EXIT from 6.15): the kernel keeps the
# wait status of a process for whoever holds a pidfd of it, after its parent has reaped it. A
# launcher reaps its ranks at once (torchrun polls its children every 0.1 s), so a zombie's
# /proc status is gone before the daemon looks: without this, a killed rank's code is unknown.
_PIDFD_INFO_EXIT = 0x08
_PIDFD_INFO_SIZE = 64                       # struct pidfd_info, PIDFD_INFO_SIZE_VER0
_PIDFD_INFO_EXIT_CODE_AT = 60               # its __s32 exit_code
_PIDFD_GET_INFO = (3 << 30) | (_PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11    # _IOWR(0xFF, 11, ...)


def open_pidfd(lr: LocalRank) -> int | None:
    """A pidfd of the verified rank, held for as long as it is watched: the rank's exit status
    stays readable through it after its launcher reaps it (see pidfd_exit_status). None where
    the kernel has no pidfds (before 5.3) or the process is gone. The start time is checked
    after the pidfd is open, so it names the process that was verified, not a reused pid."""
    try:
        fd = os.pidfd_open(lr.pid)
    except (AttributeError, OSError):
        return None
    if not same_process(lr.pid, lr.start_time):
        os.close(fd)
        return None
    return fd


def pidfd_exit_status(pidfd: int) -> int | None:
    """The wait status (as waitpid gives it) of the process `pidfd` names, once its parent has
    reaped it; None while it runs or is a zombie, or where the kernel keeps none (before 6.15)."""
    buf = bytearray(_PIDFD_INFO_SIZE)
    buf[:8] = _PIDFD_INFO_EXIT.to_bytes(8, sys.byteorder)
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buf)
    except OSError:                         # ENOTTY/EINVAL: a kernel without PIDFD_GET_INFO
        return None
    if not int.from_bytes(buf[:8], sys.byteorder) & _PIDFD_INFO_EXIT:
        return None
    return int.from_bytes(buf[_PIDFD_INFO_EXIT_CODE_AT:_PIDFD_INFO_EXIT_CODE_AT + 4], sys.byteorder, signed=True)


def has_exited(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited (zombie or reaped); a descriptor
    that is not open (POLLNVAL) says nothing of any process."""
    poller = select.poll()                  # not select(): a daemon may hold descriptors past 1024
    poller.register(pidfd, select.POLLIN)
    return any(ev & select.POLLIN for _, ev in poller.poll(0))


def exit_status(lr: LocalRank, pidfd: int | None = None) -> tuple[bool, int | None, str]:
    """(gone, exit code or minus the signal number, how) of a verified rank we are not the parent of.

    pidfd (open_pidfd, opened when the rank was verified): whether it has exited, and its
    status even after its launcher reaped it (Linux >= 6.15). Without that status: a zombie
    (exited, not yet reaped) still has it in /proc/<pid>/stat (field 52, Linux >= 3.5); once
    reaped, nothing is left to read. A pid that names a process with another start time is the
    pid reused: the rank is gone."""
    if pidfd is not None:
        if not has_exited(pidfd):
            return False, None, ""
        status = pidfd_exit_status(pidfd)
        if status is not None:
            return (True, *describe_status(status))
    gone, code, how = _proc_exit_status(lr)
    if pidfd is not None and gone and code is None:
        status = pidfd_exit_status(pidfd)   # reaped between the two looks
        if status is not None:
            return (True, *describe_status(status))
    return gone, code, how


def _proc_exit_status(lr: LocalRank) -> tuple[bool, int | None, str]:
    try:
        with open(f"/proc/{lr.pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except FileNotFoundError:
        return True, None, "gone (reaped by its launcher; exit code unknown: this kernel keeps none after the reap)"
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
    return (True, *describe_status(status))


def describe_status(status: int) -> tuple[int, str]:
    """A wait status as (exit code, or minus the signal number; how it ended)."""
    if status & 0x7F:
        sig = status & 0x7F
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return -sig, f"killed by {name}"
    return status >> 8, f"exited with code {status >> 8}"
