"""`telemetry dashboard` as a subprocess for tests: started on a free port, its URL and access
token read from its first line, its output kept; and small HTTP helpers (JSON, server-sent
events) that send the token."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Dashboard:
    def __init__(self, *args: str, env: dict[str, str] | None = None, ready_timeout_s: float = 120.0) -> None:
        full_env = {k: v for k, v in os.environ.items()
                    if k not in ("TELEMETRY_PUB", "TELEMETRY_RUNTIME_DIR", "TELEMETRY_RUN_NAME")}
        # PYTHONFAULTHANDLER: a dashboard that does not stop is made to print where each thread is.
        full_env.update({"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(env or {})})
        self.proc = subprocess.Popen([sys.executable, "-m", "telemetry", "dashboard", "--port", "0", *args],
                                     cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self.url = ""          # http://127.0.0.1:PORT/
        self.login_url = ""    # the address printed: with #token=... unless there is none (--no-token, --token-file)
        self.token: str | None = None
        ready = threading.Event()

        def pump() -> None:
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(r"serving ((http://127\.0\.0\.1:\d+/)(#token=(\S+))?)", line)
                if m and not self.url:
                    self.login_url, self.url, self.token = m.group(1), m.group(2), m.group(4)
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + ready_timeout_s
        while not ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("dashboard never served:\n" + "".join(self.lines))

    def request(self, path: str, headers: dict[str, str] | None = None) -> urllib.request.Request:
        """A request for `path` with the token (Authorization: Bearer), as curl would send it."""
        auth = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return urllib.request.Request(self.url + path.lstrip("/"), headers={**auth, **(headers or {})})

    def get(self, path: str, headers: dict[str, str] | None = None) -> bytes:
        return urllib.request.urlopen(self.request(path, headers), timeout=60).read()

    def get_json(self, path: str) -> dict:
        return json.loads(self.get(path))

    def stream(self, path: str) -> "EventStream":
        return EventStream(self.request(path))

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, and its exit status. One that has not exited after `timeout_s` (a hang
        detector, generous for a loaded machine) is made to dump its threads' stacks (SIGABRT,
        faulthandler) and the test fails with them and the time it took."""
        if self.proc.poll() is None:
            t0 = time.monotonic()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGABRT)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
                time.sleep(0.5)     # the pump reads the last of its output
                raise AssertionError(f"the dashboard did not exit {time.monotonic() - t0:.0f} s after SIGTERM; "
                                     "its output and stacks:\n" + "".join(self.lines[-200:]))
        return self.proc.returncode


class EventStream:
    """Reads /api/stream in a thread; .events holds (event name, data) as they come."""

    def __init__(self, url: "str | urllib.request.Request") -> None:
        self.resp = urllib.request.urlopen(url, timeout=60)
        self.events: list[tuple[str, dict]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        name = ""
        try:
            for raw in self.resp:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line[len("event: "):]
                elif line.startswith("data: "):
                    self.events.append((name, json.loads(line[len("data: "):])))
        except (OSError, ValueError, AttributeError):
            pass   # closed by close() (http.client's reader then finds its file gone: AttributeError)

    def wait_for(self, pred, timeout_s: float = 30.0, what: str = "") -> tuple[str, dict]:
        deadline = time.monotonic() + timeout_s
        seen = 0
        while time.monotonic() < deadline:
            while seen < len(self.events):
                ev = self.events[seen]
                seen += 1
                if pred(*ev):
                    return ev
            time.sleep(0.05)
        raise AssertionError(f"the stream never sent {what}; last: {self.events[-3:]}")

    def close(self) -> None:
        self.resp.close()


def stop_with_daemon(dash: "Dashboard | None", daemon, sockets: Path) -> None:
    """A browser test's end: the dashboard stopped (it must exit 0, its output said if not), then
    its daemon and the private socket directory, whatever the dashboard's stop said."""
    import shutil

    try:
        if dash is not None:
            assert dash.stop() == 0, "".join(dash.lines)
    finally:
        daemon.cleanup()
        shutil.rmtree(sockets, ignore_errors=True)
