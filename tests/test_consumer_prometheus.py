"""telemetry export-prometheus against a real daemon, scraped over HTTP."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from telemetry.client import TelemetryClient
import pytest

from telemetry.consumers.prometheus import Collector, LatestValues, metric_name

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
    assert metric_name("gpu/rank3/memory_used_gb") == ("telemetry_gpu_rank_memory_used_gb", {"rank": "3"})
    assert metric_name("dataset/my-set/accuracy") == ("telemetry_dataset_accuracy", {"dataset": "my-set"})
    assert metric_name("eval/copy/loss") == ("telemetry_eval_loss", {"dataset": "copy"})
    assert metric_name("telemetry/records_in") == ("telemetry_records_in", {})   # not telemetry_telemetry_
    assert metric_name("system/cpu_percent_core0") == ("telemetry_system_cpu_percent_core0", {})
    assert metric_name("perf/a.b-c") == ("telemetry_perf_a_b_c", {})


def test_a_total_never_carries_an_empty_rank_label():
    """The host total and the per-rank values are different families, each with one label set."""
    latest = LatestValues()
    latest.consume("system", {"t": 1.0, "host": "n0", "values": {"system/rss_gb": 12.0, "system/rank0/rss_gb": 5.0,
                                                                 "system/rank1/rss_gb": 7.0}})
    latest.consume("metrics", {"t": 1.0, "step": 3, "values": {"train/loss": 2.0}})
    latest.consume("metrics", {"t": 1.0, "step": 3, "rank": 1, "values": {"train/loss": 2.5}})
    text = _exposition(latest)
    assert 'telemetry_system_rss_gb{host="n0"} 12.0' in text
    assert 'telemetry_system_rank_rss_gb{host="n0",rank="1"} 7.0' in text
    assert "telemetry_train_loss 2.0" in text and 'telemetry_rank_train_loss{rank="1"} 2.5' in text
    assert 'rank=""' not in text and "telemetry_telemetry_" not in text


def _exposition(latest: LatestValues) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(latest))
    return generate_latest(registry).decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prom_query(base: str, query: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    body = json.loads(urllib.request.urlopen(url, timeout=10).read())
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus is not installed (apt-get install prometheus; launch/setup.sh --dev does it)")
def test_a_real_prometheus_scrapes_the_exporter_during_a_run(daemon, tmp_path):
    exporter = subprocess.Popen([sys.executable, "-m", "telemetry", "export-prometheus", "--pub", daemon.pub,
                                 "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    prom = None
    client = TelemetryClient(daemon.ingest, rank=0)
    try:
        m = re.search(r"serving http://127\.0\.0\.1:(\d+)/metrics", exporter.stdout.readline())
        assert m
        threading.Thread(target=lambda: [None for _ in exporter.stdout], daemon=True).start()
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: training\n    static_configs: [{{targets: ['127.0.0.1:{m.group(1)}']}}]\n")
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
        deadline = time.monotonic() + 90
        result: list = []
        step = 0
        while time.monotonic() < deadline:
            step += 1
            client.log(step, {"train/loss": 1.5, "perf/step_time": 0.5, "perf/tokens": 100,
                              "eval/copy/loss": 0.625})
            time.sleep(0.5)
            try:
                result = _prom_query(base, "telemetry_train_loss")
                evals = _prom_query(base, 'telemetry_eval_loss{dataset="copy"}')
            except OSError:
                continue   # still starting
            if result and evals:
                break
        assert result, "Prometheus never had telemetry_train_loss:\n" + (tmp_path / "prometheus.log").read_text()[-2000:]
        (series,) = result
        assert float(series["value"][1]) == 1.5 and series["metric"]["job"] == "training"
        (ev,) = evals
        assert float(ev["value"][1]) == 0.625
        assert _prom_query(base, '{__name__=~"telemetry_telemetry_.*"}') == []
        deadline = time.monotonic() + 30   # the daemon's own counters come every daemon_record_interval_s
        while time.monotonic() < deadline and not _prom_query(base, "telemetry_records_in"):
            time.sleep(0.5)
        assert float(_prom_query(base, "telemetry_records_in")[0]["value"][1]) >= 1
    finally:
        client.close()
        if prom is not None:
            prom.terminate()
            prom.wait(30)
        exporter.send_signal(signal.SIGTERM)
        assert exporter.wait(10) == 0
