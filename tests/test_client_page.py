"""A client whose process ends without a bye (SIGKILL, the OOM killer, os._exit, a crash) is
counted exactly by its seq page: every record it took a seq for and never sent is lost, and
counted so; the daemon no longer leaves it "open" with its tail counted by no one.

The children below hold the GIL from their first record to their end (a long switch interval),
so the client's sender thread never runs: what they queued after the first record dies with them,
deterministically."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from telemetry.shared import client_page, ring

N = 2000

_CHILD = r"""
import os, signal, sys, time
sys.setswitchinterval(30.0)
from telemetry.client import TelemetryClient
ep, how, n = sys.argv[1], sys.argv[2], int(sys.argv[3])

def run(rank):
    tm = TelemetryClient(ep, rank=rank)
    time.sleep(0.5)                # the hello's connection made
    for i in range(n):
        tm.log(i, {"train/loss": float(i)})
    return tm

if how == "fork":
    parent = run(0)
    pid = os.fork()
    if pid == 0:
        run(1)                      # the child's own client: a page of its own
        os._exit(3)
    os.waitpid(pid, 0)
    parent.close(timeout_s=10.0)
    sys.exit(0)
tm = run(0)
if how == "exit":
    os._exit(5)
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if how in ("wait", "stay"):
    print("logged", flush=True)
    while not os.path.exists(sys.argv[4]):
        time.sleep(0.05)
    tm.close(timeout_s=10.0)
if how == "stay":                   # closed, and the process goes on
    print("closed", flush=True)
    while not os.path.exists(sys.argv[5]):
        time.sleep(0.05)
"""


def _child(ep: str, how: str, *extra: str) -> subprocess.Popen:
    """On the socket (a client whose daemon reads rings leaves nothing in its own queues to die
    with it: tests/test_rings.py): the pages account for what a socket's queue takes along."""
    return subprocess.Popen([sys.executable, "-c", _CHILD, ep, how, str(N), *extra],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, ring.ENV_TRANSPORT: "zmq"})


def _logged(d, how: str, *files: Path) -> subprocess.Popen:
    """A child that logged N records and waits (for `files`), once the daemon has its first."""
    child = _child(d.ingest, how, *map(str, files))
    assert child.stdout.readline().strip() == "logged"
    d.wait_for(lambda rs: sum(1 for r in rs if r.get("kind") == "metrics") >= 1)
    return child


def _drained(d) -> dict:
    assert d.stop(timeout_s=120) in (0, 1), d.output()
    return json.loads((d.log_dir / "drain.json").read_text())


def _rows(d, rank: int) -> int:
    return sum(1 for r in d.read_jsonl("metrics") if r.get("rank") == rank or (r.get("ranks") == 1 and rank == 0))


def _read(directory: Path, src: int):
    with client_page.PageDir(directory) as pages:
        return pages.read(src)


def _pages(d) -> list[str]:
    """The seq pages there (not the rings beside them, nor the daemon's marker: test_rings.py)."""
    directory = client_page.page_dir(d.ingest)
    return sorted(n for n in os.listdir(directory) if len(n) == 16) if directory.is_dir() else []


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_client_that_dies_without_a_bye_is_counted_by_its_page(make_daemon, how):
    d = make_daemon(world_size=1)
    child = _child(d.ingest, how)
    assert child.wait(timeout=60) == (5 if how == "exit" else -signal.SIGKILL)
    final = _drained(d)
    rank = final["per_rank"]["0"]
    # The hello and N records took seqs 0..N: each was written or is counted lost.
    assert rank["received"] + rank["refused"] + rank["lost"] == N + 1, final
    assert rank["open"] == 0 and final["sources_open_at_drain"] == 0, final
    assert final["sources_ended_by_page"] == 1, final
    # The sender thread never ran: at most the first record (sent by the caller) arrived.
    assert final["records_lost_with_client"] >= N - 1, final
    assert final["records_lost"] >= final["records_lost_with_client"], final
    assert "ended without a bye" in d.output()
    assert _pages(d) == []                          # used, then removed


def test_a_forked_child_has_its_own_page_and_the_parent_stays_exact(make_daemon):
    d = make_daemon(world_size=2)
    child = _child(d.ingest, "fork")
    assert child.wait(timeout=60) == 0
    final = _drained(d)
    parent, forked = final["per_rank"]["0"], final["per_rank"]["1"]
    # The parent closed with its bye: all of its records arrived, none lost.
    assert parent["received"] == N + 2 and parent["lost"] == 0, final     # hello, N records, bye
    # The child died with its queue; its own page counted it (the parent's page was not touched).
    assert forked["received"] + forked["lost"] == N + 1 and forked["lost"] >= N - 1, final
    assert final["sources_ended_by_page"] == 1 and final["sources_open_at_drain"] == 0, final
    assert _pages(d) == []


def test_a_live_client_is_not_ended_by_its_page(make_daemon, tmp_path):
    """The neighbour: a client still alive at the drain (silent, not closed) keeps its page and
    stays open: a page that still moves is never believed. Its close, with the daemon gone, keeps
    the page too (its bye reached no one: a daemon next on the socket accounts for it)."""
    d = make_daemon(world_size=1)
    go = tmp_path / "go"
    child = _child(d.ingest, "wait", str(go))
    try:
        assert child.stdout.readline().strip() == "logged"
        assert len(_pages(d)) == 1
        final = _drained(d)
        assert final["sources_ended_by_page"] == 0 and final["records_lost_with_client"] == 0, final
        assert final["per_rank"]["0"]["open"] == 1, final
        assert len(_pages(d)) == 1
    finally:
        go.touch()
    assert child.wait(timeout=60) == 0
    assert len(_pages(d)) == 1


def test_a_clean_close_leaves_no_page(daemon, tmp_path):
    """A client's page stays after its close until a daemon has its bye (a daemon that took the
    bye's connection may die before it reads it), and goes at that daemon's drain; a client that
    never met a daemon removes it at close."""
    from telemetry.client import TelemetryClient

    tm = TelemetryClient(daemon.ingest, rank=0)
    tm.log(1, {"a": 1.0})
    assert len(_pages(daemon)) == 1
    tm.close(timeout_s=10.0)
    assert len(_pages(daemon)) == 1             # until the daemon has read the bye
    final = _drained(daemon)
    assert final["per_rank"]["0"]["lost"] == 0 and final["sources_ended_by_page"] == 0, final
    assert _pages(daemon) == []
    ep = f"ipc://{tmp_path}/nobody.sock"
    alone = TelemetryClient(ep, rank=0)
    try:
        alone.log(1, {"a": 1.0})
    finally:
        alone.close(timeout_s=2.0)
    assert os.listdir(client_page.page_dir(ep)) == []


def test_only_a_regular_page_of_ours_is_believed(tmp_path):
    ep = f"ipc://{tmp_path}/ingest.sock"
    directory = client_page.page_dir(ep)
    page = client_page.ClientPage.create(ep, 7, rank=3)
    assert page.path == client_page.page_path(directory, 7)
    page.seqs[0] = 41
    info = _read(directory, 7)
    assert info is not None and (info.next_seq, info.pid, info.rank) == (41, os.getpid(), 3)
    assert client_page.same_namespace(info, client_page.pid_namespace()) and not client_page.process_gone(info)
    # A symlink at a page's place, a short file, a wrong magic: not pages.
    os.symlink(page.path, client_page.page_path(directory, 8))
    client_page.page_path(directory, 9).write_bytes(b"\0" * 8)
    client_page.page_path(directory, 10).write_bytes(b"x" * client_page.SIZE)
    for src in (8, 9, 10):
        assert _read(directory, src) is None
    (directory / "not-a-page").write_bytes(b"")
    with client_page.PageDir(directory) as pages:
        assert sorted(pages.listed()) == [7, 8, 9, 10]
    # A pages directory that is a symlink is not read at all (nor anything removed through it).
    os.symlink(directory, tmp_path / "linked.sock.clients")
    with client_page.PageDir(tmp_path / "linked.sock.clients") as pages:
        assert pages.listed() == [] and pages.read(7) is None and not pages.remove(9)
    assert client_page.page_path(directory, 9).exists()
    page.remove()
    assert not client_page.page_path(directory, 7).exists()
    # Another socket in the same directory has pages of its own.
    assert client_page.page_dir(f"ipc://{tmp_path}/other.sock") != directory


def test_no_page_off_ipc():
    page = client_page.ClientPage.create("tcp://127.0.0.1:5555", 1, rank=0)
    assert page.path is None
    page.seqs[0] += 3
    assert page.seqs[0] == 3


def _plant(directory: Path, src: int, pid: int, start: int, ns: int, rank: int, next_seq: int,
           closed: bool = False) -> Path:
    directory.mkdir(mode=0o700, exist_ok=True)
    path = client_page.page_path(directory, src)
    magic = client_page.MAGIC_CLOSED if closed else client_page.MAGIC
    path.write_bytes(client_page._LAYOUT.pack(magic, pid, start, ns, rank, next_seq))
    path.chmod(0o600)
    return path


def _gone_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def test_a_client_the_daemon_never_heard_from_is_counted(make_daemon, tmp_path):
    """A client whose page was made while the daemon ran and that died before any record of it
    arrived (a forked child killed at once, a rank dead before its connection was made) is
    counted from its page: every seq it took lost. A page of a process gone that was there before
    the daemon started is another run's: removed (said in the log), never counted; one of another
    pid namespace (a pid there names another process here) is left alone."""
    import tempfile

    rt = Path(tempfile.mkdtemp(prefix="tpg-", dir="/tmp"))
    rt.chmod(0o700)
    eps = tuple(f"ipc://{rt}/{n}.sock" for n in ("ingest", "pub", "control"))
    directory = client_page.page_dir(eps[0])
    ns = client_page.pid_namespace()
    dead = _gone_pid()
    before = _plant(directory, 0x2222, dead, 1, ns, 0, 50)
    d = make_daemon(world_size=1, endpoints=eps)
    unseen = _plant(directory, 0x1111, dead, 1, ns, 2, 300)
    foreign = _plant(directory, 0x3333, dead, 1, ns + 1, 0, 70)
    # Closed (its bye sent, no daemon read it), in another pid namespace: final all the same.
    foreign_closed = _plant(directory, 0x4444, dead, 1, ns + 1, 3, 40, closed=True)
    made_only = _plant(directory, 0x5555, dead, 1, ns, 4, 0)      # killed before its first record
    final = _drained(d)
    assert final["per_rank"]["2"]["lost"] == 300 and final["per_rank"]["2"]["received"] == 0, final
    assert final["per_rank"]["3"]["lost"] == 40, final
    assert final["records_lost_with_client"] == 300 and final["sources_ended_by_page"] == 1, final
    assert final["sources_closed_by_page"] == 1, final
    assert not unseen.exists() and not before.exists() and foreign.exists() and not foreign_closed.exists()
    assert not made_only.exists() and final["records_seq_bogus"] == 0 and "4" not in final["per_rank"], final
    assert "counted by no daemon" in d.output()


def test_a_zombie_client_is_gone(make_daemon):
    """A client killed and not yet reaped by its parent (a zombie: its pid and start time still
    in /proc) has ended: its page counts what it never sent."""
    d = make_daemon(world_size=1)
    child = _child(d.ingest, "kill")
    deadline = time.monotonic() + 60
    while Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    final = _drained(d)
    assert child.wait(timeout=60) == -signal.SIGKILL
    rank = final["per_rank"]["0"]
    assert rank["received"] + rank["lost"] == N + 1 and final["sources_ended_by_page"] == 1, final


def test_a_client_whose_bye_found_no_daemon_keeps_its_page_for_the_next(make_daemon, tmp_path):
    """The daemon goes (SIGKILL) while a client still sends; the client logs on and closes: its
    bye reaches no one, so it keeps its page, and the daemon restarted on the same log directory
    counts what never reached it once the client's process has ended: exact."""
    d = make_daemon(world_size=1)
    go = tmp_path / "go"
    child = _logged(d, "wait", go)
    try:
        time.sleep(0.5)                     # a checkpoint of the accounting (sources.json)
        d.kill()
    finally:
        go.touch()
    assert child.wait(timeout=60) == 0
    assert len(_pages(d)) == 1
    d2 = make_daemon(world_size=1, log_dir=d.log_dir, endpoints=(d.ingest, d.pub, d.control))
    final = _drained(d2)
    rank = final["per_rank"]["0"]
    # The hello, N records and the bye: each counted by one daemon or the other, or lost. The
    # client closed (its page marked so): its tail was sent, lost in transit.
    assert rank["earlier"] + rank["received"] + rank["refused"] + rank["lost"] == N + 2, final
    assert rank["open"] == 0 and final["sources_closed_by_page"] == 1, final
    assert _pages(d2) == []


def test_a_predecessors_client_that_never_came_back_is_open_at_the_drain(make_daemon, tmp_path):
    """A client in the checkpoint (sources.json) without a bye that never sends again: per_rank
    says it open, and so does sources_open_at_drain, named in the log (before: per_rank 1 open,
    sources_open_at_drain 0, not named). One whose bye the checkpoint holds is neither."""
    log_dir = tmp_path / "run"
    log_dir.mkdir(mode=0o700)
    (log_dir / "sources.json").write_text(json.dumps({"version": 1, "sources": [
        [0x51, 0, 0, 0, 10, 9, 0], [0x52, 1, 0, 0, 5, 4, 0]], "ended": [0x52]}))
    d = make_daemon(world_size=2, per_rank=True, log_dir=log_dir)
    final = _drained(d)
    assert final["per_rank"]["0"]["open"] == 1 and final["per_rank"]["1"]["open"] == 0, final
    assert final["sources_open_at_drain"] == 1, final
    assert "rank 0 (src 81, last seq 9)" in d.output()


def test_a_client_that_closed_while_its_daemon_died_is_counted_while_it_lives(make_daemon, tmp_path):
    """A client closes (its bye sent) and its process goes on; the daemon dies before it read
    the bye (stopped, then killed): the daemon restarted on the log directory takes the closed
    page's seq as the bye's, so what the dead one never wrote is counted lost, not left open
    (before: per_rank open 1 and that tail counted by no one, for as long as the process lived)."""
    d = make_daemon(world_size=1)
    go, done = tmp_path / "go", tmp_path / "done"
    child = _logged(d, "stay", go, done)
    try:
        time.sleep(0.5)                     # a checkpoint of the accounting (sources.json)
        d.proc.send_signal(signal.SIGSTOP)  # it reads nothing more: the bye below reaches no one
        go.touch()
        assert child.stdout.readline().strip() == "closed"
        d.kill()
        (page,) = _pages(d)
        assert _read(client_page.page_dir(d.ingest), int(page, 16)).closed
        d2 = make_daemon(world_size=1, log_dir=d.log_dir, endpoints=(d.ingest, d.pub, d.control))
        final = _drained(d2)
        assert child.poll() is None                  # still running: believed because it closed
    finally:
        done.touch()
    assert child.wait(timeout=60) == 0
    rank = final["per_rank"]["0"]
    # The hello, N records and the bye: each counted by one daemon or the other, or lost.
    assert rank["earlier"] + rank["received"] + rank["refused"] + rank["lost"] == N + 2, final
    assert rank["open"] == 0 and final["sources_open_at_drain"] == 0, final
    assert final["sources_closed_by_page"] == 1 and final["sources_ended_by_page"] == 0, final
    assert final["records_lost_with_client"] == 0, final
    assert "closed with a bye that never arrived" in d2.output()
    assert _pages(d2) == []


def test_a_closed_clients_page_stays_final_whatever_it_logs_after(daemon):
    """log() after close is dropped on the client's side: its seq never reaches the page the close
    marked final (a successor daemon would have counted it as sent and lost in transit), nor does
    a child forked after the close, which shares the page's mapping."""
    from telemetry.client import TelemetryClient

    tm = TelemetryClient(daemon.ingest, rank=0)
    for i in range(5):
        tm.log(i, {"a": 1.0})
    tm.close(timeout_s=10.0)
    directory = client_page.page_dir(daemon.ingest)
    (name,) = _pages(daemon)
    final_seq = _read(directory, int(name, 16)).next_seq
    assert final_seq == 7 and _read(directory, int(name, 16)).closed      # hello, 5 records, bye
    for i in range(3):
        tm.log(10 + i, {"a": 1.0})
    pid = os.fork()
    if pid == 0:
        try:
            tm.log(20, {"a": 1.0})
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert _read(directory, int(name, 16)).next_seq == final_seq
    assert tm.stats()["dropped"] == 3 and tm.stats()["seq"] == final_seq + 3


def test_a_page_not_believed_leaves_its_client_as_it_was(make_daemon, tmp_path):
    """A live client's page rewritten as closed and far ahead of its records (no client makes
    that many unseen) is not believed: counted in records_seq_bogus, the client left open, not
    ended (before: ended, 0 lost, its tail counted by no one)."""
    d = make_daemon(world_size=1)
    go = tmp_path / "go"
    child = _logged(d, "wait", go)
    try:
        (name,) = _pages(d)
        path = client_page.page_dir(d.ingest) / name
        data = bytearray(path.read_bytes())
        data[0:8] = client_page.MAGIC_CLOSED.to_bytes(8, "little")
        data[40:48] = (1 << 40).to_bytes(8, "little")
        path.write_bytes(bytes(data))
        final = _drained(d)
        assert final["records_seq_bogus"] == 1 and final["per_rank"]["0"]["open"] == 1, final
        assert final["sources_ended_by_page"] == 0 and final["sources_open_at_drain"] == 1, final
    finally:
        go.touch()
    assert child.wait(timeout=60) == 0


def test_a_child_forked_while_its_parent_closes_never_moves_the_parents_page(daemon):
    """A fork from another thread while close() waits for its daemon's answer (the client closed,
    its page not marked yet): the child's log() counts in its own memory, not in the page the
    parent is about to mark final."""
    from telemetry.client import TelemetryClient

    tm = TelemetryClient(daemon.ingest, rank=0)
    tm.log(0, {"a": 1.0})
    directory = client_page.page_dir(daemon.ingest)
    (name,) = _pages(daemon)
    before = _read(directory, int(name, 16)).next_seq
    tm._closed = True                 # the window inside close(), before the bye is sent
    try:
        pid = os.fork()
        if pid == 0:
            try:
                for i in range(3):
                    tm.log(1 + i, {"a": 1.0})
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert _read(directory, int(name, 16)).next_seq == before
    finally:
        tm._closed = False
        tm.close(timeout_s=10.0)
