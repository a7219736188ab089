"""A real VictoriaMetrics for the OTLP tests and benchmarks: the single-node binary on a free
loopback port with its OTLP/HTTP receiver (/opentelemetry/v1/metrics, VictoriaMetrics 1.92 and
later; `launch/setup.sh --dev` installs Debian 13's build) and
-opentelemetry.usePrometheusNaming, as a cluster that queries in PromQL runs it; read back through
its Prometheus API."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

VM_BIN = shutil.which("victoria-metrics")
OTLP_FLAG = "-opentelemetry.usePrometheusNaming"


def skip_reason() -> str | None:
    """Why VictoriaMetrics cannot be run here, or None."""
    if VM_BIN is None:
        return "victoria-metrics is not installed (launch/setup.sh --dev installs Debian 13's as root)"
    out = subprocess.run([VM_BIN, "-help"], capture_output=True, text=True, timeout=30)
    if OTLP_FLAG not in out.stdout + out.stderr:
        return (f"{VM_BIN} has no OTLP receiver (VictoriaMetrics 1.92 and later; Debian 12's package is 1.79: "
                "launch/setup.sh --dev installs Debian 13's)")
    return None


class VictoriaMetrics:
    """A single-node VictoriaMetrics on a free loopback port, its storage under `data`."""

    def __init__(self, data: Path) -> None:
        self.log_path = data.parent / "victoria-metrics.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [VM_BIN, f"-storageDataPath={data}", "-httpListenAddr=127.0.0.1:0", OTLP_FLAG,
             # Every query reads the raw data: no response cache, nothing held back as too recent.
             "-search.disableCache", "-search.latencyOffset=1ms"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        self.url = None
        while self.url is None:
            m = re.search(r"started server at (http://127\.0\.0\.1:\d+)/", self.log_path.read_text())
            if m:
                self.url = m.group(1)
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"victoria-metrics did not start:\n{self.log_path.read_text()[-3000:]}")
            else:
                time.sleep(0.1)
        self.otlp_endpoint = self.url + "/opentelemetry/v1/metrics"

    def flush(self) -> None:
        """Make what was ingested searchable."""
        urllib.request.urlopen(self.url + "/internal/force_flush", timeout=30).read()

    def get(self, path: str, **params) -> dict:
        """A Prometheus API answer's data, what was ingested made searchable first."""
        self.flush()
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> dict[tuple, float]:
        """An instant query: {labels (without __name__) as sorted pairs: value}."""
        return {tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__")): float(s["value"][1])
                for s in self.get("/api/v1/query", query=promql)["result"]}

    def series(self, match: str) -> list[dict[str, str]]:
        return self.get("/api/v1/series", **{"match[]": match, "start": "0"})

    def export(self, match: str) -> list[tuple[dict[str, str], list[float]]]:
        """Every raw sample of the series `match` selects, oldest first: [(labels with __name__, values)]."""
        self.flush()
        query = urllib.parse.urlencode({"match[]": match, "start": "0"})
        out = []
        with urllib.request.urlopen(f"{self.url}/api/v1/export?{query}", timeout=60) as r:
            for line in r.read().decode().splitlines():
                s = json.loads(line)
                out.append((s["metric"], [v for _, v in sorted(zip(s["timestamps"], s["values"]))]))
        return out

    def samples(self, name: str) -> dict[tuple, list[float]]:
        """Every raw sample of `name`'s series, oldest first: {labels: [values]}."""
        return {tuple(sorted((k, v) for k, v in labels.items() if k != "__name__")): values
                for labels, values in self.export(name)}

    def own_metrics(self) -> dict[str, float]:
        """VictoriaMetrics' own counters (its /metrics page), each line's full name -> value."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    continue
        return out

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
