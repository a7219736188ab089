"""telemetry export-prometheus against a real daemon, scraped over HTTP."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from telemetry.client import TelemetryClient
from telemetry.consumers.prometheus import metric_name

ROOT = Path(__file__).resolve().parent.parent


def _scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_gauges_scraped_over_http(daemon):
    proc = subprocess.Popen([sys.executable, "-m", "telemetry", "export-prometheus", "--pub", daemon.pub,
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        first = proc.stdout.readline()
        m = re.search(r"serving (http://127\.0\.0\.1:\d+/metrics)", first)
        assert m, first
        url = m.group(1)
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        client = TelemetryClient(daemon.ingest, rank=0)
        try:
            deadline = time.monotonic() + 20
            step, got = 0, {}
            while time.monotonic() < deadline:
                step += 1
                client.log(step, {"train/loss": 1.25, "perf/step_time": 0.5, "perf/tokens": 100,
                                  "dataset/code/loss": 0.75})
                time.sleep(0.1)
                got = _scrape(url)
                if "telemetry_train_loss" in got and 'telemetry_dataset_loss{dataset="code"}' in got:
                    break
            client.event("checkpoint_saved", {"path": "/x"})
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and 'telemetry_events_total{name="checkpoint_saved"}' not in got:
                time.sleep(0.1)
                got = _scrape(url)
        finally:
            client.close()
        assert got["telemetry_train_loss"] == 1.25
        assert got['telemetry_dataset_loss{dataset="code"}'] == 0.75
        assert got["telemetry_perf_tokens_per_second"] == 200.0  # derived by the daemon: 100 / 0.5 s
        assert got["telemetry_step"] >= 1
        assert got['telemetry_events_total{name="checkpoint_saved"}'] == 1
        assert got["telemetry_last_record_timestamp_seconds"] > 1.6e9
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    assert daemon.proc.poll() is None


def test_names_and_labels():
    assert metric_name("train/loss") == ("telemetry_train_loss", {})
    assert metric_name("gpu/rank3/memory_used_gb") == ("telemetry_gpu_memory_used_gb", {"rank": "3"})
    assert metric_name("dataset/my-set/accuracy") == ("telemetry_dataset_accuracy", {"dataset": "my-set"})
    assert metric_name("system/cpu_percent_core0") == ("telemetry_system_cpu_percent_core0", {})
    assert metric_name("perf/a.b-c") == ("telemetry_perf_a_b_c", {})
