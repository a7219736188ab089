"""The daemon keeps a run's media for the dashboard (telemetry/daemon/media_keeper.py): what the
drop-in logged, in <log_dir>/media, as the page shows it; the ranks' files deleted once, by the
last of their readers, with or without W&B."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

import telemetry.wandb as tw
from telemetry.daemon.media_keeper import MAX_BINS, MediaFiles, histogram, image_array

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_run_left():
    yield
    tw.finish()


def _log_media(wandb, rng) -> dict:
    """A script's media calls; returns what each key's value is, as W&B reads it."""
    import torch

    hwc = rng.integers(0, 255, (8, 6, 3), dtype=np.uint8)
    chw = torch.rand(3, 5, 7)
    gray = rng.random((4, 9))
    seq = rng.normal(size=500)
    counts, edges = np.histogram(rng.normal(size=100), bins=8)
    wandb.log({"loss": 1.0})
    wandb.log({"img/hwc": wandb.Image(hwc, caption="hwc"), "weights": wandb.Histogram(seq, num_bins=16),
               "preds": wandb.Table(columns=["x", "y"], data=[[1, "a"], [2, "b"], [3, "c"]])})
    wandb.log({"img/chw": wandb.Image(chw), "hist2": wandb.Histogram(np_histogram=(counts, edges)),
               "img/list": [wandb.Image(gray), wandb.Image(hwc)]}, step=4)
    wandb.log({"img/hwc": wandb.Image(hwc[::-1].copy(), caption="flipped")}, step=6)
    return {"hwc": hwc, "chw": np.moveaxis(chw.numpy(), 0, -1), "gray": gray, "seq": seq, "hist2": (counts, edges)}


def _png(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im)


def _scaled(a: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(a.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("wandb_mode", ["offline", "disabled"])
def test_the_daemon_keeps_what_the_script_logged_and_deletes_the_ranks_files(tmp_path, make_daemon, monkeypatch,
                                                                             wandb_mode):
    """Images (an array, a tensor, a list of them, captions), histograms (a sequence, an
    np_histogram) and a table, logged by a script through the drop-in: the kept copies are what
    was logged (pixels exact), at their steps; the media directory is empty after, whether W&B
    also read each file (offline) or nobody else did (disabled: before, every file stayed)."""
    media = tmp_path / "media"
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(media))
    # A drain deadline past what W&B offline takes on a loaded box (the default 12 s abandoned
    # the W&B sink mid-media beside a busy suite); the deadline's own tests: test_fault_drain.py.
    d = make_daemon(wandb=wandb_mode, env={"TELEMETRY_MEDIA_DIR": str(media)}, config={"drain_timeout_s": 120})
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    tw.init(project="p")
    truth = _log_media(tw, np.random.default_rng(0))
    tw.finish()
    final = d.drain(timeout_s=180)
    assert final["drained"], final["unfinished_sinks"]
    assert final["media"]["kept"] == 7 and final["media"]["failed"] == final["media"]["not_kept"] == 0, final["media"]
    if wandb_mode == "offline":
        assert (final["sinks"]["wandb"]["media_logged"], final["sinks"]["wandb"]["media_failed"]) == (7, 0)
    assert list(media.iterdir()) == []
    kept = d.log_dir / "media"
    index = [json.loads(line) for line in (kept / "index.jsonl").read_text().splitlines()]
    by = {(e["step"], e["key"]): e for e in index}
    assert sorted(by) == [(1, "img/hwc"), (1, "preds"), (1, "weights"), (4, "hist2"), (4, "img/chw"),
                          (4, "img/list"), (6, "img/hwc")], sorted(by)
    e = by[(1, "img/hwc")]
    assert e["type"] == "Image" and e["rank"] == 0 and not e["list"]
    assert e["images"][0]["caption"] == "hwc" and (e["images"][0]["width"], e["images"][0]["height"]) == (6, 8)
    assert np.array_equal(_png(kept / e["images"][0]["file"]), truth["hwc"])
    assert np.array_equal(_png(kept / by[(6, "img/hwc")]["images"][0]["file"]), truth["hwc"][::-1])
    assert by[(6, "img/hwc")]["images"][0]["caption"] == "flipped"
    # A tensor is C x H x W with values in [0, 1], scaled as W&B scales them.
    assert np.array_equal(_png(kept / by[(4, "img/chw")]["images"][0]["file"]), _scaled(truth["chw"]))
    lst = by[(4, "img/list")]
    assert lst["list"] and len(lst["images"]) == 2
    assert np.array_equal(_png(kept / lst["images"][0]["file"]), _scaled(truth["gray"]))
    assert np.array_equal(_png(kept / lst["images"][1]["file"]), truth["hwc"])
    counts, edges = np.histogram(truth["seq"], bins=16)
    assert by[(1, "weights")]["counts"] == counts.tolist() and by[(1, "weights")]["bins"] == pytest.approx(edges)
    assert by[(4, "hist2")]["counts"] == truth["hist2"][0].tolist()
    assert by[(4, "hist2")]["bins"] == pytest.approx(truth["hist2"][1])
    t = by[(1, "preds")]
    assert (t["columns"], t["rows"]) == (["x", "y"], 3)
    assert json.loads((kept / t["file"]).read_text()) == {"columns": ["x", "y"], "data": [[1, "a"], [2, "b"], [3, "c"]]}
    # The run's files: private as the others are.
    assert all(p.stat().st_mode & 0o077 == 0 for p in kept.iterdir()) and kept.stat().st_mode & 0o077 == 0


def test_past_its_budget_a_value_is_not_kept_but_counted_and_its_file_still_goes(tmp_path, make_daemon, monkeypatch):
    media = tmp_path / "media"
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(media))
    d = make_daemon(wandb="disabled", env={"TELEMETRY_MEDIA_DIR": str(media)}, config={"media": {"max_mb": 0.002}})
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    run = tw.init(project="p")
    rng = np.random.default_rng(1)
    for step in range(1, 6):
        run.log({"img": tw.Image(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))}, step=step)
    tw.finish()
    final = d.drain(timeout_s=60)
    m = final["media"]
    index = (d.log_dir / "media" / "index.jsonl").read_text().splitlines()
    assert m["kept"] == len(index) >= 1 and m["kept"] + m["not_kept"] == 5 and m["not_kept"] >= 1, m
    assert m["bytes"] <= 0.002 * 2**20
    assert list(media.iterdir()) == []
    assert "media.max_mb reached" in d.output()


def test_with_keep_off_nothing_is_kept_and_the_files_still_go(tmp_path, make_daemon, monkeypatch):
    media = tmp_path / "media"
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(media))
    d = make_daemon(wandb="disabled", env={"TELEMETRY_MEDIA_DIR": str(media)}, config={"media": {"keep": False}})
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    run = tw.init(project="p")
    run.log({"h": tw.Histogram([1.0, 2.0, 2.5])}, step=1)
    tw.finish()
    final = d.drain(timeout_s=60)
    assert final["media"]["kept"] == 0 and not (d.log_dir / "media").exists()
    assert list(media.iterdir()) == []


def test_a_file_is_deleted_once_each_reader_released_it_and_never_raises(tmp_path):
    a, b, c = (tmp_path / f"1-0000000{i}-{i}.npy" for i in range(3))
    for p in (a, b, c):
        p.write_bytes(b"x")
    (tmp_path / (a.name + ".failed")).write_text("no")
    files = MediaFiles(("keeper", "wandb"))
    files.release([a, a], "keeper")              # one reader twice (a name twice in one event): once
    files.release([a], "keeper")
    assert a.exists()
    files.release([a], "wandb")
    assert not a.exists() and not (tmp_path / (a.name + ".failed")).exists()
    # A reader that cannot start: what only it held back goes at once.
    files.release([b], "keeper")
    assert b.exists()
    files.drop_reader("wandb")
    assert not b.exists()
    files.release([c], "keeper")
    assert not c.exists()
    # One reader released it, the other never will (its event dropped): gone after ORPHAN_S.
    files = MediaFiles(("keeper", "wandb"))
    d = tmp_path / "1-00000000-9.png"
    d.write_bytes(b"x")
    files.release([d], "keeper")
    assert files.sweep() == 0 and d.exists()
    assert files.sweep(orphan_s=0.0) == 1 and not d.exists() and files.num_orphaned == 1
    # A name no reader can delete (too long, a NUL): said, never raised.
    files.release([tmp_path / ("x" * 300), tmp_path / "a\x00b"], "keeper")
    files.release([tmp_path / ("x" * 300), tmp_path / "a\x00b"], "wandb")
    with pytest.raises(ValueError, match="could not write it: no"):
        (tmp_path / "c.failed").write_text("no")
        MediaFiles.wait(tmp_path / "c", timeout_s=5)
    with pytest.raises(TimeoutError):
        MediaFiles.wait(tmp_path / "d", timeout_s=0.05)


@pytest.mark.parametrize("wandb_mode", ["offline", "disabled"])
def test_hostile_media_events_cost_their_own_value_never_the_keeper_or_the_sink(tmp_path, make_daemon, monkeypatch,
                                                                                wandb_mode):
    """A rank's media events naming files the drop-in never writes (300 characters, a NUL, a
    path), a histogram of 10^9 bins, a table with a missing value and one whose rows are not
    rows: each counted or kept as it should be, and the images logged after them are kept and
    their files deleted (one bad name killed the keeper thread, or made W&B drop its batch)."""
    from telemetry.client import TelemetryClient

    media = tmp_path / "media"
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(media))
    d = make_daemon(wandb=wandb_mode, env={"TELEMETRY_MEDIA_DIR": str(media)})
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    c = TelemetryClient(d.ingest, rank=3)
    for name in ("a" * 300, "1-00000000-1\x00.png", "../../etc/passwd", "1-0000000g-1.png"):
        c.event("wandb/media", {"step": 1, "key": "evil", "type": "Image", "file": name})
    c.close()
    run = tw.init(project="p")
    rng = np.random.default_rng(2)
    with pytest.raises(ValueError, match="maximum length of a histogram is 512"):
        tw.Histogram([1.0, 2.0], num_bins=10**9)
    run.log({"t": tw.Table(columns=["x", "loss"], data=[[1, 0.5], [2, float("nan")]])}, step=1)
    imgs = [rng.integers(0, 255, (4, 4, 3), dtype=np.uint8) for _ in range(3)]
    for step, im in enumerate(imgs, start=2):
        run.log({"img": tw.Image(im)}, step=step)
    tw.finish()
    final = d.drain(timeout_s=120)
    m = final["media"]
    assert m["kept"] == 4 and m["failed"] == 4, m
    index = [json.loads(line) for line in (d.log_dir / "media" / "index.jsonl").read_text().splitlines()]
    table = next(e for e in index if e["key"] == "t")
    assert json.loads((d.log_dir / "media" / table["file"]).read_text())["data"] == [[1, 0.5], [2, None]]
    assert [e["step"] for e in index if e["key"] == "img"] == [2, 3, 4]
    assert list(media.iterdir()) == []
    if wandb_mode == "offline":
        w = final["sinks"]["wandb"]
        assert (w["media_logged"], w["media_failed"], w["errors"]) == (4, 4, 0), w
    assert "Exception in thread" not in d.output(), d.output()[-3000:]


def test_a_histogram_event_of_too_many_bins_is_refused_before_any_is_counted(tmp_path, make_daemon, monkeypatch):
    """num_bins comes from the network: 3 x 10^7 bins took the daemon from 34 MB to 733 MB."""
    from telemetry.client import TelemetryClient

    media = tmp_path / "media"
    media.mkdir(mode=0o700)
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(media))
    d = make_daemon(wandb="offline", env={"TELEMETRY_MEDIA_DIR": str(media)})
    name = "1-00000000-1.npz"
    np.savez(media / name, sequence=np.arange(1000.0))
    c = TelemetryClient(d.ingest, rank=0)
    c.event("wandb/media", {"step": 1, "key": "h", "type": "Histogram", "file": name,
                            "options": {"num_bins": 30_000_000}})
    c.close()
    final = d.drain(timeout_s=60)
    assert final["media"]["failed"] == 1 and "num_bins 30000000" in final["media"]["last_error"]
    assert final["sinks"]["wandb"]["media_failed"] == 1
    assert list(media.iterdir()) == []


def test_a_wandb_sink_that_cannot_start_holds_no_media_file(tmp_path, make_daemon, monkeypatch):
    """W&B on, but its package cannot be imported: the keeper alone reads the files, and
    deletes each as it goes (they piled up until the daemon exited)."""
    fake = tmp_path / "fakewandb" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no wandb here')\n")
    media = tmp_path / "media"
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(media))
    d = make_daemon(wandb="offline", env={"TELEMETRY_MEDIA_DIR": str(media),
                                          "PYTHONPATH": f"{tmp_path / 'fakewandb'}:{ROOT}"})
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    run = tw.init(project="p")
    for step in range(1, 6):
        run.log({"h": tw.Histogram([1.0, 2.0, float(step)])}, step=step)
    deadline = __import__("time").monotonic() + 60
    while d.status()["media"]["kept"] < 5:
        assert __import__("time").monotonic() < deadline, d.status()["media"]
        __import__("time").sleep(0.1)
    assert list(media.iterdir()) == []            # while the run goes on
    tw.finish()
    d.drain(timeout_s=60)


def test_images_as_w_and_b_reads_them_and_a_wide_histogram_merged(tmp_path):
    p = tmp_path / "i.npy"
    np.save(p, np.array([[0.0, 0.5], [1.0, np.nan]]))
    assert image_array(p, {"source": "numpy"}).tolist() == [[0, 128], [255, 0]]
    np.save(p, np.array([[0, 300], [-5, 7]], dtype=np.int64))          # beyond 0..255: clipped
    assert image_array(p, {"source": "numpy"}).tolist() == [[0, 255], [0, 7]]
    np.save(p, np.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match="shape"):
        image_array(p, {"source": "numpy"})
    from PIL import Image

    Image.new("RGBA", (3, 2), (1, 2, 3, 4)).save(tmp_path / "f.png")
    assert image_array(tmp_path / "f.png", {"source": "file"}).shape == (2, 3, 4)
    buf = io.BytesIO()
    np.savez(buf, hist=np.arange(1300.0), bins=np.linspace(0, 1, 1301))
    (tmp_path / "h.npz").write_bytes(buf.getvalue())
    edges, counts = histogram(tmp_path / "h.npz", {})
    assert len(counts) <= MAX_BINS and len(edges) == len(counts) + 1
    assert sum(counts) == sum(range(1300)) and edges[0] == 0 and edges[-1] == 1
    assert edges == sorted(edges)


def test_a_media_directory_that_cannot_be_made_costs_the_media_not_the_run(tmp_path, make_daemon, monkeypatch):
    """Something else at <log_dir>/media (a file): the daemon starts, says so, keeps nothing and
    still deletes the ranks' files."""
    media = tmp_path / "media"
    log_dir = tmp_path / "run" / "telemetry"
    log_dir.mkdir(parents=True)
    (log_dir / "media").write_text("not a directory")
    monkeypatch.setenv("TELEMETRY_MEDIA_DIR", str(media))
    d = make_daemon(wandb="disabled", log_dir=log_dir, env={"TELEMETRY_MEDIA_DIR": str(media)})
    monkeypatch.setenv("TELEMETRY_ENDPOINT", d.ingest)
    run = tw.init(project="p")
    run.log({"h": tw.Histogram([1.0, 2.0])}, step=1)
    tw.finish()
    final = d.drain(timeout_s=60)
    assert final["media"]["kept"] == 0 and "cannot keep the run's media" in d.output()
    assert list(media.iterdir()) == []


def test_a_starting_daemon_deletes_media_files_nobody_will_read(tmp_path, make_daemon, monkeypatch):
    """Left by ranks with no daemon (or a killed one): their writer is gone and they are old.
    A file of a live writer, or a recent one, stays."""
    import os
    import subprocess
    import time

    media = tmp_path / "media"
    media.mkdir(mode=0o700)
    p = subprocess.Popen(["true"])
    p.wait()
    old = time.time() - 3600
    stale = [media / f"{p.pid}-0000000a-{i}.npy" for i in range(3)]
    for f in stale:
        f.write_bytes(b"x")
        os.utime(f, (old, old))
    (media / (stale[0].name + ".failed")).write_text("no")
    os.utime(media / (stale[0].name + ".failed"), (old, old))
    live = media / f"{os.getpid()}-0000000b-1.npy"
    recent = media / f"{p.pid}-0000000c-1.npy"
    for f in (live, recent):
        f.write_bytes(b"x")
    os.utime(live, (old, old))
    d = make_daemon(wandb="disabled", env={"TELEMETRY_MEDIA_DIR": str(media)})
    assert d.status()["media"]["stale_deleted"] == 3
    assert sorted(f.name for f in media.iterdir()) == sorted([live.name, recent.name])
