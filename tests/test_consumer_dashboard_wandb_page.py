"""A plain W&B script's run on the dashboard, in a real browser: the user's run first.

A script logs through the drop-in (`import telemetry.wandb as wandb`) its own keys, an image and
a summary value, with a name, tags and notes; a real daemon adds its host series and its own
accounting. The page must show the script's keys first (its first chart is one of them, above
anything of the host's or the daemon's), its media before the System section (host, GPUs, the
daemon's own series), which is folded until opened; no tile without a value (a script logs no
tokens/s, MFU, step time or grad norm of the trainer's); one count of records; the run's name as the
title; its summary (also a value set after the page loaded), tags and notes; its image, enlarged
with a click.

Skips only where chromium is not installed (launch/setup.sh --dev installs it with apt).
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import telemetry.wandb as tw
from daemon_util import start_daemon
from testkit.cdp import CHROMIUM, Browser
from testkit.dashboard_proc import Dashboard, stop_with_daemon

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; "
                                                          "launch/setup.sh --dev does it)")
STEPS = 30
RUN_ID = "oi1gac7g"                    # the run's directory: what the title said before its name
OWN_KEYS = ("loss", "acc", "val/bleu")
# The System section's built-in charts: the host's and the daemon's own.
SYSTEM_CHARTS = ("host_cpu", "host_memory", "records_in", "records_lost")

LAYOUT = """(() => {
  const charts = [...document.querySelectorAll('[data-chart]')].filter(c => !c.hidden);
  const system = document.getElementById('system');     // (a page without one: nothing is in it)
  const inSystem = (c) => !!system && system.contains(c);
  const before = (a, b) => !!(a.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING);
  const firstSystem = charts.find(inSystem);
  return {
    order: charts.map(c => c.dataset.chart),
    system: charts.filter(inSystem).map(c => c.dataset.chart),
    open: system ? system.open : null, systemHidden: system ? system.hidden : null,
    ownBeforeSystem: charts.filter(c => !inSystem(c)).every(c => !firstSystem || before(c, firstSystem)),
    mediaBeforeSystem: !!system && before(document.getElementById('media'), system),
    firstTop: charts[0] && charts[0].getBoundingClientRect().top,
    systemTop: system ? system.getBoundingClientRect().top : null,
    tiles: Object.fromEntries([...document.querySelectorAll('.tile')].map(t => [t.dataset.tile,
                                                                           t.querySelector('.value').textContent])),
    title: document.getElementById('title').textContent, docTitle: document.title,
    subtitle: document.getElementById('subtitle').textContent,
    summary: Object.fromEntries([...document.querySelectorAll('#summary-rows tr')].map(r => [r.dataset.key,
                                                                                          r.querySelector('td').textContent])),
    tags: [...document.querySelectorAll('#run-about .tag')].map(t => t.textContent),
    notes: [...document.querySelectorAll('#run-about .notes')].map(n => n.textContent),
    plotted: Object.keys(state.plots),
  };
})()"""


@pytest.mark.slow
def test_a_wandb_scripts_run_shows_its_own_keys_name_and_summary_first(tmp_path, monkeypatch):
    sockets = Path(tempfile.mkdtemp(prefix="tdash-", dir="/tmp"))
    eps = {n: f"ipc://{sockets}/{n}.sock" for n in ("ingest", "pub", "control")}
    media = tmp_path / "media-tmp"
    log_dir = tmp_path / RUN_ID / "telemetry"
    d = start_daemon(tmp_path, world_size=1, log_dir=log_dir, env={"TELEMETRY_MEDIA_DIR": str(media)},
                     config={"daemon_record_interval_s": 1},
                     extra_args=("--ingest", eps["ingest"], "--pub", eps["pub"], "--control", eps["control"],
                                 "--run-name", RUN_ID))
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(media))
    monkeypatch.setenv("TELEMETRY_ENDPOINT", eps["ingest"])
    rng = np.random.default_rng(3)
    dash = None
    try:
        run = tw.init(project="mt", name="bleu-baseline", tags=["baseline", "fr-en"], notes="first try at fr-en",
                      config={"lr": 0.01, "batch_size": 32})
        for s in range(1, STEPS + 1):
            row = {"loss": 2.0 / s, "acc": 1 - 1.0 / (s + 1), "val/bleu": 20 + s / 3}
            if s % 10 == 0:
                row["samples"] = tw.Image(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8), caption=f"step {s}")
            run.log(row, step=s)      # (a step is sent when the next begins, as W&B's)
        run.summary["best_bleu"] = 31.4
        d.wait_for(lambda rs: any(r.get("kind") == "event" and r.get("name") == "wandb/summary" for r in rs)
                   and any(r.get("kind") == "metrics" and r.get("step") == STEPS - 1 for r in rs)
                   and any(r.get("kind") == "system" for r in rs)
                   and any(r.get("kind") == "daemon" and "telemetry/records_in" in r["values"] for r in rs))
        recs = d.read_jsonl()

        dash = Dashboard(str(tmp_path / RUN_ID), "--pub", eps["pub"])
        with Browser(tmp_path / "chromium-profile", width=1400, height=1100) as b:
            b.navigate(dash.login_url)
            b.wait_for("document.body.dataset.ready === '1' && document.querySelectorAll('.mcard').length === 1 && "
                       "document.querySelector('[data-tile=\"records in\"]') !== null",
                       what="the page drawn with its media and the daemon's counters")
            got = b.evaluate(LAYOUT)
            # The script's keys first: the page's first chart is one of them, above the System
            # section; every chart of the host or the daemon is in that section, after them.
            assert got["order"][0] in {f"auto-{k}" for k in OWN_KEYS}, got["order"]
            assert {f"auto-{k}" for k in OWN_KEYS} <= set(got["order"]), got["order"]
            assert set(SYSTEM_CHARTS) <= set(got["system"]), got
            assert not [c for c in got["order"] if c not in got["system"] and
                        c.removeprefix("auto-").startswith(("system/", "gpu/", "telemetry/"))], got
            assert got["ownBeforeSystem"] and got["mediaBeforeSystem"], got
            assert got["firstTop"] < got["systemTop"], got
            # Folded: its charts are not drawn until it is opened.
            assert got["open"] is False and got["systemHidden"] is False, got
            assert not set(SYSTEM_CHARTS) & set(got["plotted"]), got["plotted"]
            # No tile without a value; the script has none of the trainer's.
            assert got["tiles"] and "—" not in got["tiles"].values(), got["tiles"]
            assert not {"tokens/s", "MFU", "step time", "grad norm", "loss", "lr"} & set(got["tiles"]), got["tiles"]
            last_step = max(r["step"] for r in recs if r["kind"] == "metrics")
            assert got["tiles"]["step"] == str(last_step)
            # One count of records: the daemon's, in its tile; the header says no other.
            assert "records" not in got["subtitle"], got["subtitle"]
            lines = sum(1 for _ in (log_dir / "metrics.jsonl").open())
            assert got["tiles"]["records in"] != f"{lines:,}"    # the header's old count was another number
            # The run's name (wandb.init(name=...)), its summary, tags and notes.
            assert got["title"] == "bleu-baseline" and got["docTitle"].startswith("bleu-baseline"), got
            assert got["summary"] == {"best_bleu": "31.4"}, got["summary"]
            assert got["tags"] == ["baseline", "fr-en"] and got["notes"] == ["first try at fr-en"], got
            config = b.evaluate("Object.fromEntries([...document.querySelectorAll('#config-rows tr')]"
                                ".map(r => [r.dataset.key, r.querySelector('td').textContent]))")
            assert config == {"lr": "0.01", "batch_size": "32"}, config

            shot = b.screenshot(tmp_path / "dashboard-wandb-script.png")      # the page as it opens
            print(f"\ndashboard screenshot: {shot}")

            # A summary value set after the page loaded appears.
            run.summary["final_loss"] = 0.0667
            b.wait_for("document.querySelector('#summary-rows tr[data-key=final_loss] td')?.textContent === '0.0667'",
                       what="the new summary value")

            # The 16x16 image, enlarged with a click (the card shows it at ~96 px); a click closes it.
            b.wait_for("[...document.querySelectorAll('.mcard img')].every(i => i.complete && i.naturalWidth)",
                       what="the image loaded")
            b.evaluate("document.querySelector('.mcard img').click()")
            big = b.evaluate("(() => { const box = document.getElementById('lightbox'); const i = box.querySelector('img'); "
                             "return {hidden: box.hidden, w: i.getBoundingClientRect().width, "
                             "src: i.src === document.querySelector('.mcard img').src}; })()")
            assert big["hidden"] is False and big["src"] and big["w"] >= 16 * 20, big
            b.evaluate("document.getElementById('lightbox').click()")
            assert b.evaluate("document.getElementById('lightbox').hidden") is True

            # Opened, the System section draws its charts, as wide as their cards.
            b.evaluate("document.querySelector('#system > summary').click()")
            b.wait_for("document.getElementById('system').open && state.plots['host_cpu'] !== undefined",
                       what="the System section's charts drawn")
            width = b.evaluate("state.plots['host_cpu'].plot.width")
            assert width >= 300, width
            run.finish()
        assert not [line for line in b.console if "exception" in line], b.console
        assert any(r.get("kind") == "system" for r in recs)
    finally:
        stop_with_daemon(dash, d, sockets)
