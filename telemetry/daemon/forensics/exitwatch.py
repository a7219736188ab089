"""When each watched rank's process exited, to the millisecond: one thread blocked in poll() on
the pidfds the forensics stage holds (collect.open_pidfd). A pidfd polls readable once its
process has exited; the stage itself looks only on its timer (about once a second), so without
this a rank's death would be known up to a tick late, and the goodput ledger's hang would end
up to a second after the kill (the `gone_for_s` of a `diagnosis/rank_exited` event says how long
before the event the process was gone: from this watcher where it saw it).

Nothing per record: the thread wakes when a process exits or the set of pidfds changes. Where
the kernel has no pidfds (open_pidfd gives None), the stage's timer is all there is.
"""
from __future__ import annotations

import os
import select
import threading
import time

from telemetry.daemon.forensics.collect import has_exited


class ExitWatcher:
    """watch(rank, fd) / forget(rank) from the stage's thread, exited_at(rank) from any thread.
    The watcher owns the descriptors it is given (the stage gives it duplicates of its own):
    forget() and close() close them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}          # rank -> pidfd (owned)
        self._exited: dict[int, float] = {}     # rank -> time.monotonic() when seen readable
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="telemetry-exit-watch", daemon=True)
        self._thread.start()

    def watch(self, rank: int, fd: int) -> None:
        with self._lock:
            old = self._fds.pop(rank, None)
            if old is not None:
                os.close(old)
            self._fds[rank] = fd
            self._exited.pop(rank, None)
        self._wake()

    def forget(self, rank: int) -> None:
        with self._lock:
            fd = self._fds.pop(rank, None)
            if fd is not None:
                os.close(fd)
        self._wake()

    def exited_at(self, rank: int) -> float | None:
        """time.monotonic() when the rank's process was seen gone, or None (running, or unknown)."""
        with self._lock:
            return self._exited.get(rank)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
        self._wake()
        self._thread.join(5.0)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass                                # already awake (pipe full), or closing

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                poller = select.poll()          # not select(): a daemon may hold descriptors past 1024
                poller.register(self._wake_r, select.POLLIN)
                for rank, fd in self._fds.items():
                    if rank not in self._exited:
                        poller.register(fd, select.POLLIN)
            ready = poller.poll()
            now = time.monotonic()
            with self._lock:
                if self._closed:
                    return
                by_fd = {fd: rank for rank, fd in self._fds.items()}
                for fd, _ in ready:
                    if fd == self._wake_r:
                        try:
                            while os.read(self._wake_r, 4096):
                                pass
                        except (BlockingIOError, OSError):
                            pass
                        continue
                    rank = by_fd.get(fd)
                    # The descriptor polled may have been closed and its number reused since the
                    # poll began: only a fresh look at the one held now says the process is gone.
                    if rank is not None and rank not in self._exited and has_exited(fd):
                        self._exited[rank] = now
