"""The local clients' record rings (telemetry/shared/ring.py, telemetry/daemon/rings.py): the C and
Python writers and readers agree byte for byte; a client whose daemon reads rings writes every
frame there and every record arrives, in the order of the calls; what a killed client wrote is
still read; a full ring drops and counts; a daemon that does not read rings (or a gone one) gets
the socket; rings no client of this user wrote, or broken ones, are never read past."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import zmq

from telemetry.daemon import loops as py_loops
from telemetry.shared import ring

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _ring_transport(monkeypatch):
    """The clients here (and the scripts they start) take the default: a ring where their daemon
    reads rings."""
    monkeypatch.delenv(ring.ENV_TRANSPORT, raising=False)


def _c_ring():
    try:
        from telemetry.client._fastlog import Ring
    except ImportError:
        return None
    return Ring


def _c_read():
    try:
        from telemetry.daemon import _hotpath
    except ImportError:
        return None
    return _hotpath.read_ring


def _new(tmp_path: Path, src: int, capacity: int):
    d = tmp_path / "pages"
    d.mkdir(mode=0o700, exist_ok=True)
    path, mapping = ring.create(d, src, capacity)
    return path, mapping


def test_writers_and_readers_agree_byte_for_byte(tmp_path):
    Ring, c_read = _c_ring(), _c_read()
    if Ring is None or c_read is None:
        pytest.skip("the C parts are not built")
    rnd = random.Random(7)
    _, m_c = _new(tmp_path, 1, 4096)
    _, m_py = _new(tmp_path, 2, 4096)
    w_c, w_py = Ring(m_c, zmq.Again, 1 << 20, 40), ring.PyRing(m_py, zmq.Again, 40)
    got_c, got_py, sent = [], [], []
    r_c = r_py = 0
    for _ in range(3000):
        frame = rnd.randbytes(rnd.choice([0, 1, 7, 8, 9, 63, 200, 900, 2000]))
        outcome = []
        for w in (w_c, w_py):
            try:
                w.send(frame, flags=zmq.NOBLOCK)
                outcome.append(True)
            except zmq.Again:
                outcome.append(False)
        assert outcome[0] == outcome[1]
        if outcome[0]:
            sent.append(frame)
        # The 16-byte header differs by the src only; the positions and records are the same.
        assert m_c[ring.WPOS_AT:] == m_py[ring.WPOS_AT:]
        if rnd.random() < 0.3:
            n = rnd.choice([1, 3, 100])
            r_c, taken_c, size_c = c_read(m_c, r_c, got_c, n, 1 << 30, 1 << 20)
            r_py, taken_py, size_py = py_loops.read_ring(m_py, r_py, got_py, n, 1 << 30, 1 << 20)
            assert (r_c, taken_c, size_c) == (r_py, taken_py, size_py)
            assert m_c[ring.RPOS_AT:ring.RPOS_AT + 8] == r_c.to_bytes(8, "little")
    c_read(m_c, r_c, got_c, 1 << 30, 1 << 30, 1 << 20)
    py_loops.read_ring(m_py, r_py, got_py, 1 << 30, 1 << 30, 1 << 20)
    assert got_c == got_py == sent and len(sent) > 1000
    # A frame beyond the limit, or once let go: refused like a full socket.
    with pytest.raises(zmq.Again):
        Ring(m_c, zmq.Again, 100, 1 << 20).send(b"x" * 101)
    # Watched: a send looks at the marker and the reader's /proc entry (every_ns 0: at each send)
    # and calls on_change when either changed; unwatched, it looks no more.
    for w in (w_c, w_py):
        marker, calls = tmp_path / "marker", []
        marker.write_text("1")
        w.watch(os.fsencode(marker), os.lstat(marker).st_ino, os.fsencode(f"/proc/{os.getpid()}"), 0,
                lambda: calls.append(1))
        w.send(b"a")
        assert calls == []
        (tmp_path / "marker.new").write_text("2")
        os.replace(tmp_path / "marker.new", marker)        # another daemon's marker
        w.send(b"b")
        w.send(b"c")
        assert calls == [1, 1]
        w.watch(None, 0, None, 0, None)
        w.send(b"d")
        assert calls == [1, 1]
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        w.watch(os.fsencode(marker), os.lstat(marker).st_ino, os.fsencode(f"/proc/{gone.pid}"), 0,
                lambda: calls.append(2))
        w.send(b"e")                                        # the reader's process gone
        assert calls == [1, 1, 2]

        def fails():
            calls.append(3)
            raise OSError("the look failed")

        w.watch(os.fsencode(marker), 1, os.fsencode(f"/proc/{os.getpid()}"), 0, fails)
        before = bytes(m_c[ring.WPOS_AT:ring.WPOS_AT + 8] if w is w_c else m_py[ring.WPOS_AT:ring.WPOS_AT + 8])
        w.send(b"f")                                        # written all the same, nothing raised
        after = bytes(m_c[ring.WPOS_AT:ring.WPOS_AT + 8] if w is w_c else m_py[ring.WPOS_AT:ring.WPOS_AT + 8])
        assert calls == [1, 1, 2, 3] and after != before
        w.watch(None, 0, None, 0, None)
    # Redirected (its reader gone): later frames go to the given send, with their flags; the
    # ring is left as it was.
    for w, m in ((w_c, m_c), (w_py, m_py)):
        before, handed = bytes(m[ring.WPOS_AT:]), []
        w.redirect(lambda frame, flags=0: handed.append((bytes(frame), flags)))
        w.send(b"one")
        w.send(b"two", flags=zmq.NOBLOCK)
        assert handed == [(b"one", 0), (b"two", zmq.NOBLOCK)] and bytes(m[ring.WPOS_AT:]) == before
    w_c.release()
    w_py.release()
    for w in (w_c, w_py):
        with pytest.raises(zmq.Again):
            w.send(b"late")


def test_a_writer_whose_reader_beats_makes_no_look(tmp_path):
    """While the reader's beat in the header is younger than the look's period, a writer knows it
    reads without a system call: a replaced marker is not even looked at then. Once the beat is
    older (the reader stopped looking: gone, drained, stopped), the look is made and sees it."""
    writers = [("py", ring.PyRing)]
    if _c_ring() is not None:
        writers.append(("c", lambda m, err, n: _c_ring()(m, err, ring.MAX_FRAME_BYTES, n)))
    every_ns = 50_000_000
    for i, (name, make) in enumerate(writers):
        _, m = _new(tmp_path, 10 + i, ring.DEFAULT_CAPACITY)
        w = make(m, zmq.Again, 1000)
        marker, calls = tmp_path / f"marker-{name}", []
        marker.write_text("1")
        w.watch(os.fsencode(marker), os.lstat(marker).st_ino, os.fsencode(f"/proc/{os.getpid()}"), every_ns,
                lambda: calls.append(name))
        (tmp_path / "marker.new").write_text("2")
        os.replace(tmp_path / "marker.new", marker)        # another daemon's marker: a look would see it
        for _ in range(3):
            time.sleep(0.06)                                # the look is due at each send
            m[ring.BEAT_AT:ring.BEAT_AT + 8] = time.monotonic_ns().to_bytes(8, "little")
            w.send(b"a")
        assert calls == [], name                            # it beat: no look
        m[ring.BEAT_AT:ring.BEAT_AT + 8] = (time.monotonic_ns() - 2 * every_ns).to_bytes(8, "little")
        time.sleep(0.06)
        w.send(b"b")
        assert calls == [name], name                        # an old beat: looked, and the marker changed
        m[ring.BEAT_AT:ring.BEAT_AT + 8] = bytes(8)         # a reader that never beats (a version before)
        time.sleep(0.06)
        w.send(b"c")
        assert calls == [name, name], name
        # A beat a period ahead of this clock (a reader in another time namespace) is no beat.
        m[ring.BEAT_AT:ring.BEAT_AT + 8] = (time.monotonic_ns() + 10 * every_ns).to_bytes(8, "little")
        time.sleep(0.06)
        w.send(b"d")
        assert calls == [name, name, name], name
        w.watch(None, 0, None, 0, None)
        w.release()


def test_the_daemon_beats_in_the_rings_it_reads(make_daemon):
    """A daemon stores its beat in each ring it holds while it runs (at most every BEAT_EVERY_S),
    and no more once drained."""
    from telemetry import TelemetryClient

    d = make_daemon()
    tm = TelemetryClient(d.ingest, rank=0)
    assert tm._ring is not None
    tm.log(0, {"loss": 1.0})
    d.wait_for(lambda rs: any(r.get("step") == 0 for r in rs), kind="metrics")
    path = _pages(d) / ring.ring_name(tm._src)

    def beat() -> int:
        with open(path, "rb") as f:
            return int.from_bytes(f.read(ring.HEADER_BYTES)[ring.BEAT_AT:ring.BEAT_AT + 8], "little")

    seen = [beat()]
    deadline = time.monotonic() + 30                         # a hang detector: a beat comes every 0.25 s
    while len(set(seen)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        seen.append(beat())
    assert len(set(seen)) >= 3 and seen == sorted(seen), seen
    assert 0 <= time.monotonic_ns() - seen[-1] < 30e9, seen   # the host's monotonic clock, ns
    d.drain()
    d.proc.wait(60)
    last = beat()                          # the client lives on: its ring stays, and gets no beat
    time.sleep(3 * ring.BEAT_EVERY_S)
    assert beat() == last
    tm.close(timeout_s=0.5)


@pytest.mark.parametrize("damage", ["write position past the capacity", "a length beyond a frame",
                                    "a record past the write position"])
def test_readers_refuse_impossible_rings(tmp_path, damage):
    readers = [py_loops.read_ring] + ([_c_read()] if _c_read() is not None else [])
    for i, read in enumerate(readers):
        _, m = _new(tmp_path, 10 + i, 1024)
        w = ring.PyRing(m, zmq.Again, 1 << 20)
        w.send(b"good")
        good_end = ring.record_bytes(4)
        if damage == "write position past the capacity":
            m[ring.WPOS_AT:ring.WPOS_AT + 8] = (5000).to_bytes(8, "little")
        elif damage == "a length beyond a frame":
            w.send(b"bad!")
            m[ring.HEADER_BYTES + good_end:ring.HEADER_BYTES + good_end + 4] = (1 << 21).to_bytes(4, "little")
        else:
            w.send(b"bad!")
            m[ring.HEADER_BYTES + good_end:ring.HEADER_BYTES + good_end + 4] = (600).to_bytes(4, "little")
        out: list = []
        with pytest.raises(ValueError):
            read(m, 0, out, 100, 1 << 30, 1 << 20)
        if damage != "write position past the capacity":
            # What came before the damage is read, and the read position stops after it.
            assert out == [b"good"]
            assert int.from_bytes(m[ring.RPOS_AT:ring.RPOS_AT + 8], "little") == good_end


def test_one_look_gives_the_frames_of_every_ring_in_the_order_they_were_made(tmp_path):
    """A ring made after the last listing is attached before a look reads any (a rank's hello,
    written before another rank's step, comes before it); a frame made after the look began
    (its writer may have written it after an earlier-read ring was read) waits for the next
    look, and the bye's read and the drain give what is held."""
    from protocol.codec import encode_hello, encode_metrics, peek_header
    from telemetry.daemon.rings import RingSet

    d = tmp_path / "pages"
    d.mkdir(mode=0o700)
    rs = RingSet(d)
    rs.start()
    if rs.watch_fd is None:
        pytest.skip("no inotify here: new rings are found by listing alone")

    def writer(src):
        return ring.PyRing(ring.create(d, src, 4096)[1], zmq.Again, 1000)

    def made(got):
        return [(peek_header(f)[1], peek_header(f)[3]) for f in got]     # (src, seq)

    try:
        wa = writer(1)
        wa.send(encode_metrics(1, 0, 0, 0, time.time_ns(), 0, {"a": 1.0}))
        assert made(rs.read(1 << 20)) == [(1, 0)]
        wb = writer(2)                      # after the look's listing; no poll told the daemon
        wb.send(encode_hello(2, 1, 0, 0, time.time_ns(), {"world_size": 2}))
        wa.send(encode_metrics(1, 0, 1, 0, time.time_ns(), 1, {"a": 2.0}))
        assert made(rs.read(1 << 20)) == [(2, 0), (1, 1)]
        # Made "during" the look (its time past the look's start): held, and given next time in
        # its place among what the other ring had.
        wa.send(encode_metrics(1, 0, 2, 0, time.time_ns() + 10**9, 2, {"a": 3.0}))
        assert rs.read(1 << 20) == [] and rs.ready
        wb.send(encode_metrics(2, 1, 1, 0, time.time_ns(), 1, {"b": 1.0}))
        assert made(rs.read(1 << 20)) == [(2, 1), (1, 2)] and not rs.ready
        # Held when the client's bye comes: its ring read to its end gives it first.
        wa.send(encode_metrics(1, 0, 3, 0, time.time_ns() + 10**9, 3, {"a": 4.0}))
        assert rs.read(1 << 20) == []
        wa.send(encode_metrics(1, 0, 4, 0, time.time_ns(), 4, {"a": 5.0}))
        assert made(rs.read_all(1)) == [(1, 3), (1, 4)]
        # A bye read off the socket after its client's whole run (the loop starved meanwhile):
        # every ring is looked at first, so a ring made since the last look (another rank's
        # hello, made before this client's steps) comes before them, not after its bye.
        from protocol.codec import encode_bye

        wd = writer(4)
        wd.send(encode_metrics(4, 3, 0, 0, time.time_ns(), 0, {"d": 1.0}))
        assert made(rs.read(1 << 20)) == [(4, 0)]
        we = writer(5)
        we.send(encode_hello(5, 4, 0, 0, time.time_ns(), {"world_size": 5}))
        wd.send(encode_metrics(4, 3, 1, 0, time.time_ns(), 1, {"d": 2.0}))
        wd.send(encode_metrics(4, 3, 2, 0, time.time_ns(), 2, {"d": 3.0}))
        bye = encode_bye(4, 3, 3, 0, time.time_ns(), {})
        assert made(rs.before_byes([bye])) == [(5, 0), (4, 1), (4, 2), (4, 3)]
        # Held at the drain: given too.
        wc = writer(3)
        wb.send(encode_metrics(2, 1, 2, 0, time.time_ns() + 10**9, 2, {"b": 2.0}))
        wc.send(encode_metrics(3, 2, 0, 0, time.time_ns() + 10**9, 0, {"c": 1.0}))
        assert rs.read(1 << 20) == []
        wc.send(encode_metrics(3, 2, 1, 0, time.time_ns(), 1, {"c": 2.0}))
        assert sorted(made(rs.drain())) == [(2, 2), (3, 0), (3, 1)]
    finally:
        rs.stop()


# -- with a daemon ---------------------------------------------------------------------------------
def _pages(d) -> Path:
    return Path(d.ingest[len("ipc://"):] + ".clients")


def test_a_local_client_sends_through_its_ring_in_call_order(make_daemon):
    from telemetry import TelemetryClient

    d = make_daemon()
    assert (_pages(d) / ring.MARKER).exists()
    tm = TelemetryClient(d.ingest, rank=0)
    assert tm._ring is not None and tm._ring_path.exists()
    torch = sys.modules.get("torch")
    for i in range(120):
        if torch is not None and i % 3 == 0:
            tm.log(i, {"loss": torch.tensor(float(i))})        # the sender thread's, in turn
        else:
            tm.log(i, {"loss": float(i)})
        if i % 40 == 0:
            tm.event("eval_done", {"step": i})
            tm.hello({"config": {"i": i}})
            time.sleep(0.05)                                   # the slow cadence too
    path = tm._ring_path
    tm.close(timeout_s=10.0)
    recs = d.wait_for(lambda rs: len([r for r in rs if r.get("kind") == "metrics"]) >= 120, kind="metrics")
    assert [r["step"] for r in recs] == list(range(120))
    assert all(r["values"]["loss"] == float(r["step"]) for r in recs)
    status = d.status()
    assert status["intake"]["rings"]["attached"] == 1 and status["intake"]["rings"]["frames"] >= 120 + 3 * 2 + 1
    final = d.drain()
    assert final["records_lost"] == 0 and final["records_malformed"] == 0, final
    assert not path.exists(), "the daemon removes a ring once it has its client's bye"
    assert not (_pages(d) / ring.MARKER).exists(), "the marker goes with the daemon's drain"


def _client_script(endpoint: str, body: str) -> str:
    return textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from telemetry import TelemetryClient
        tm = TelemetryClient({endpoint!r}, rank=0)
        print("ring", tm._ring is not None, flush=True)
    """) + textwrap.dedent(body)


def test_what_a_killed_client_wrote_is_still_read(make_daemon, tmp_path):
    d = make_daemon()
    script = tmp_path / "killed.py"
    script.write_text(_client_script(d.ingest, """
        for i in range(500):
            tm.log(i, {"loss": float(i)})
        os.kill(os.getpid(), signal.SIGKILL)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL and "ring True" in out.stdout, out.stderr
    recs = d.wait_for(lambda rs: len(rs) >= 500, kind="metrics")
    assert [r["step"] for r in recs] == list(range(500))
    final = d.drain()
    assert final["records_lost"] == 0, final


def test_no_ring_where_no_daemon_reads_rings(make_daemon, tmp_path, monkeypatch):
    from telemetry import TelemetryClient

    # A daemon told to take the socket only leaves no marker: its clients send as before.
    d = make_daemon(env={ring.ENV_TRANSPORT: "zmq"})
    assert not (_pages(d) / ring.MARKER).exists()
    tm = TelemetryClient(d.ingest, rank=0)
    assert tm._ring is None
    tm.log(1, {"loss": 1.0})
    tm.close()
    d.wait_for(lambda rs: any(r.get("step") == 1 for r in rs), kind="metrics")
    assert d.drain()["records_lost"] == 0

    # Beside a daemon that reads rings: a client told nothing writes one (the default); a client
    # told zmq does not.
    d2 = make_daemon()
    tm = TelemetryClient(d2.ingest, rank=0)
    assert tm._ring is not None
    tm.close()
    monkeypatch.setenv(ring.ENV_TRANSPORT, "zmq")
    tm = TelemetryClient(d2.ingest, rank=0)
    assert tm._ring is None
    tm.log(2, {"loss": 2.0})
    tm.close()
    monkeypatch.delenv(ring.ENV_TRANSPORT)
    d2.wait_for(lambda rs: any(r.get("step") == 2 for r in rs), kind="metrics")
    assert d2.drain()["records_lost"] == 0

    # A marker left by a daemon killed before its drain names a process that is gone.
    pages = tmp_path / "stale.sock.clients"
    pages.mkdir(mode=0o700)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (pages / ring.MARKER).write_text(f"{gone.pid} 12345\n")
    assert not ring.reader_alive(pages)
    # ... and one of a live process whose start time differs (its pid reused) neither.
    (pages / ring.MARKER).write_text(f"{os.getpid()} 1\n")
    assert not ring.reader_alive(pages)
    ring.advertise(pages)
    assert ring.reader_alive(pages)
    os.chmod(pages, 0o755)                     # a directory others may enter: not believed
    assert not ring.reader_alive(pages)


def test_a_full_ring_drops_and_counts(make_daemon):
    from telemetry import TelemetryClient

    d = make_daemon()
    tm = TelemetryClient(d.ingest, rank=0)
    assert tm._ring is not None
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        n = 0
        while tm.stats()["dropped"] == 0 and n < 200_000:
            tm.log(n, {"loss": float(n), "acc": 0.5})
            n += 1
        for i in range(n, n + 100):
            tm.log(i, {"loss": float(i), "acc": 0.5})
        dropped = tm.stats()["dropped"]
        assert 100 <= dropped < n
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    tm.close(timeout_s=10.0)
    final = d.drain()
    # Every record the ring refused is lost, counted by the client and said in-band: exactly.
    assert final["records_lost"] == dropped, final
    assert final["records_in"] == n + 100 - dropped + 2, final       # and the hello and the bye


def test_rings_no_client_wrote_are_not_read(make_daemon, tmp_path):
    from telemetry import TelemetryClient

    d = make_daemon()
    pages = _pages(d)
    # Planted where a ring would be: a link, a file of the wrong size, one of a bad magic.
    target = tmp_path / "elsewhere"
    target.write_bytes(b"\0" * (ring.HEADER_BYTES + 4096))
    os.symlink(target, pages / ring.ring_name(0xAAAA))
    (pages / ring.ring_name(0xBBBB)).write_bytes(b"\0" * 100)
    bad = bytearray(ring.HEADER_BYTES + 4096)
    bad[0:8] = b"notaring"
    (pages / ring.ring_name(0xCCCC)).write_bytes(bytes(bad))
    # A real client's ring, broken afterwards (its write position made impossible).
    tm = TelemetryClient(d.ingest, rank=0)
    tm.log(1, {"loss": 1.0})
    d.wait_for(lambda rs: any(r.get("step") == 1 for r in rs), kind="metrics")
    with open(tm._ring_path, "r+b") as f:
        f.seek(ring.WPOS_AT)
        f.write((1 << 40).to_bytes(8, "little"))
    tm.log(2, {"loss": 2.0})
    deadline = time.monotonic() + 60
    while d.status()["intake"]["rings"]["rings_broken"] < 1:
        assert time.monotonic() < deadline, d.output()[-2000:]
        time.sleep(0.05)
    status = d.status()
    assert status["intake"]["rings"]["attached"] == 1, status["intake"]
    tm.close()
    final = d.drain()
    assert d.proc.returncode == 0
    # Record 2 is lost (its ring broken before it was read), and counted so by the bye.
    assert final["records_lost"] == 1, final
    assert "broken" in d.output()
    assert os.path.islink(pages / ring.ring_name(0xAAAA)) and target.stat().st_size == ring.HEADER_BYTES + 4096


def test_a_restarted_daemon_reads_the_rings_of_live_clients(make_daemon, tmp_path):
    from telemetry import TelemetryClient

    d = make_daemon()
    endpoints = (d.ingest, d.pub, d.control)
    tm = TelemetryClient(d.ingest, rank=0)
    tm.log(0, {"loss": 0.0})
    d.wait_for(lambda rs: any(r.get("step") == 0 for r in rs), kind="metrics")
    d.kill()
    for i in range(1, 50):                     # no daemon: they wait in the ring
        tm.log(i, {"loss": float(i)})
    d2 = make_daemon(endpoints=endpoints, log_dir=d.log_dir)
    tm.log(50, {"loss": 50.0})
    d2.wait_for(lambda rs: len({r["step"] for r in rs}) >= 51, kind="metrics")
    tm.close()
    final = d2.drain()
    # Every record logged while no daemon ran waited in the ring and was written. The hello and
    # step 0, taken by the killed daemon, count as lost in transit unless its last checkpoint
    # held them (as on the socket: a restart's accounting begins at what its predecessor kept).
    assert final["per_rank"]["0"]["received"] >= 51 - 2 + 1 and final["records_lost"] <= 2, final


def test_a_client_whose_ring_reader_is_gone_sends_on_the_socket(make_daemon):
    """The daemon that read a client's ring drained, and the one started next on its endpoints
    reads no rings (an older version, or told TELEMETRY_TRANSPORT=zmq): within a second the
    client's frames go on the socket, and the new daemon has them; while no daemon at all was
    there, its ring kept them (a successor that reads rings would read them). What the client
    wrote into its ring before it noticed is lost, counted by the new daemon's accounting (it
    knows the client from its predecessor's checkpoint)."""

    from telemetry import TelemetryClient

    d = make_daemon()
    endpoints = (d.ingest, d.pub, d.control)
    tm = TelemetryClient(d.ingest, rank=0)
    assert tm._ring is not None
    for i in range(5):
        tm.log(i, {"loss": float(i)})
    d.wait_for(lambda rs: any(r.get("step") == 4 for r in rs), kind="metrics")
    bound = ring._ingest_ino(_pages(d))
    assert d.drain()["records_lost"] == 0
    d.proc.wait(60)                            # gone: its drain read what its clients' rings held
    # Drained, no daemon there: the client's look finds no reader and no other daemon bound: the
    # ring keeps what comes (a successor reading rings would read it).
    tm._ring.watch(os.fsencode(_pages(d) / ring.MARKER), 1, b"/proc/1", 0,
                   ring.reader_changed(tm._ring, _pages(d), tm._ring_reader_gone, bound))
    tm.log(100, {"loss": 100.0})
    d2 = make_daemon(endpoints=endpoints, log_dir=d.log_dir, env={ring.ENV_TRANSPORT: "zmq"})
    # The client's ring watched as by the old daemon: its next look a second from now.
    tm._ring.watch(os.fsencode(_pages(d) / ring.MARKER), 1, b"/proc/1", ring.WATCH_EVERY_NS,
                   ring.reader_changed(tm._ring, _pages(d), tm._ring_reader_gone, bound))
    for i in range(5, 8):                      # before the client's next look: into the ring, unread
        tm.log(i, {"loss": float(i)})
    time.sleep(1.2)
    for i in range(8, 20):
        tm.log(i, {"loss": float(i)})
    d2.wait_for(lambda rs: any(r.get("step") == 19 for r in rs), kind="metrics")
    tm.close()
    final = d2.drain()
    steps = {r["step"] for r in d2.read_jsonl(kind="metrics")}
    # Step 100 (no daemon then) and 5-7 (before the client's look) went into the ring: lost to a
    # daemon that reads none, and counted.
    assert set(range(8, 20)) <= steps and not steps & {100, 5, 6, 7}, sorted(steps)
    assert final["records_lost"] == 4, final


def test_a_forked_child_writes_a_ring_of_its_own(make_daemon, tmp_path):
    d = make_daemon(world_size=2)
    script = tmp_path / "fork.py"
    script.write_text(_client_script(d.ingest, """
        for i in range(300):
            tm.log(i, {"loss": float(i)})
        pid = os.fork()
        if pid == 0:
            child = TelemetryClient({endpoint!r}, rank=1)
            for i in range(300):
                tm.log(300 + i, {"loss": 1.0})         # the parent's client, in the child: its own ring
                child.log(i, {"loss": 2.0})
            os._exit(0)                                 # no close, no bye: the rings hold it all
        os.waitpid(pid, 0)
        for i in range(300, 310):
            tm.log(i, {"loss": float(i)})
        tm.close(timeout_s=10.0)
    """.replace("{endpoint!r}", repr(d.ingest))))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ring True" in out.stdout, out.stderr
    final = d.drain()
    # Three clients (the parent's, its copy in the child, the child's own), none lost a record.
    assert final["records_lost"] == 0, final
    assert final["per_rank"]["0"]["received"] >= 300 + 300 + 10, final
    assert final["per_rank"]["1"]["received"] >= 300, final


@pytest.mark.parametrize("transport", ["ring", "zmq"])
def test_a_client_dropped_unclosed_does_not_hang_the_garbage_collector(make_daemon, tmp_path, transport):
    """A client no one closed (a failed test's, a script's that forgot), collected as garbage:
    its context's finalizer waited for ever on a socket it had not closed, hanging the process in
    whatever allocation set the collector off."""
    d = make_daemon()
    script = tmp_path / "dropped.py"
    script.write_text(textwrap.dedent(f"""
        import gc, sys
        sys.path.insert(0, {str(ROOT)!r})
        from telemetry import TelemetryClient

        def run():
            tm = TelemetryClient({d.ingest!r}, rank=0)
            tm.log(1, {{"loss": 1.0}})
            tm.log(2, {{"loss": 2.0}})

        run()
        gc.collect()
        print("collected", flush=True)
    """))
    env = {**os.environ, **({ring.ENV_TRANSPORT: "zmq"} if transport == "zmq" else {})}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and "collected" in out.stdout, out.stderr


def test_no_room_for_a_ring_keeps_the_client_on_the_socket(make_daemon, monkeypatch):
    """A ring's pages are reserved when it is made: on a full filesystem (a small tmpfs) a write
    into an unbacked page of a sparse file would be SIGBUS in the training process. No room: the
    socket, and every record still arrives."""
    import errno

    from telemetry import TelemetryClient

    d = make_daemon()

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    tm = TelemetryClient(d.ingest, rank=0)
    assert tm._ring is None
    assert not any(n.endswith((".ring", ".new")) for n in os.listdir(_pages(d)))
    for i in range(50):
        tm.log(i, {"loss": float(i)})
    tm.close()
    d.wait_for(lambda rs: len(rs) >= 50, kind="metrics")
    assert d.drain()["records_lost"] == 0
