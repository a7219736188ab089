"""The dashboard in a real browser (Debian's headless Chromium) against a real run.

A real daemon is fed by two real clients; `telemetry dashboard RUN_DIR --pub EP` serves the page;
Chromium loads it over the DevTools protocol. The charts must hold the run's data (counted
from metrics.jsonl), a record published after the page loaded must appear on it, a daemon
restart must show "daemon not reachable" and then recover, and the end of the run must show.
A full-page screenshot is kept as the test's artefact (its path is printed).

Skips only where chromium is not installed (launch/setup.sh --dev installs it with apt).
"""
from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from testkit.cdp import CHROMIUM, Browser
from testkit.dashboard_proc import Dashboard
from daemon_util import start_daemon
from telemetry.client import TelemetryClient

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; "
                                                          "launch/setup.sh --dev does it)")

NUM_STEPS = 40
EVAL_EVERY = 10


def _values(step: int, rank: int) -> dict:
    loss = 3.0 * math.exp(-step / 15) + 0.5
    v = {"train/loss": loss + rank * 0.01, "train/lr": 1e-3 * min(1.0, step / 10), "train/grad_norm": 1.0 + step % 3,
         "perf/step_time": 0.05 + 0.01 * rank, "perf/tokens": 2048, "perf/forward_time": 0.015,
         "perf/backward_time": 0.025, "perf/optimizer_time": 0.005, "perf/data_loading_time": 0.004,
         "dataset/copy/loss": loss * 0.8, "dataset/sort/loss": loss * 1.2,
         "dataset/copy/accuracy": 1 - loss / 4, "dataset/sort/accuracy": 1 - loss / 3.5}
    if step % EVAL_EVERY == 0:
        v.update({"eval/copy/loss": loss * 0.85, "eval/sort/loss": loss * 1.25})
    return v


def _charts(b: Browser) -> dict[str, dict]:
    return b.evaluate("Object.fromEntries([...document.querySelectorAll('[data-chart]')].filter(c => !c.hidden)"
                      ".map(c => [c.dataset.chart, {points: +c.dataset.points, series: c.dataset.series, "
                      "lastX: c.dataset.lastX}]))")


@pytest.mark.slow
def test_dashboard_in_chromium_against_a_real_run(tmp_path):
    sockets = Path(tempfile.mkdtemp(prefix="tdash-", dir="/tmp"))   # ipc paths must stay short
    eps = {n: f"ipc://{sockets}/{n}.sock" for n in ("ingest", "pub", "control")}
    ep_args = ("--ingest", eps["ingest"], "--pub", eps["pub"], "--control", eps["control"],
               "--run-name", "browser-run")
    log_dir = tmp_path / "browser-run" / "telemetry"
    for d in ("d0", "d1"):
        (tmp_path / d).mkdir()
    daemons = [start_daemon(tmp_path / "d0", world_size=2, per_rank=True, log_dir=log_dir, extra_args=ep_args,
                            config={"daemon_record_interval_s": 1})]
    clients = [TelemetryClient(eps["ingest"], rank=r) for r in (0, 1)]
    dash = None
    try:
        for c in clients:
            c.hello({"run_name": "browser-run", "config": {"optim": {"lr": 1e-3}}})
        for step in range(1, NUM_STEPS + 1):
            for r, c in enumerate(clients):
                c.log(step, _values(step, r))
        for c in clients:
            c.event("checkpoint_saved", {"path": "/ckpt/step_40", "step": 40})
        daemons[0].wait_for(lambda rs: any(r.get("step") == NUM_STEPS and "rank" not in r for r in rs)
                            and sum(r.get("kind") == "event" and r.get("name") == "checkpoint_saved" for r in rs) == 2
                            and any(r.get("kind") == "daemon" and "goodput/fraction" in r["values"] for r in rs)
                            and any(r.get("kind") == "system" for r in rs))
        recs = daemons[0].read_jsonl()
        steps = [r for r in recs if r["kind"] == "metrics" and "rank" not in r]
        num_loss = sum("train/loss" in r["values"] for r in steps)
        num_eval = sum("eval/copy/loss" in r["values"] for r in steps) * 2
        assert num_loss == NUM_STEPS and num_eval == 2 * NUM_STEPS // EVAL_EVERY

        dash = Dashboard(str(tmp_path / "browser-run"), "--pub", eps["pub"])
        with Browser(tmp_path / "chromium-profile", width=1400, height=1000) as b:
            # Without the token (another local user), the page loads but its data is refused.
            b.navigate(dash.url)
            b.wait_for("document.body.dataset.locked === '1'", what="the page refused its data")
            assert "needs its token" in b.evaluate("document.getElementById('status').textContent")
            assert _charts(b) == {}
            b.navigate(dash.login_url)   # the address printed, with its token: the page trades it for its key
            b.wait_for("document.body.dataset.ready === '1' && document.body.dataset.locked !== '1'",
                       what="the page drawn")
            assert b.evaluate("location.search + location.hash") == ""     # the token left the address
            assert b.evaluate("document.getElementById('shed').hidden") is True   # nothing shed
            # The run's rows may still be arriving when the page is first drawn (on a loaded box the
            # loss chart came after it): every row within a generous hang detector.
            b.wait_for("(c => c !== null && !c.hidden && +c.dataset.points === %d)"
                       "(document.querySelector('[data-chart=loss]'))" % (num_loss + num_eval),
                       timeout_s=120, what="the loss chart with every row")
            charts = _charts(b)
            # The charts hold the run's data, counted from what the daemon wrote.
            assert charts["loss"]["points"] == num_loss + num_eval, charts["loss"]
            assert charts["loss"]["series"] == "eval copy|eval sort|train"
            assert charts["loss"]["lastX"] == str(NUM_STEPS)
            for chart in ("lr", "grad_norm", "tokens", "slowest_rank"):
                assert charts[chart]["points"] == NUM_STEPS, (chart, charts[chart])
            assert charts["step_time"]["series"] == "slowest rank|mean|fastest rank"
            # The host's and the daemon's charts are in the System section, folded; opened, drawn.
            assert b.evaluate("document.getElementById('system').open") is False
            assert b.evaluate("['host_cpu', 'records_in'].every(c => document.getElementById('system')"
                              ".contains(document.getElementById('chart-' + c)))")
            b.evaluate("document.querySelector('#system > summary').click()")
            b.wait_for("state.plots['host_cpu'] !== undefined", what="the System section's charts drawn")
            # Axis titles: the x axis, and the unit the metric catalogue gives the series.
            assert b.evaluate("state.plots['step_time'].plot.axes.map(a => a.label)") == ["step", "s"]
            assert b.evaluate("state.plots['host_cpu'].plot.axes.map(a => a.label)") == ["time", "%"]
            assert charts["rank_step_time"]["series"] == "rank 0|rank 1"          # the daemon's --per-rank
            assert charts["rank_step_time"]["points"] == 2 * NUM_STEPS
            # Every metric the ranks send, a line per rank (the built-in charts draw the aggregate).
            for key in ("train/loss", "train/grad_norm", "dataset/copy/accuracy"):
                assert charts[f"auto-{key}"]["series"] == "rank 0|rank 1", (key, charts.get(f"auto-{key}"))
                assert charts[f"auto-{key}"]["points"] == 2 * NUM_STEPS, (key, charts[f"auto-{key}"])
            assert charts["phases"]["points"] == 4 * NUM_STEPS
            assert charts["dataset_loss"]["series"] == "copy|sort"
            assert charts["dataset_accuracy"]["points"] == 2 * NUM_STEPS
            assert charts["host_cpu"]["points"] >= 1 and charts["records_in"]["points"] >= 1
            assert charts["records_lost"]["series"] == "dropped|lost in transit|sink dropped"
            # Where the time went: the goodput ledger the daemon keeps, bucket by bucket, and its tile.
            num_goodput = sum("goodput/fraction" in r["values"] for r in recs if r["kind"] == "daemon")
            assert charts["goodput_fraction"]["points"] >= num_goodput >= 1, charts["goodput_fraction"]   # more since
            # Every bucket of the ledger (the server says them: a bucket added there is drawn here).
            from telemetry.shared.goodput import BUCKETS
            assert charts["goodput_buckets"]["series"] == "|".join(b.replace("_", " ") for b in BUCKETS), \
                charts["goodput_buckets"]
            assert b.evaluate("document.querySelector('[data-tile=goodput] .value').textContent").endswith(" %")
            # And the run's wall time so far as one stacked bar: the buckets of a daemon record the
            # daemon wrote, each positive one a segment as wide as its share; they sum to the wall.
            bar = b.evaluate("(() => { const r = document.querySelector('#goodput-bar .grow'); return r && "
                             "{wall: +r.dataset.wall, buckets: r.dataset.buckets, segs: [...r.querySelectorAll('.gseg')]"
                             ".map(s => [s.dataset.bucket, +s.dataset.share, s.style.width])}; })()")
            assert bar, "no goodput bar"
            drawn = {k: float(v) for k, v in (kv.split("=") for kv in bar["buckets"].split("|"))}
            # (the ledger's buckets, goodput/<bucket>_s; not its settled counters, goodput/settled/...)
            written = [{b: r["values"][f"goodput/{b}_s"] for b in BUCKETS if f"goodput/{b}_s" in r["values"]}
                       | {"wall": r["values"]["goodput/wall_s"]}
                       for r in daemons[0].read_jsonl("daemon") if "goodput/wall_s" in r["values"]]
            assert {**drawn, "wall": bar["wall"]} in written, (drawn, written[-3:])
            assert sum(drawn.values()) == pytest.approx(bar["wall"], abs=1e-4)
            assert [name for name, _, _ in bar["segs"]] == [k for k, v in drawn.items() if v > 0]
            assert "productive" in drawn and drawn["productive"] > 0
            for name, share, width in bar["segs"]:
                assert share == pytest.approx(drawn[name] / bar["wall"], abs=1e-6)
                assert float(width.rstrip("%")) == pytest.approx(100 * share, abs=1e-3), (name, width)
            # An event every rank sent is listed once, with its ranks.
            rows = b.evaluate("[...document.querySelectorAll('#event-rows tr')].map(r => r.textContent)")
            saved = [r for r in rows if "checkpoint_saved" in r]
            assert len(saved) == 1 and "ranks 0-1" in saved[0], rows
            assert b.evaluate("document.getElementById('status').dataset.connected") == "true"
            assert "browser-run" in b.evaluate("document.title")

            # A record published after the page loaded appears on it.
            for r, c in enumerate(clients):
                c.log(NUM_STEPS + 1, {"train/loss": 0.0123, "perf/step_time": 0.05, "perf/tokens": 2048})
            b.wait_for(f"document.getElementById('chart-loss').dataset.lastX === '{NUM_STEPS + 1}'",
                       what="the new step on the loss chart")
            assert _charts(b)["loss"]["points"] == num_loss + num_eval + 1
            assert b.evaluate("document.querySelector('[data-tile=loss] .value').textContent") == "0.0123"

            # The daemon goes away: the page says so; a new daemon on the same sockets: it recovers.
            assert daemons[0].stop() == 0
            first_final = daemons[0].read_jsonl("daemon")[-1]["values"]["telemetry/records_in"]   # its drain record
            b.wait_for("document.getElementById('status').dataset.connected === 'false'", what="daemon gone")
            assert "daemon not reachable" in b.evaluate("document.getElementById('status').textContent")
            daemon_restarted_t = time.time()
            daemons.append(start_daemon(tmp_path / "d1", world_size=2, log_dir=log_dir, extra_args=ep_args,
                                        config={"daemon_record_interval_s": 1}))
            b.wait_for("document.getElementById('status').dataset.connected === 'true'", what="daemon back")
            for r, c in enumerate(clients):
                c.log(NUM_STEPS + 2, {"train/loss": 0.0456, "perf/step_time": 0.05, "perf/tokens": 2048})
            b.wait_for(f"document.getElementById('chart-loss').dataset.lastX === '{NUM_STEPS + 2}'",
                       what="a step sent after the restart")

            # The records-in tile counts both daemons' records (each daemon counts from zero).
            deadline = time.monotonic() + 20
            while True:
                second = [r for r in daemons[1].read_jsonl("daemon") if r["t"] > daemon_restarted_t]
                want = first_final + second[-1]["values"]["telemetry/records_in"] if second else None
                shown = b.evaluate("document.querySelector('[data-tile=\"records in\"] .value').textContent")
                if want is not None and shown == f"{want:,}":
                    break
                assert time.monotonic() < deadline, (shown, want)
                time.sleep(0.3)

            # The run ends: every rank closes (bye); the page says the run ended and how.
            for c in clients:
                c.close()
            b.wait_for("document.getElementById('status').dataset.ended === 'true'", what="the run's end")
            assert "run ended (all 2 ranks closed)" in b.evaluate("document.getElementById('status').textContent")

            shot = b.screenshot(tmp_path / "dashboard.png")
            print(f"\ndashboard screenshot: {shot}")
        _check_screenshot(shot)
        assert not [line for line in b.console if "exception" in line], b.console
    finally:
        for c in clients:
            c.close()
        try:
            if dash is not None:
                assert dash.stop() == 0, "".join(dash.lines)
                assert "Traceback" not in "".join(dash.lines), "".join(dash.lines)[-4000:]
        finally:                         # the daemons go whatever the dashboard said
            for d in daemons:
                d.cleanup()
            shutil.rmtree(sockets, ignore_errors=True)


class _OtherPort:
    """Another local user's web server on another port of 127.0.0.1 (another origin): serves a
    page and records the Cookie and Authorization headers of every request it gets."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.seen: list[tuple[str, str | None, str | None]] = []   # (path, Cookie, Authorization)
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append((self.path, self.headers.get("Cookie"), self.headers.get("Authorization")))
                body = b"<!doctype html><title>other</title><body><script>document.body.dataset.other = '1';</script>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_pages_credential_never_leaves_its_port(tmp_path):
    """The dashboard's cookie was scoped to the host, not the port: Chromium sent it to another
    local user's page on another port of 127.0.0.1, which replayed it and read /api/data. The
    page opened with the printed address must hold no credential that travels: another port's
    server gets no cookie of ours, its page reads none of our storage and cannot fetch our data,
    and the key the page keeps is dead once its server is gone."""
    import json
    import urllib.error
    import urllib.request

    tel = tmp_path / "run" / "telemetry"
    tel.mkdir(parents=True)
    (tel / "metrics.jsonl").write_text(json.dumps({"kind": "metrics", "t": 1.7e9, "step": 1,
                                                   "values": {"train/loss": 2.5}}) + "\n")
    other = _OtherPort()
    dash = Dashboard(str(tmp_path / "run"))
    try:
        with Browser(tmp_path / "chromium-profile") as b:
            b.navigate(dash.login_url)     # as the user does: the address printed
            b.wait_for("document.body.dataset.ready === '1' && document.body.dataset.locked !== '1' && "
                       "state.order.length === 1", what="the page logged in and drawn")
            assert b.evaluate("location.href") == dash.url                # the token left the address
            assert b.evaluate("document.querySelector('[data-tile=loss] .value').textContent") == "2.5"

            # Another port of the same host: its page, then a request of its own with credentials.
            b.navigate(other.url)
            b.wait_for("document.body.dataset.other === '1'", what="the other port's page")
            b.evaluate("fetch('/probe', {credentials: 'include'}).then(r => r.status)")
            assert b.evaluate("[document.cookie, localStorage.length, sessionStorage.length]") == ["", 0, 0]
            got = b.evaluate(f"fetch({dash.url + 'api/data'!r}, {{credentials: 'include'}})"
                             ".then(r => 'read ' + r.status, e => 'refused: ' + e)")
            assert got.startswith("refused"), got
            assert {path for path, _, _ in other.seen} >= {"/", "/probe"}
            cookies = [c for _, c, _ in other.seen if c]
            for cookie in cookies:          # whatever came, replayed as its server would
                req = urllib.request.Request(dash.url + "api/data", headers={"Cookie": cookie})
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(req, timeout=60)
                assert refused.value.code == 403
            assert cookies == [] and [a for _, _, a in other.seen if a] == [], other.seen

            # Back on the dashboard's own port, by its plain address: still logged in.
            b.navigate(dash.url)
            b.wait_for("document.body.dataset.ready === '1' && state.order.length === 1 && "
                       "document.body.dataset.locked !== '1'", what="the plain address, logged in")

            # The server goes; a new one on the same port: the key the page kept is refused.
            port = dash.url.rsplit(":", 1)[1].strip("/")
            assert dash.stop() == 0
            dash = Dashboard(str(tmp_path / "run"), "--port", port)
            b.navigate(dash.url)
            b.wait_for("document.body.dataset.locked === '1'", what="the old key refused")
            assert b.evaluate("localStorage.length") == 0
            b.navigate(dash.url + "#token=not-the-token-at-all")
            b.wait_for("document.getElementById('status').textContent.startsWith('wrong token')", what="refused")
            assert b.evaluate("location.hash + localStorage.length") == "0"   # it left the address all the same
            b.navigate(dash.login_url)
            b.wait_for("document.body.dataset.locked !== '1' && state.order.length === 1", what="logged in again")
        assert not [line for line in b.console if "exception" in line], b.console
    finally:
        other.close()
        assert dash.stop() == 0, "".join(dash.lines)


def _check_screenshot(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] == 1400 and im.size[1] > 1500, im.size
        # Drawn charts, not a blank or an error page: many distinct colours.
        colours = im.convert("RGB").resize((350, im.size[1] // 4)).getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 200, len(colours)
