"""Nothing vanishes while a counter says 0 (issue 26): every record a client sent is written or
counted, whatever goes wrong around the daemon: a drain under load, idle connections that never
become clients, a run directory deleted or moved, a full disk, a step W&B cannot take."""
from __future__ import annotations

import glob

import pytest

from telemetry.client import TelemetryClient


# -- W&B: one absurd step does not make every later step one W&B refuses ------------------------
def test_wandb_one_absurd_step_does_not_swallow_the_rest(tmp_path, make_daemon):
    pytest.importorskip("wandb")
    from wandb_offline import history_rows, wait_finished

    log_dir = tmp_path / "tel"
    # 2,000 rows for W&B: on a loaded machine its sink needs longer than the default drain deadline
    # (12 s) to log them, and what is still queued then is abandoned (counted); the property here is
    # which steps W&B takes, so the deadline is a hang detector, generous.
    d = make_daemon(wandb="offline", world_size=1, log_dir=log_dir, run_name="wb-jump",
                    config={"drain_timeout_s": 150.0})
    tm = TelemetryClient(d.ingest, rank=0)
    tm.log(10**12, {"train/loss": -1.0})
    for s in range(1, 2001):
        tm.log(s, {"train/loss": float(s)})
    tm.log(1000, {"train/loss": 0.5})          # back in step: W&B cannot take it; counted
    tm.close()
    d.wait_for(lambda recs: any(r.get("step") == 2000 for r in recs), kind="metrics", timeout_s=60)
    status = d.status()
    assert d.stop(timeout_s=180) == 0
    run_id = (log_dir / "wandb_run_id").read_text().strip()
    (path,) = glob.glob(str(log_dir / "wandb" / f"offline-run-*-{run_id}" / f"run-{run_id}.wandb"))
    steps = [r["train/step"] for r in history_rows(wait_finished(path, timeout_s=60)) if "train/loss" in r]
    final = (log_dir / "drain.json").read_text()
    import json

    w = json.loads(final)["sinks"]["wandb"]
    # Every aggregated step is in W&B's history or counted as dropped, by reason; none is silent.
    assert steps == list(range(1, 2001)), (steps[:5], steps[-5:], len(steps))
    assert w["dropped_by_reason"] == {"step_jump": 1, "step_backwards": 1}, w
    assert w["dropped"] >= 2 and w["written"] + w["dropped"] == w["in"], w
    assert status["sinks"]["wandb"]["in"] > 0


# -- a drain under load: every client's records are written or counted, exactly -----------------
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# A rank that sends flat out, slows to a heartbeat for a moment (a rank descheduled beside CPU
# hogs: the drain sees a quiet socket), then sends flat out again and closes; it prints its own
# final stats.
_RANK = r"""
import json, os, sys, time
from telemetry.client import TelemetryClient
ep, rank, n1, n2, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
tm = TelemetryClient(ep, rank=rank)
values = {"train/loss": 2.5, "train/lr": 3e-4, "perf/step_time": 0.05}
for i in range(n1):
    tm.log(i, values)
with open(os.path.join(work, f"paused.{rank}.tmp"), "w") as f:
    json.dump(tm.stats(), f)
os.rename(os.path.join(work, f"paused.{rank}.tmp"), os.path.join(work, f"paused.{rank}"))
step = n1
while not os.path.exists(os.path.join(work, "go")):
    tm.log(step, values)                 # a heartbeat: a live rank, but quiet gaps of 0.2 s
    step += 1
    time.sleep(0.2)
for i in range(step, step + n2):
    tm.log(i, values)
tm.close(timeout_s=5.0)
print(json.dumps(tm.stats()), flush=True)
"""


def _hog():
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _wait(pred, what, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.02)


def test_a_drain_under_load_writes_or_counts_every_record_each_client_sent(tmp_path, make_daemon):
    num_ranks, n1, n2 = 4, 30_000, 30_000
    d = make_daemon(world_size=num_ranks, per_rank=True,
                    config={"drain_timeout_s": 120.0, "jsonl": {"max_queued": 10_000_000}})
    work = tmp_path / "ranks"
    work.mkdir()
    hog = _hog()
    ranks = [subprocess.Popen([sys.executable, "-c", _RANK, d.ingest, str(r), str(n1), str(n2), str(work)],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
             for r in range(num_ranks)]
    try:
        _wait(lambda: all((work / f"paused.{r}").exists() for r in range(num_ranks)), "ranks' first half")

        half = {r: json.loads((work / f"paused.{r}").read_text())["sent"] for r in range(num_ranks)}

        def caught_up() -> bool:       # what each rank has sent so far has all been taken in
            per_rank = d.status()["per_rank"]
            return all(per_rank.get(str(r), {}).get("received", 0) >= half[r] for r in range(num_ranks))

        _wait(caught_up, "the daemon taking the first half in")
        replies: list = []
        drainer = threading.Thread(target=lambda: replies.append(d.request("drain", timeout_s=180)))
        drainer.start()
        _wait(lambda: "draining" in d.output(), "the daemon starting its drain")
        # The fault: a quiet socket mid-drain while every rank still has half its records to send
        # (the old drain stopped at the first empty read and closed the socket on them).
        time.sleep(0.3)
        (work / "go").touch()
        stats = {}
        for r, p in enumerate(ranks):
            out, _ = p.communicate(timeout=180)
            assert p.returncode == 0, out
            stats[r] = json.loads(out.strip().splitlines()[-1])
        drainer.join(180)
        assert d.proc.wait(60) == 0, d.output()[-3000:]
    finally:
        hog.kill()
        hog.wait()
        for p in ranks:
            p.kill()
    final = json.loads((d.log_dir / "drain.json").read_text())
    assert replies and replies[0]["records_in"] == final["records_in"]
    assert final.get("sources_open_at_drain", 0) == 0, final
    assert final["records_failed"] == 0 and final["sinks"]["jsonl"]["dropped"] == 0, final["sinks"]["jsonl"]
    written = {r: 0 for r in range(num_ranks)}
    for rec in d.read_jsonl():
        if rec.get("kind") in ("metrics", "hello", "bye") and "rank" in rec:
            written[rec["rank"]] += 1
    for r, s in stats.items():
        pr = final["per_rank"][str(r)]
        transit = pr["lost"] - pr["dropped_by_client"]
        # The client's own count, against what the daemon wrote and what it counted.
        assert s["sent"] == written[r] + pr.get("refused", 0) + transit, (r, s, pr, written[r])
        assert pr.get("open", 0) == 0 and pr["dropped_by_client"] == s["dropped"], (r, s, pr)
        assert written[r] == pr["received"], (r, written[r], pr)
    # With a deadline this long nothing needed to be cut short: all of it was processed.
    assert sum(s["sent"] for s in stats.values()) == final["records_in"] + final["records_lost_in_transit"] \
        + final["records_unread_at_drain"] + final["records_shed_at_intake"], final


# -- the run directory deleted or moved under the daemon --------------------------------------------
def _steps(tm, start, stop, d=None, slice_size=1000):
    """Log steps start..stop-1. With `d`, in slices, each once the daemon has taken the last in
    (status records_in): a burst of 10,000 into the client's queue of 10,000 while a loaded box
    starved the daemon once dropped some (counted by the client, but never records_in)."""
    for first in range(start, stop, slice_size if d is not None else stop - start):
        last = min(stop, first + (slice_size if d is not None else stop - start))
        for s in range(first, last):
            tm.log(s, {"train/loss": float(s)})
        if d is not None:
            sent = tm.stats()["sent"]                 # the hello too
            _wait(lambda: d.status()["records_in"] >= sent, f"the daemon taking steps {first}..{last - 1} in")


def _drain_final(d) -> dict:
    """Drain; the final counters from the reply (drain.json may have nowhere to go)."""
    final = d.request("drain", timeout_s=120)
    d.proc.wait(60)
    return final


def test_run_dir_deleted_mid_run_counts_every_record_and_exits_nonzero(tmp_path, make_daemon):
    import shutil

    d = make_daemon(world_size=1, config={"jsonl": {"fsync_interval_s": 0.2}})
    tm = TelemetryClient(d.ingest, rank=0)
    _steps(tm, 0, 100)
    d.wait_for(lambda recs: any(r.get("step") == 99 for r in recs), kind="metrics", timeout_s=60)
    shutil.rmtree(d.log_dir)
    _steps(tm, 100, 10_100, d)
    tm.close()
    _wait(lambda: d.status()["records_in"] >= 10_100, "the records after the deletion")
    cli = subprocess.run([sys.executable, "-m", "telemetry", "drain", "--json", "--control", d.control,
                          "--timeout", "120"],
                         capture_output=True, text=True, timeout=180, cwd=Path(__file__).resolve().parent.parent)
    d.proc.wait(60)
    assert cli.returncode == 1 and "metrics.jsonl could not hold" in cli.stderr, (cli.returncode, cli.stderr)
    final = json.loads(cli.stdout)
    j = final["sinks"]["jsonl"]
    # The 10,000 records after the deletion: written into the deleted file (counted when its
    # flush timer saw it gone) or refused without a directory; none counted as written.
    assert j["dropped"] >= 10_000 and j["written"] + j["dropped"] == j["in"], j
    assert j["lines_lost"] + j["write_errors"] > 0, j
    assert d.proc.returncode == 1, d.output()[-2000:]
    assert "deleted" in d.output() or "gone" in d.output()


def test_metrics_file_deleted_mid_run_is_created_again(tmp_path, make_daemon):
    d = make_daemon(world_size=1, config={"jsonl": {"fsync_interval_s": 0.2}})
    tm = TelemetryClient(d.ingest, rank=0)
    _steps(tm, 0, 100)
    d.wait_for(lambda recs: any(r.get("step") == 99 for r in recs), kind="metrics", timeout_s=60)
    time.sleep(2.5)        # the sink has looked at its file since (its flush timer: every second)
    d.jsonl.unlink()
    _steps(tm, 100, 10_100, d)
    tm.close()
    _wait(lambda: d.status()["records_in"] >= 10_100, "the records after the deletion")
    final = _drain_final(d)
    j = final["sinks"]["jsonl"]
    steps = {r["step"] for r in d.read_jsonl("metrics")}
    missing = set(range(10_100)) - steps
    assert j["reopened"] == 1, j
    # Each step is in the new file, or counted: written into the deleted one (the 100 before the
    # deletion too: they went with it). The file holds what is counted written, no more.
    assert set(range(100)) <= missing, sorted(steps)[:5]
    assert len(missing) <= j["lines_lost"] and j["lines_lost"] == j["dropped"], (len(missing), j)
    assert j["written"] + j["dropped"] == j["in"], j
    assert len(d.jsonl.read_bytes().splitlines()) == j["written"], j
    assert d.proc.returncode == 1      # lines were lost with the deleted file: said at exit


def test_run_dir_moved_mid_run_keeps_what_it_holds_and_counts_the_rest(tmp_path, make_daemon):
    d = make_daemon(world_size=1, config={"jsonl": {"fsync_interval_s": 0.2}})
    tm = TelemetryClient(d.ingest, rank=0)
    _steps(tm, 0, 100)
    d.wait_for(lambda recs: any(r.get("step") == 99 for r in recs), kind="metrics", timeout_s=60)
    moved = tmp_path / "moved"
    d.log_dir.rename(moved)
    _wait(lambda: "moved or replaced" in d.output(), "the sink noticing the move (its flush timer)")
    _steps(tm, 100, 10_100, d)
    tm.close()
    _wait(lambda: d.status()["records_in"] >= 10_100, "the records after the move")
    final = _drain_final(d)
    j = final["sinks"]["jsonl"]
    lines = (moved / "metrics.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(line) for line in lines[:-1])     # whole lines
    steps = {json.loads(line).get("step") for line in lines[:-1]}
    # What went into the file before the sink saw it move is where it went (and written); what
    # came after, with no directory at the configured path, is counted as dropped.
    assert set(range(100)) <= steps and not steps & set(range(100, 10_100)), sorted(steps - set(range(100)))[:5]
    assert j["dropped"] >= 10_000 and j["written"] + j["dropped"] == j["in"], j
    assert j["lines_lost"] == 0, j
    assert d.proc.returncode == 1


def test_a_failed_rotation_never_writes_to_a_closed_descriptor(tmp_path, monkeypatch):
    from telemetry.daemon.sinks.base import Out
    from telemetry.daemon.sinks.jsonl import JsonlSink

    sink = JsonlSink(tmp_path, rotate_bytes=1024)
    sink.start()

    def no_rename(src, dst):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr("telemetry.daemon.sinks.jsonl.os.rename", no_rename)
    batch = [Out("metrics", {"step": i}, b'{"kind":"metrics","step":%d,"pad":"%s"}' % (i, b"x" * 100))
             for i in range(20)]
    try:
        sink.consume(batch)             # past rotate_bytes: the rename fails
    except OSError:
        pass
    # A descriptor opened now takes the lowest free number: the one a closed sink fd had.
    victim = tmp_path / "victim"
    fd = os.open(victim, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        sink.consume(batch)
    except OSError:
        pass
    finally:
        os.close(fd)
    monkeypatch.undo()
    sink.close()
    assert victim.read_bytes() == b""                                    # nothing written to it
    lines = (tmp_path / "metrics.jsonl").read_bytes().split(b"\n")
    assert len(lines) - 1 == 40 and sink.stats()["rotation_errors"] >= 1, sink.stats()


# -- a full disk: counted, the final counters still somewhere, exit 1 -------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (root only); unmounted at teardown."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()}")
    yield mnt
    if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full_counts_writes_drain_json_and_the_final_record_and_exits_nonzero(small_disk, make_daemon):
    d = make_daemon(world_size=1, log_dir=small_disk / "telemetry", config={"jsonl": {"fsync_interval_s": 0.2}})
    try:
        tm = TelemetryClient(d.ingest, rank=0)
        values = {f"train/value_{i}": float(i) for i in range(20)}
        step = 0
        deadline = time.monotonic() + 120
        while not d.status()["sinks"]["jsonl"].get("write_errors"):        # until the disk is full
            assert time.monotonic() < deadline, d.status()["sinks"]["jsonl"]
            for _ in range(500):
                tm.log(step, values)
                step += 1
            _wait(lambda: d.status()["records_in"] >= step + 1, "the records so far")
        for _ in range(1000):                                                # and then some
            tm.log(step, values)
            step += 1
        tm.close()
        _wait(lambda: d.status()["records_in"] >= step + 2, "the records after the disk filled")
        reply = _drain_final(d)
    finally:
        d.cleanup()
    assert d.proc.returncode == 1, d.output()[-2000:]
    final = json.loads((d.log_dir / "drain.json").read_text())                # it found room
    assert "cannot write" not in "".join(l for l in d.output().splitlines(True) if "drain.json" in l), \
        d.output()[-2000:]                                                    # and says no failure
    assert final["records_in"] == reply["records_in"]
    j = final["sinks"]["jsonl"]
    assert j["write_errors"] > 0 and j["dropped"] >= 1000 and j["written"] + j["dropped"] == j["in"], j
    data = d.jsonl.read_bytes()
    assert data.endswith(b"\n")
    lines = [json.loads(line) for line in data.split(b"\n")[:-1]]            # whole lines only
    assert lines[-1]["kind"] == "daemon" and lines[-1]["values"]["telemetry/records_in"] == step + 2, lines[-1]
    assert j["final_rescued"] <= 1          # 1: it took the room the reserve held (a page may have been left)
    assert not (d.log_dir / ".telemetry-reserve").exists()


# -- connections that never become clients do not lock the ranks out ------------------------------
class _IdleFlood:
    """Holds `n` raw TCP connections to `addr` that never send a byte, opening a new one for each
    the daemon closes (an attacker that keeps the ingest's connection limit full)."""

    def __init__(self, addr: tuple[str, int], n: int) -> None:
        import selectors

        self.addr, self.n = addr, n
        self.sel = selectors.DefaultSelector()
        self.num_opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> None:
        import selectors
        import socket

        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(self.addr)
        self.sel.register(s, selectors.EVENT_READ)
        self.num_opened += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            while len(self.sel.get_map()) < self.n:
                self._open()
            for key, _ in self.sel.select(0.05):
                s = key.fileobj
                try:
                    gone = s.recv(1) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:                          # closed by the daemon: open another
                    self.sel.unregister(s)
                    s.close()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


def _settled(d, rank: str, sent: int, timeout_s: float = 30.0) -> dict:
    """The rank's accounting once its records stop arriving. The bye comes on a connection of
    its own: on a daemon that is behind, the fair queue can take it before the last records of
    the records connection (seen beside a CPU hog: lost 99 at the bye, a moment before they
    arrived). `lost` counts what is missing *now*; a record that is late, not lost, must arrive
    within `timeout_s` (a record that never does stays in `lost` and fails the caller)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pr = d.status()["per_rank"][rank]
        if pr["received"] >= sent or time.monotonic() > deadline:
            return pr
        time.sleep(0.05)


def test_idle_raw_connections_do_not_lock_a_rank_out(make_daemon):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    # A limit of 128 (1,024 by default): the kernel's accept queue drops part of a burst of
    # thousands of connects, so a smaller limit is what a test can fill for certain.
    d = make_daemon(transport="tcp", world_size=1, config={"max_connections": 128})
    host, port = d.ingest[len("tcp://"):].rsplit(":", 1)
    limit = d.status()["limits"]["max_connections"]

    def conns() -> dict:
        return d.status()["security"]["connections"]["ingest"]

    with _IdleFlood((host, int(port)), 2 * limit):
        # The limit is full of connections that never send a greeting, and more keep coming.
        _wait(lambda: conns()["refused"] or conns().get("idle_closed"), "the idle connections filling the limit")
        tm = TelemetryClient(d.ingest, rank=0)
        _steps(tm, 0, 2000)
        tm.close()
        sent = tm.stats()["sent"]
        # Every record of the rank, and its bye, arrive; nothing of it is lost.
        _wait(lambda: d.status()["per_rank"].get("0", {}).get("open") == 0, "the rank's bye", timeout_s=60)
        pr = _settled(d, "0", sent)
        c = conns()
    assert pr["received"] == sent == 2002 and pr["lost"] == 0, pr
    assert c["idle_closed"] >= 1, c                                    # counted ...
    assert d.output().count("never sent a ZMTP greeting") == 1         # ... and logged once


def test_a_drain_waits_for_the_clients_still_sending_not_for_those_long_gone():
    """Receiver.open_live: the sources a drain waits for (their bye closes their accounting)."""
    import protocol
    from daemon_util import feed, feed_one
    from telemetry.daemon.receiver import LIVE_MARKS, Receiver

    def metrics(src, seq):
        return protocol.encode_metrics(src, 0, seq, 0, 1, seq, {"train/loss": 1.0})

    r = Receiver()
    feed(r, [metrics(1, 0), metrics(2, 0), metrics(3, 0), metrics(4, 0)])
    for src in (1, 2, 3):
        r.note_hello(src)              # 4 never said hello: hand-made frames, no bye will come
    assert r.open_live() == {1, 2, 3}
    r.unread([protocol.encode_bye(2, 0, 1, 0, 1, {})])     # a bye only counted at the deadline closes it too
    for _ in range(LIVE_MARKS + 1):
        r.mark_progress()
        feed_one(r, metrics(3, r.sources[3].max_seq + 1))     # 3 keeps sending; 1 went silent
    assert r.open_live() == {3}
    assert r.still_open({1, 2, 3}) == {1, 3}
    assert r.per_rank()[0]["open"] == 3 and r.per_rank()[0]["refused"] == 1
    snap = r.snapshot()
    r2 = Receiver()
    r2.restore(snap)                                     # a predecessor's clients: live once they send
    assert r2.open_live() == set()
    feed_one(r2, metrics(1, 5))
    r2.note_hello(1)
    assert r2.open_live() == {1}


def test_the_reported_case_1024_idle_connections_then_a_rank(make_daemon):
    """As reported: 1,024 raw TCP connections that never send a greeting (the default limit),
    then a rank logging 2,000 steps: all its 2,002 records and its bye arrive."""
    import resource
    import socket

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    d = make_daemon(transport="tcp", world_size=1)
    host, port = d.ingest[len("tcp://"):].rsplit(":", 1)
    limit = d.status()["limits"]["max_connections"]
    idle = []
    try:
        for _ in range(limit):
            idle.append(socket.create_connection((host, int(port)), timeout=60))
        _wait(lambda: d.status()["security"]["connections"]["ingest"]["open"] >= limit, "every idle connection")
        tm = TelemetryClient(d.ingest, rank=0)
        _steps(tm, 0, 2000)
        tm.close()
        _wait(lambda: d.status()["per_rank"].get("0", {}).get("open") == 0, "the rank's bye", timeout_s=60)
        pr = _settled(d, "0", tm.stats()["sent"])
        assert pr["received"] == tm.stats()["sent"] == 2002 and pr["lost"] == 0, pr
        assert d.status()["security"]["connections"]["ingest"]["idle_closed"] >= 1
    finally:
        for s in idle:
            s.close()


def test_drain_json_written_in_the_reserves_room_is_no_error(tmp_path, monkeypatch, caplog):
    """On a full disk drain.json is written in the room the JSONL sink's reserve held: the first
    try's ENOSPC is no error of the daemon's (it said "cannot write drain.json" with the file
    written); only a write that fails in that room too is."""
    import errno
    import logging

    from telemetry.daemon import shutdown
    from telemetry.daemon.sinks.jsonl import make_reserve
    from telemetry.shared import files

    real, calls = files.write_file, []

    def full_until_the_reserve_goes(path, data, *a, **k):
        calls.append(path)
        if (tmp_path / ".telemetry-reserve").exists():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, *a, **k)

    assert make_reserve(tmp_path)
    monkeypatch.setattr(files, "write_file", full_until_the_reserve_goes)
    with caplog.at_level(logging.ERROR, logger="telemetry.daemon"):
        assert shutdown.write_drain_json(tmp_path, {"ok": True}) is True
    assert len(calls) == 2 and json.loads((tmp_path / "drain.json").read_text()) == {"ok": True}
    assert not [r for r in caplog.records if "cannot write" in r.getMessage()], caplog.text

    monkeypatch.setattr(files, "write_file", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with caplog.at_level(logging.ERROR, logger="telemetry.daemon"):
        assert shutdown.write_drain_json(tmp_path / "nowhere", {"ok": True}) is False
    assert [r for r in caplog.records if "cannot write" in r.getMessage()], caplog.text
