"""The run's media on the dashboard (issue 31 item 2), in a real browser: images with a step
slider, histograms over steps, tables, as a script logged them through the drop-in
(`import telemetry.wandb as wandb`); a value logged after the page loaded appears.

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
STEPS = 4


def _cards(b: Browser) -> dict:
    return b.evaluate("Object.fromEntries([...document.querySelectorAll('#media-cards .mcard')].map(c => "
                      "[c.dataset.key, {type: c.dataset.type, step: +c.dataset.step, n: +c.querySelector('input').max + 1, "
                      "counts: c.dataset.counts || null, rows: c.dataset.rows || null, "
                      "imgs: [...c.querySelectorAll('img')].map(i => [i.complete, i.naturalWidth, i.naturalHeight]), "
                      "cells: [...c.querySelectorAll('tbody td')].map(t => t.textContent)}]))")


def _slide(b: Browser, key: str, pos: int) -> None:
    b.evaluate(f"(() => {{ const s = document.querySelector('.mcard[data-key=\"{key}\"] input'); s.value = '{pos}'; "
               "s.dispatchEvent(new Event('input')); })()")


@pytest.mark.slow
def test_images_histograms_and_tables_a_script_logged_are_on_the_page_and_live(tmp_path, monkeypatch):
    sockets = Path(tempfile.mkdtemp(prefix="tdash-", dir="/tmp"))
    eps = {n: f"ipc://{sockets}/{n}.sock" for n in ("ingest", "pub", "control")}
    media = tmp_path / "media-tmp"
    log_dir = tmp_path / "media-run" / "telemetry"
    d = start_daemon(tmp_path, world_size=1, log_dir=log_dir, env={"TELEMETRY_MEDIA_DIR": str(media)},
                     extra_args=("--ingest", eps["ingest"], "--pub", eps["pub"], "--control", eps["control"],
                                 "--run-name", "media-run"))
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(media))
    monkeypatch.setenv("TELEMETRY_ENDPOINT", eps["ingest"])
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 255, (12 + s, 20, 3), dtype=np.uint8) for s in range(STEPS + 1)]
    samples = [rng.normal(loc=s, size=400) for s in range(STEPS + 1)]
    dash = None
    try:
        run = tw.init(project="media", config={"lr": 0.1})
        for s in range(1, STEPS + 1):
            run.log({"loss": 1.0 / s, "samples": tw.Image(images[s], caption=f"sample {s}"),
                     "weights": tw.Histogram(samples[s], num_bins=20),
                     "preds": tw.Table(columns=["id", "label"], data=[[i, f"c{i * s}"] for i in range(s + 1)])},
                    step=s)
        index = log_dir / "media" / "index.jsonl"
        deadline = time.monotonic() + 120
        while not index.exists() or len(index.read_text().splitlines()) < 3 * STEPS:
            assert time.monotonic() < deadline, "the daemon did not keep the media"
            time.sleep(0.1)

        dash = Dashboard(str(tmp_path / "media-run"), "--pub", eps["pub"])
        with Browser(tmp_path / "chromium-profile", width=1400, height=1100) as b:
            b.navigate(dash.login_url)
            b.wait_for("document.body.dataset.ready === '1' && document.querySelectorAll('.mcard').length === 3 && "
                       "[...document.querySelectorAll('.mcard img')].every(i => i.complete && i.naturalWidth)",
                       what="the media cards drawn")
            cards = _cards(b)
            assert sorted(cards) == ["preds", "samples", "weights"], cards
            assert {k: (c["type"], c["n"], c["step"]) for k, c in cards.items()} == {
                "samples": ("Image", STEPS, STEPS), "weights": ("Histogram", STEPS, STEPS), "preds": ("Table", STEPS, STEPS)}
            # The newest step shown: the image as logged (its size), its caption.
            assert cards["samples"]["imgs"] == [[True, 20, 12 + STEPS]], cards["samples"]
            assert b.evaluate("document.querySelector('.mcard[data-key=samples] figcaption').textContent") == \
                f"sample {STEPS}"
            assert cards["weights"]["counts"] == ",".join(str(int(c)) for c in np.histogram(samples[STEPS], bins=20)[0])
            # The slider takes each card back to step 1: that step's image, histogram, table.
            for key in ("samples", "weights", "preds"):
                _slide(b, key, 0)
            b.wait_for("document.querySelector('.mcard[data-key=preds]').dataset.rows === '2' && "
                       "[...document.querySelectorAll('.mcard[data-key=samples] img')].every(i => i.complete && "
                       "i.naturalHeight === 13)", what="step 1 shown")
            cards = _cards(b)
            assert cards["samples"]["step"] == cards["weights"]["step"] == cards["preds"]["step"] == 1
            assert cards["weights"]["counts"] == ",".join(str(int(c)) for c in np.histogram(samples[1], bins=20)[0])
            assert cards["preds"]["cells"] == ["0", "c0", "1", "c1"], cards["preds"]
            # The heat map of the histogram's steps has a row per step (drawn: pixels not blank).
            assert b.evaluate("(() => { const c = document.querySelector('.mcard[data-key=weights] canvas.heat'); "
                              "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; "
                              "return d.some(v => v > 0); })()")
            # Pixels as logged: the page's image, drawn into a canvas and read back.
            got = b.evaluate("(() => { const i = document.querySelector('.mcard[data-key=samples] img'); "
                             "const c = document.createElement('canvas'); c.width = i.naturalWidth; "
                             "c.height = i.naturalHeight; const g = c.getContext('2d'); g.drawImage(i, 0, 0); "
                             "return Array.from(g.getImageData(0, 0, c.width, c.height).data); })()")
            rgba = np.array(got, dtype=np.uint8).reshape(13, 20, 4)
            assert np.array_equal(rgba[:, :, :3], images[1])
            # Logged after the page loaded: a new step of a key and a key of its own appear.
            run.log({"samples": tw.Image(images[0]), "late": tw.Image(images[2])}, step=STEPS + 1)
            b.wait_for("document.querySelectorAll('.mcard').length === 4 && "
                       f"+document.querySelector('.mcard[data-key=samples] input').max === {STEPS}",
                       timeout_s=60, what="the values logged after load")
            cards = _cards(b)
            assert cards["late"]["type"] == "Image" and cards["late"]["step"] == STEPS + 1
            assert cards["samples"]["step"] == 1      # moved back by the user: it stays where they put it
            # The internal media events are no events to read.
            assert "wandb/media" not in b.evaluate("document.getElementById('event-rows').textContent")
            print(f"\ndashboard screenshot: {b.screenshot(tmp_path / 'media.png')}")
        assert not [line for line in b.console if "exception" in line.lower()], b.console
        tw.finish()
        final = d.drain(timeout_s=60)
        assert final["media"]["kept"] == 3 * STEPS + 2
        assert json.loads(index.read_text().splitlines()[-1])["step"] == STEPS + 1
    finally:
        tw.finish()
        stop_with_daemon(dash, d, sockets)


def test_the_media_index_answers_in_bounded_pieces_holds_a_bounded_amount_and_serves_only_its_files(tmp_path,
                                                                                                   monkeypatch):
    import os

    import telemetry.consumers.dashboard.media as m

    media = tmp_path / "telemetry" / "media"
    media.mkdir(parents=True)
    hist = {"bins": list(range(513)), "counts": [1.0] * 512}
    with open(media / "index.jsonl", "w") as f:
        for step in range(1, 5001):
            f.write(json.dumps({"step": step, "key": "h", "type": "Histogram", "rank": 0, **hist}) + "\n")
    index = m.MediaIndex(tmp_path / "telemetry")
    got, since = [], 0
    while True:
        answer = index.items(since)
        assert len(answer["items"]) <= m.MAX_ANSWER_ITEMS
        assert len(json.dumps(answer["items"])) <= m.MAX_ANSWER_BYTES + 20_000
        got += answer["items"]
        since = answer["total"]
        if not answer["more"]:
            break
    assert [e["step"] for e in got] == list(range(1, 5001))
    # Held: bounded in bytes, the oldest forgotten and said.
    monkeypatch.setattr(m, "MAX_HELD_BYTES", 1 << 20)
    index = m.MediaIndex(tmp_path / "telemetry")
    first = index.items(0)
    assert first["forgotten"] > 0 and first["items"][0]["step"] == first["forgotten"] + 1
    assert sum(len(json.dumps(e)) for e in index.entries) <= (1 << 20) + 20_000
    # Files: its own numbered PNGs and JSONs, never through a symlink or beyond the directory.
    (media / "1.png").write_bytes(b"\x89PNG")
    os.symlink("/etc/hostname", media / "2.json")
    (tmp_path / "secret.json").write_text("{}")
    assert index.file("1.png") == (b"\x89PNG", "image/png")
    for name in ("2.json", "../secret.json", "index.jsonl", "1.png\n", "3.svg"):
        assert index.file(name) is None, name
