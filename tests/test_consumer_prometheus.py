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
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from telemetry.client import TelemetryClient
import pytest

from other_user import can_act_as_other_user, http_status_as_other_user
from telemetry.consumers.prometheus import Collector, LatestValues, metric_name
from telemetry.shared import catalogue

ROOT = Path(__file__).resolve().parent.parent


def _scrape(url: str, token: str | None, keep_run: bool = False) -> dict[str, float]:
    """The samples of one scrape, with the exporter's token (it asks for one by default); without
    their `run` label unless `keep_run` (every series gets it once the daemon's first daemon record
    names the run)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    text = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            if not keep_run:
                name = re.sub(r'run="[^"]*"', "", name).replace("{,", "{").replace(",}", "}").replace(",,", ",")
                name = name.replace("{}", "")
            out[name] = float(value)
    return out


def test_gauges_scraped_over_http(daemon):
    proc, url, _, token = _start_exporter("--pub", daemon.pub)
    try:
        client = TelemetryClient(daemon.ingest, rank=0)
        try:
            deadline = time.monotonic() + 20
            step, got = 0, {}
            while time.monotonic() < deadline:
                step += 1
                client.log(step, {"train/loss": 1.25, "perf/step_time": 0.5, "perf/tokens": 100,
                                  "dataset/code/loss": 0.75})
                time.sleep(0.1)
                got = _scrape(url, token)
                if "telemetry_train_loss" in got and 'telemetry_dataset_loss{dataset="code"}' in got:
                    break
            client.event("checkpoint_saved", {"path": "/x"})
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and 'telemetry_events_total{name="checkpoint_saved",severity="info"}' not in got:
                time.sleep(0.1)
                got = _scrape(url, token)
        finally:
            client.close()
        assert got["telemetry_train_loss"] == 1.25
        assert got['telemetry_dataset_loss{dataset="code"}'] == 0.75
        assert got["telemetry_perf_tokens_per_second"] == 200.0  # derived by the daemon: 100 / 0.5 s
        assert got["telemetry_training_step"] >= 1
        assert got['telemetry_events_total{name="checkpoint_saved",severity="info"}'] == 1
        assert got["telemetry_last_record_timestamp_seconds"] > 1.6e9
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    assert daemon.proc.poll() is None


def test_names_and_labels():
    assert metric_name("train/loss") == ("telemetry_train_loss", {})
    assert metric_name("gpu/rank3/memory_used_gb") == ("telemetry_gpu_rank_memory_used_bytes", {"rank": "3"})
    assert metric_name("dataset/my-set/accuracy") == ("telemetry_dataset_accuracy", {"dataset": "my-set"})
    assert metric_name("eval/copy/loss") == ("telemetry_eval_loss", {"dataset": "copy"})
    assert metric_name("telemetry/records_in") == ("telemetry_records_in_total", {})   # not telemetry_telemetry_
    assert metric_name("system/cpu_percent_core0") == ("telemetry_system_cpu_percent_core0", {})
    assert metric_name("perf/a.b-c") == ("telemetry_perf_a_b_c", {})


def test_types_and_units_come_from_the_catalogue():
    """Seconds, bytes, watts, hertz, celsius and bytes per second in the names, the values in those
    units; a cumulative count is a counter (_total); a name the catalogue does not know is a gauge
    under its own name. Every built-in metric the catalogue gives a convertible unit gets it."""
    latest = LatestValues()
    latest.consume("metrics", {"t": 1.0, "step": 3, "values": {
        "perf/step_time": 0.5, "perf/step_time_max": 0.75, "perf/straggler_excess_s": 0.125, "memory/num_ooms": 2,
        "memory/allocated_gb": 1.5, "my/acc_gb": 3.0, "perf/mfu_percent": 40.0}})
    latest.consume("gpu", {"t": 1.0, "host": "n0", "gpu": 0, "values": {
        "gpu/power_w": 300.0, "gpu/sm_clock_mhz": 1500.0, "gpu/temperature_c": 61.0, "gpu/pcie_rx_mb_s": 2.5,
        "gpu/xid_errors": 1, "gpu/util_percent": 90.0}})
    latest.consume("daemon", {"t": 1.0, "values": {"telemetry/records_in": 10, "telemetry/uptime_s": 4.5,
                                                   "goodput/productive_s": 80.0, "goodput/fraction": 0.8}})
    text = _exposition(latest)
    for line in ["telemetry_perf_step_time_seconds 0.5", "telemetry_perf_step_time_max_seconds 0.75",
                 "telemetry_perf_straggler_excess_seconds 0.125", "telemetry_memory_num_ooms_total 2.0",
                 "telemetry_memory_allocated_bytes 1.5e+09", "telemetry_my_acc_gb 3.0", "telemetry_perf_mfu_percent 40.0",
                 'telemetry_gpu_power_watts{gpu="0",host="n0"} 300.0',
                 'telemetry_gpu_sm_clock_hertz{gpu="0",host="n0"} 1.5e+09',
                 'telemetry_gpu_temperature_celsius{gpu="0",host="n0"} 61.0',
                 'telemetry_gpu_pcie_rx_bytes_per_second{gpu="0",host="n0"} 2.5e+06',
                 'telemetry_gpu_xid_errors_total{gpu="0",host="n0"} 1.0',
                 'telemetry_gpu_util_percent{gpu="0",host="n0"} 90.0',
                 "telemetry_records_in_total 10.0", "telemetry_uptime_seconds 4.5",
                 "telemetry_goodput_productive_seconds 80.0", "telemetry_goodput_fraction 0.8",
                 "# TYPE telemetry_records_in_total counter", "# TYPE telemetry_perf_step_time_seconds gauge",
                 "# TYPE telemetry_my_acc_gb gauge"]:
        assert line in text, line
    samples = [line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert not [n for n in samples if n.endswith(("_gb", "_time", "_s", "_w", "_mhz")) and n != "telemetry_my_acc_gb"]
    for m in catalogue.CATALOGUE:
        if "*" in m.name or m.unit not in ("s", "GB", "MB/s", "W", "°C", "MHz"):
            continue
        name, _ = metric_name(m.name)
        if m.cumulative:              # a counter's unit comes before its _total
            assert name.endswith("_total"), (m.name, name)
            name = name.removesuffix("_total")
        assert name.endswith(("_seconds", "_bytes", "_bytes_per_second", "_watts", "_celsius", "_hertz")), (m.name, name)
        assert not name.endswith(("_s_seconds", "_gb_bytes", "_w_watts", "_mhz_hertz", "_c_celsius")), name


def test_a_counter_never_shares_its_samples_name_with_a_gauge():
    """A user's gauge named like a counter's _total sample is renamed (a hash suffix), not merged."""
    latest = LatestValues()
    latest.consume("daemon", {"t": 1.0, "values": {"telemetry/records_in": 10}})
    latest.consume("metrics", {"t": 1.0, "step": 1, "values": {"records_in_total": 7.0}})
    text = _exposition(latest)
    assert "telemetry_records_in_total 10.0" in text
    assert "telemetry_records_in_total 7.0" not in text and latest.num_names_renamed == 1


def test_a_total_never_carries_an_empty_rank_label():
    """The host total and the per-rank values are different families, each with one label set."""
    latest = LatestValues()
    latest.consume("system", {"t": 1.0, "host": "n0", "values": {"system/rss_gb": 12.0, "system/rank0/rss_gb": 5.0,
                                                                 "system/rank1/rss_gb": 7.0}})
    latest.consume("metrics", {"t": 1.0, "step": 3, "values": {"train/loss": 2.0}})
    latest.consume("metrics", {"t": 1.0, "step": 3, "rank": 1, "values": {"train/loss": 2.5}})
    text = _exposition(latest)
    assert 'telemetry_system_rss_bytes{host="n0"} 1.2e+10' in text
    assert 'telemetry_system_rank_rss_bytes{host="n0",rank="1"} 7e+09' in text
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


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus is not installed (apt-get install prometheus; launch/setup.sh --dev does it)")
def test_a_real_prometheus_scrapes_the_exporter_during_a_run(daemon, tmp_path):
    """With a bearer token, as Prometheus's scrape config gives it (authorization: credentials_file)."""
    token_file = _token_file(tmp_path)
    exporter = subprocess.Popen([sys.executable, "-m", "telemetry", "export-prometheus", "--pub", daemon.pub,
                                 "--port", "0", "--token-file", str(token_file)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    prom = None
    client = TelemetryClient(daemon.ingest, rank=0)
    try:
        m = re.search(r"serving http://127\.0\.0\.1:(\d+)/metrics", exporter.stdout.readline())
        assert m
        threading.Thread(target=lambda: [None for _ in exporter.stdout], daemon=True).start()
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: training\n    static_configs: [{{targets: ['127.0.0.1:{m.group(1)}']}}]\n"
            f"    authorization: {{credentials_file: '{token_file}'}}\n")
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
        while time.monotonic() < deadline and not _prom_query(base, "telemetry_records_in_total"):
            time.sleep(0.5)
        assert float(_prom_query(base, "telemetry_records_in_total")[0]["value"][1]) >= 1
        # Units as Prometheus names them: the step time in seconds (the client sent 0.5 s).
        (step_time,) = _prom_query(base, "telemetry_perf_step_time_seconds")
        assert float(step_time["value"][1]) == 0.5
    finally:
        client.close()
        if prom is not None:
            prom.terminate()
            prom.wait(30)
        exporter.send_signal(signal.SIGTERM)
        assert exporter.wait(10) == 0


# -- names: the exposition is valid whatever a metric is called ---------------------------------
ODD_NAMES = ["step", "train/step", "a-b.c", "a_b_c", "a.b.c", "1abc", "x" * 300, "y" * 300 + "/z", "é/ü", "损失",
             "train/loss", "train_loss", "events", "events_total", "last_record_timestamp_seconds",
             "exporter/values_dropped_total", "exporter/series", "rank/train/loss", "dataset_loss", "", "/",
             "gpu/rank3/rank4/x", "dataset/\ud800bad/loss", "dataset/" + "d" * 400 + "/loss", "x:y", "telemetry/step",
             "training/step"]


def _feed_odd_names(latest: LatestValues) -> None:
    latest.consume("metrics", {"t": 1.0, "step": 7, "values": {n: float(i) for i, n in enumerate(ODD_NAMES)}})
    latest.consume("metrics", {"t": 1.0, "step": 7, "rank": 1, "values": {"train/loss": 0.5, "gpu/rank3/x": 1.0}})
    latest.consume("gpu", {"t": 1.0, "host": "h\ud800", "gpu": 0, "values": {"gpu/util_percent": 50, "step": 1.0}})
    latest.consume("system", {"t": 1.0, "values": {"system/rss_gb": 1.0}})       # no host: no empty label
    latest.consume("metrics", {"t": 1.0, "step": 7, "values": {"system/rss_gb": 2.0}})
    latest.consume("event", {"t": 1.0, "name": "weird\n\"name\ud800"})


def _samples(text: str) -> list[tuple[str, tuple]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, tuple(sorted(s.labels.items()))) for fam in text_string_to_metric_families(text)
            for s in fam.samples]


def test_every_name_gets_its_own_valid_series():
    """A user metric named `training/step` (the exporter's own telemetry_training_step), names that
    map to one Prometheus name, names too long or not ASCII, one name in a rank's record and a GPU
    record's (`step`), a rank's value under a poller's name (system/rss_gb): each is a series of
    its own, the first to come keeps the plain name, the others a suffix from their own hash,
    counted (a rank's value under a poller's name always)."""
    latest = LatestValues()
    _feed_odd_names(latest)
    text = _exposition(latest)
    samples = _samples(text)
    assert len(samples) == len(set(samples)), "a sample twice"
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert len(helps) == len(set(helps)), "a family twice"
    own = {"telemetry_training_step", "telemetry_training_last_progress_time_seconds",
           "telemetry_last_record_timestamp_seconds", "telemetry_events_total",
           "telemetry_exporter_series", "telemetry_exporter_memory_budget_bytes",
           "telemetry_exporter_values_dropped_total", "telemetry_exporter_names_renamed_total"}
    assert {n for n, _ in samples} >= own and "telemetry_training_step 7.0" in text   # the exporter's own step is the step
    # Every name its series: the odd names, the per-rank record's two, the GPU record's two, and
    # system/rss_gb twice (a system record's, and a rank's value of that name: never one family).
    assert len(samples) - len(own) == len(ODD_NAMES) + 2 + 2 + 2
    assert "telemetry_system_rss_bytes 1e+09" in text and "telemetry_training_step 7.0" in text
    assert len([n for n, _ in samples if n.startswith("telemetry_system_rss_bytes_")]) == 1
    assert len([n for n, _ in samples if n.startswith("telemetry_training_step_")]) == 1
    assert all(len(name) <= 200 for name, _ in samples)
    renamed = {n for n, _ in samples if n.startswith(("telemetry_step_", "telemetry_a_b_c_", "telemetry_train_loss_"))}
    assert len(renamed) == 5, renamed   # the GPU record's step, telemetry/step, a_b_c and a.b.c after a-b.c, train_loss
    # ... and events, events_total, last_record_timestamp_seconds, the two exporter/ names, the
    # per-rank train/loss after a user's rank/train/loss, dataset/<d>/loss after dataset_loss,
    # training/step, the rank's system/rss_gb.
    assert "telemetry_exporter_names_renamed_total 14.0" in text
    # The same names in the same order: the same exposition (the suffixes come from the names).
    again = LatestValues()
    _feed_odd_names(again)
    assert _exposition(again) == text
    # The per-rank record's own rank stays the rank label; its name's rank3 stays in the name.
    assert ("telemetry_rank_gpu_rank3_x", (("rank", "1"),)) in samples


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (apt-get install prometheus)")
def test_promtool_accepts_the_exposition():
    latest = LatestValues()
    _feed_odd_names(latest)
    text = _exposition(latest)
    out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    # Exit 3 is lint only (style advice such as "abbreviated units" for a name like a_b_c); 1 is invalid.
    assert out.returncode in (0, 3) and "error" not in out.stdout + out.stderr, out.stdout + out.stderr


# -- memory: the series kept are bounded, what is shed is counted --------------------------------
def test_series_beyond_the_cap_are_dropped_and_counted():
    latest = LatestValues(max_series=100)
    said = []
    latest.on_first_drop = lambda: said.append(1)
    for r in range(10):
        latest.consume("metrics", {"t": 1.0, "step": r, "values": {f"user/m{r}_{i}": 1.0 for i in range(100)}})
    latest.consume("event", {"t": 1.0, "name": "checkpoint_saved"})
    latest.consume("metrics", {"t": 2.0, "step": 11, "values": {"user/m0_5": 9.0}})   # a kept one still moves
    text = _exposition(latest)
    samples = _samples(text)
    user = [n for n, _ in samples if n.startswith("telemetry_user_")]
    assert len(user) == 100 and set(user) == {f"telemetry_user_m0_{i}" for i in range(100)}   # the first kept
    assert "telemetry_user_m0_5 9.0" in text
    assert "telemetry_exporter_values_dropped_total 901.0" in text   # 900 values and the event
    assert "telemetry_exporter_series 100.0" in text
    assert said == [1]
    # And in bytes: a budget that holds a few series, whatever the count allows.
    small = LatestValues(max_series=10_000, max_bytes=10_000)
    small.consume("metrics", {"t": 1.0, "step": 1, "values": {f"m{i}": 1.0 for i in range(1000)}})
    assert 0 < small.num_series < 30 and small.num_bytes <= 10_000
    assert small.num_values_dropped == 1000 - small.num_series


def _start_exporter(*args: str) -> tuple[subprocess.Popen, str, list[str], str | None]:
    """The exporter on a free port: (process, its /metrics URL, its output, the random token it
    printed or None: --token-file's is not printed, --no-token has none)."""
    proc = subprocess.Popen([sys.executable, "-m", "telemetry", "export-prometheus", "--port", "0", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    first = proc.stdout.readline()
    m = re.search(r"serving (http://127\.0\.0\.1:\d+/metrics)", first)
    if not m:
        proc.kill()
        raise AssertionError(first + proc.stdout.read())
    printed = re.search(r"Authorization: Bearer ([\w-]+)", first)
    lines = [first]
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, m.group(1), lines, printed.group(1) if printed else None


def test_the_exporter_process_keeps_its_cap_and_says_so(daemon):
    proc, url, lines, token = _start_exporter("--pub", daemon.pub, "--max-series", "50")
    client = TelemetryClient(daemon.ingest, rank=0)
    try:
        deadline = time.monotonic() + 60
        got: dict = {}
        step = 0
        while time.monotonic() < deadline:
            step += 1
            client.log(step, {f"user/m{i}": 1.0 for i in range(200)})
            time.sleep(0.2)
            got = _scrape(url, token)
            if got.get("telemetry_exporter_values_dropped_total", 0) > 0:
                break
        assert got.get("telemetry_exporter_values_dropped_total", 0) > 0, got
        assert got["telemetry_exporter_series"] == 50
        assert len([k for k in got if k.startswith("telemetry_user_")]) <= 50
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    text = "".join(lines)
    assert text.count("values of new series are dropped") == 1 and "Traceback" not in text, text


def test_the_exporter_process_stays_under_its_budget_with_300k_names():
    """Published as the daemon does (topic, JSON line) from a PUB socket here: the process stays
    under the default 256 MB and a scrape holds the first 10,000 series (the old exporter kept
    every name: ~1 KB each, and a scrape built all of them)."""
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    proc, url, lines, token = _start_exporter("--pub", f"tcp://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "telemetry_first" not in _scrape(url, token):
            pub.send_multipart([b"metrics", json.dumps({"kind": "metrics", "t": 1.0, "step": 0,
                                                        "values": {"first": 1.0}}).encode()])   # the slow joiner
            time.sleep(0.2)
        for r in range(300):
            values = {f"user/r{r}/metric_{i}": float(i) for i in range(1000)}
            pub.send_multipart([b"metrics", json.dumps({"kind": "metrics", "t": 2.0, "step": r + 1,
                                                        "values": values}).encode()])
        deadline = time.monotonic() + 120
        got: dict = {}
        while time.monotonic() < deadline:   # every value taken: kept + dropped add up
            got = _scrape(url, token)
            taken = got.get("telemetry_exporter_values_dropped_total", 0) + got.get("telemetry_exporter_series", 0)
            if taken >= 300_000:
                break
            time.sleep(0.5)
        with open(f"/proc/{proc.pid}/status") as f:
            peak = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
        assert got["telemetry_exporter_series"] == 10_000, got.get("telemetry_exporter_series")
        assert len([k for k in got if k.startswith("telemetry_user_")]) == 10_000 - 1
        assert peak < 256, f"peak RSS {peak:.0f} MB"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        pub.close(0)
        ctx.term()


# -- access --------------------------------------------------------------------------------------
def _token_file(tmp_path: Path, token: str = "s3cret-token-for-the-test") -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def _get(url: str, token: str | None = None, host: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if host is not None:
        headers["Host"] = host
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30).status
    except urllib.error.HTTPError as exc:
        return exc.code




def test_a_token_file_guards_metrics_from_other_local_users(daemon, tmp_path):
    proc, url, lines, printed = _start_exporter("--pub", daemon.pub, "--token-file", str(_token_file(tmp_path)))
    try:
        assert printed is None and "s3cret" not in lines[0]      # a token of your own is not printed
        assert _get(url) == 401
        assert _get(url, "not-the-token-at-all") == 401
        assert _get(url, "s3cret-token-for-the-test") == 200
        assert _get(url.replace("/metrics", "/other"), "s3cret-token-for-the-test") == 404
        if can_act_as_other_user():     # another local user, on loopback, without the token
            assert http_status_as_other_user(url) == "401"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert "bearer token from" in lines[0]


def test_a_token_by_default_and_none_only_when_asked(daemon):
    """Loopback TCP is open to every local user: the exporter asks for a token unless told
    --no-token, as the dashboard does; the random one is printed once, for the scraper."""
    proc, url, lines, token = _start_exporter("--pub", daemon.pub)
    try:
        assert token and len(token) >= 16, lines[0]
        wrong = token[:-1] + ("y" if token.endswith("x") else "x")       # one character off, never the token
        assert _get(url) == 401 and _get(url, wrong) == 401
        assert _get(url, token) == 200
        if can_act_as_other_user():
            assert http_status_as_other_user(url) == "401"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    proc, url, lines, token = _start_exporter("--pub", daemon.pub, "--no-token")
    try:
        assert token is None and "no token: any local user can scrape" in lines[0]
        assert _get(url) == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.mark.parametrize("token_args", [[], ["--no-token"]])
def test_a_page_reaching_the_port_by_another_name_is_refused(daemon, token_args):
    """DNS rebinding: a page on 127.0.0.1.nip.io (or any name pointed at 127.0.0.1) reaches the
    port with its own name in Host. Only a loopback address or localhost is served, token or not."""
    from testkit.hosts import EVIL_HOSTS, GOOD_HOSTS

    proc, url, _, token = _start_exporter("--pub", daemon.pub, *token_args)
    port = url.split(":")[2].split("/")[0]
    try:
        for host in EVIL_HOSTS:
            assert _get(url, token, host=host.replace("PORT", port)) == 403, host
        for host in GOOD_HOSTS:
            assert _get(url, token, host=host.replace("PORT", port)) == 200, host
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def _refused(args: list[str], *words: str) -> None:
    out = subprocess.run([sys.executable, "-m", "telemetry", "export-prometheus", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("telemetry export-prometheus: "), out.stderr
    for w in words:
        assert w in out.stderr, out.stderr


def test_beyond_loopback_needs_allow_remote():
    _refused(["--addr", "0.0.0.0", "--pub", "ipc:///nonexistent/pub.sock"], "beyond loopback", "--allow-remote")


@pytest.mark.parametrize("args, words", [
    (["--port", "99999"], ["--port", "<= 65535", "99999"]),
    (["--port", "-1"], ["--port", ">= 0"]),
    (["--port", "abc"], ["--port", "'abc'"]),
    (["--memory-mb", "0"], ["--memory-mb", ">= 64"]),
    (["--memory-mb", "-1"], ["--memory-mb", ">= 64"]),
    (["--memory-mb", "nan"], ["--memory-mb", "'nan'"]),
    (["--max-series", "0"], ["--max-series", ">= 1"]),
    (["--token-file", "/nonexistent/token"], ["--token-file /nonexistent/token"]),
    (["--no-token", "--token-file", "/etc/hostname"], ["give one of them"]),
])
def test_bad_flags_are_one_line_and_exit_2(args, words):
    _refused([*args, "--pub", "ipc:///nonexistent/pub.sock"], *words)


def test_idle_connections_hold_no_thread_for_good_and_are_bounded_in_number():
    """Not in issue 26's list, its memory class: every idle connection (another local user's,
    on the loopback port) held a thread of the exporter forever (ThreadingHTTPServer has no
    limit and no timeout). Now at most max_connections at once (beyond: closed, counted) and an
    idle one lets go after the handler's timeout. The dashboard's server has the same mixin."""
    import socket
    import threading
    import urllib.request

    from prometheus_client import CollectorRegistry

    from telemetry.consumers import httpaccess
    from telemetry.consumers.dashboard.server import DashboardServer, Handler as DashHandler
    from telemetry.consumers.prometheus import MetricsServer, _Handler

    assert issubclass(DashboardServer, httpaccess.BoundedConnections)
    assert _Handler.timeout == DashHandler.timeout == httpaccess.HTTP_TIMEOUT_S
    server = MetricsServer(("127.0.0.1", 0), CollectorRegistry(auto_describe=False))
    server.max_connections = 4
    server.RequestHandlerClass = type("ShortTimeout", (_Handler,), {"timeout": 2})
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    port = server.server_address[1]
    idle = []
    try:
        before = threading.active_count()
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")          # never finishes its request
            idle.append(s)
        deadline = time.monotonic() + 120                      # a hang detector
        while server.num_refused < 6:
            assert time.monotonic() < deadline, server.num_refused
            time.sleep(0.1)
        assert threading.active_count() - before <= 4
        # The idle ones time out and let go; then a scrape is served.
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "no slot came free"
                time.sleep(0.5)
    finally:
        for s in idle:
            s.close()
        server.shutdown()
        server.server_close()


def test_runs_are_labelled_events_counted_once_and_a_ranks_series_go_with_it():
    """Issue 31 item 4: a `run` label (two runs one after the other are two series, the old one let
    go), an event every rank sends counted once, a rank's own series removed at its bye."""
    latest = LatestValues()
    for r in (0, 1):
        latest.consume("hello", {"t": 1.0, "rank": r, "info": {"rank": r, "run_name": "run-a"}})
    latest.consume("metrics", {"t": 1.0, "step": 3, "values": {"train/loss": 2.0}})
    for r in (0, 1):
        latest.consume("metrics", {"t": 1.0, "step": 3, "rank": r, "values": {"train/loss": 2.0 + r}})
        latest.consume("gpu", {"t": 1.0, "host": "n0", "gpu": 0, "values": {f"gpu/rank{r}/memory_used_gb": 1.0}})
        for step in (100, 200):                       # every rank says the checkpoint was saved
            latest.consume("event", {"t": 1.0, "rank": r, "name": "checkpoint_saved", "data": {"step": step}})
    latest.consume("event", {"t": 1.0, "rank": 0, "name": "note", "data": {"text": "no step"}})
    latest.consume("event", {"t": 1.0, "rank": 1, "name": "note", "data": {"text": "no step"}})
    text = _exposition(latest)
    assert 'telemetry_train_loss{run="run-a"} 2.0' in text
    assert 'telemetry_rank_train_loss{rank="1",run="run-a"} 3.0' in text
    assert 'telemetry_events_total{name="checkpoint_saved",run="run-a",severity="info"} 2.0' in text    # 2 checkpoints, not 4
    assert 'telemetry_events_total{name="note",run="run-a",severity="info"} 2.0' in text                 # no step: each one
    latest.consume("bye", {"t": 2.0, "rank": 1, "stats": {}})
    text = _exposition(latest)
    assert 'rank="1"' not in text and 'telemetry_rank_train_loss{rank="0",run="run-a"} 2.0' in text
    assert 'telemetry_gpu_rank_memory_used_bytes{gpu="0",host="n0",rank="0",run="run-a"} 1e+09' in text
    # The next run on the same endpoint: its own series; the first run's are let go.
    latest.consume("hello", {"t": 3.0, "rank": 0, "info": {"rank": 0, "run_name": "run-b"}})
    latest.consume("metrics", {"t": 3.0, "step": 1, "values": {"train/loss": 5.0}})
    text = _exposition(latest)
    assert 'telemetry_train_loss{run="run-b"} 5.0' in text and "run-a" not in text
    assert 'telemetry_training_step{run="run-b"} 1.0' in text and latest.num_series == 1    # the budget counts run-b's alone


def test_every_series_carries_the_run_the_daemon_names_without_a_hello_naming_it(tmp_path):
    """A daemon started with --run-name and plain clients (their hellos name no run): every series
    the exporter serves carries run="<the daemon's run>", the ones kept before the first daemon
    record said it included."""
    from daemon_util import start_daemon

    d = start_daemon(tmp_path, world_size=2, per_rank=True, run_name="the-run",
                     config={"daemon_record_interval_s": 0.3, "pollers": {"nvml_enabled": False,
                                                                           "host_interval_s": 0.3}})
    proc, url, _, token = _start_exporter("--pub", d.pub)
    clients = [TelemetryClient(d.ingest, rank=r) for r in (0, 1)]
    try:
        deadline = time.monotonic() + 60
        step, got = 0, {}
        while time.monotonic() < deadline:
            step += 1
            for r, c in enumerate(clients):
                c.log(step, {"train/loss": 2.0, "memory/allocated_gb": 1.0 + r})
            time.sleep(0.1)
            got = _scrape(url, token, keep_run=True)
            if ('telemetry_train_loss{run="the-run"}' in got and 'telemetry_rank_train_loss{rank="1",run="the-run"}'
                    in got and any(k.startswith("telemetry_records_in_total") for k in got)
                    and any(k.startswith("telemetry_system_") for k in got)):
                break
        client_hellos = [r for r in d.read_jsonl("hello")]
    finally:
        for c in clients:
            c.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        d.drain()
    assert client_hellos and not any("run_name" in h["info"] for h in client_hellos)
    assert got['telemetry_train_loss{run="the-run"}'] == 2.0
    assert got['telemetry_rank_memory_allocated_bytes{rank="1",run="the-run"}'] == 2e9
    run_series = [k for k in got if not k.startswith("telemetry_exporter_")]     # the exporter's own are not the run's
    assert 'telemetry_training_step{run="the-run"}' in got
    assert run_series and all('run="the-run"' in k for k in run_series), [k for k in run_series if "run=" not in k]


def test_a_daemon_record_names_the_run_and_labels_what_came_before():
    latest = LatestValues()
    latest.consume("metrics", {"t": 1.0, "step": 1, "values": {"train/loss": 2.0}})
    latest.consume("metrics", {"t": 1.0, "step": 1, "rank": 0, "values": {"train/loss": 2.5}})
    assert "telemetry_train_loss 2.0" in _exposition(latest)
    latest.consume("daemon", {"t": 2.0, "run": "r1", "values": {"telemetry/records_in": 3}})
    # A rank's hello naming another run does not take over what the daemon said.
    latest.consume("hello", {"t": 2.5, "rank": 0, "info": {"rank": 0, "run_name": "other"}})
    text = _exposition(latest)
    for line in ('telemetry_train_loss{run="r1"} 2.0', 'telemetry_rank_train_loss{rank="0",run="r1"} 2.5',
                 'telemetry_records_in_total{run="r1"} 3.0'):
        assert line in text, line
    assert "telemetry_train_loss 2.0" not in text.splitlines() and 'run="other"' not in text
    # A new daemon on the endpoint (another run): its own series; the first run's let go.
    latest.consume("daemon", {"t": 3.0, "run": "r2", "values": {"telemetry/records_in": 1}})
    text = _exposition(latest)
    assert 'telemetry_records_in_total{run="r2"} 1.0' in text and 'run="r1"' not in text


# Prometheus's own translation of an OTLP metric name and unit (prometheus/otlptranslator, with
# suffixes): dots become _, the unit's word is appended unless the name has it, a counter ends in
# _total; a UCUM annotation ({token}) is no unit.
_PROM_UNIT = {"s": "seconds", "By": "bytes", "W": "watts", "Cel": "celsius", "Hz": "hertz", "%": "percent"}


def _prometheus_translation(name: str, unit: str, counter: bool) -> str:
    tokens = name.replace(".", "_").split("_")
    main, _, per = re.sub(r"\{[^}]*\}", "", unit).partition("/")
    word = _PROM_UNIT.get(main, "")
    if word and word not in tokens:
        tokens.append(word)
    if per:
        per_word = {"s": "second"}[per]
        if per_word not in tokens:
            tokens += ["per", per_word]
    if counter:
        tokens.append("total")
    return "_".join(tokens)


def test_the_exporter_names_and_units_as_prometheus_names_the_otlp_export():
    """The exporter and the OTLP sink name things the same way, from the catalogue: for every
    built-in metric, the exporter's name is what Prometheus makes of the OTLP sink's name and unit
    (behind the exporter's telemetry_ prefix, which the daemon's own telemetry.* already has)."""
    for m in catalogue.CATALOGUE:
        if "*" in m.name:
            continue
        o = catalogue.otel(m.name)
        expected = _prometheus_translation(o.name, o.unit, o.cumulative)
        if not m.name.startswith("telemetry/"):
            expected = "telemetry_" + expected
        assert metric_name(m.name)[0] == expected, m.name


def test_labelling_kept_series_with_the_run_stays_in_the_byte_budget():
    latest = LatestValues(max_series=1000, max_bytes=4000)
    latest.consume("metrics", {"t": 1.0, "step": 1, "values": {f"m{i}": 1.0 for i in range(20)}})
    kept = latest.num_series
    assert 0 < kept < 20 and latest.max_bytes - latest.num_bytes < 300      # full, or nearly
    latest.consume("daemon", {"t": 2.0, "run": "r" * 200, "values": {}})
    assert latest.num_bytes <= latest.max_bytes and latest.num_series < kept
    assert latest.num_values_dropped == 20 - kept + (kept - latest.num_series)
    assert all('run="' in line for line in _exposition(latest).splitlines()
               if line.startswith("telemetry_m"))


def test_a_stall_shows_the_step_and_its_time_stop_while_the_pollers_talk():
    """The run's progress as the OTLP sink names it (training.step, training.last_progress_time,
    in a backend's Prometheus translation): its time is the step's last advance, so a stalled run
    shows though the host poller and the daemon's own records keep coming. Before, only
    telemetry_last_record_timestamp_seconds, moved by every record ("a stalled run stops moving
    it": it did not; an outside tester's find), and the step under another name than OTLP's."""
    from telemetry.consumers import prometheus
    from telemetry.daemon.sinks import otlp

    latest = LatestValues()
    latest.consume("daemon", {"t": 5.0, "run": "r", "values": {"telemetry/records_in": 1}})
    latest.consume("metrics", {"t": 10.0, "step": 3, "values": {"train/loss": 1.0}})
    latest.consume("metrics", {"t": 12.0, "step": 2, "values": {"train/loss": 1.0}})      # late: no progress
    latest.consume("metrics", {"t": 40.0, "step": 9, "rank": 0, "values": {"train/loss": 1.0}})   # a rank's own
    latest.consume("system", {"t": 50.0, "host": "h", "values": {"system/cpu_percent": 5.0}})
    latest.consume("daemon", {"t": 60.0, "run": "r", "values": {"telemetry/records_in": 9}})
    latest.consume("event", {"t": 61.0, "name": "nonfinite", "data": {"step": 3, "severity": "error"}})
    for i in range(3):                  # free text: one label value, not three series
        latest.consume("event", {"t": 62.0, "name": "note", "data": {"severity": f"sev {i}"}})
    latest.consume("event", {"t": 63.0, "name": "nonfinite", "data": {"step": 4, "severity": "ERROR"}})
    text = _exposition(latest)
    assert 'telemetry_training_step{run="r"} 3.0' in text
    assert 'telemetry_training_last_progress_time_seconds{run="r"} 10.0' in text
    assert 'telemetry_last_record_timestamp_seconds{run="r"} 60.0' in text
    assert 'telemetry_events_total{name="nonfinite",run="r",severity="error"} 2.0' in text   # OTLP's labels
    assert 'telemetry_events_total{name="note",run="r",severity="other"} 3.0' in text
    for name, unit, own in ((otlp.STEP, "{step}", prometheus.STEP), (otlp.LAST_PROGRESS, "s", prometheus.LAST_PROGRESS)):
        assert prometheus.PREFIX + otlp.backend_names(name, unit, False)[1] == own
