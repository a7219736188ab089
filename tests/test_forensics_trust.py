"""A hello is a claim, never an instruction (issue 26): the daemon signals or reads only processes
it verified itself as this run's local ranks (telemetry/daemon/forensics/verify.py), and the
client's stacks file is created where no other user can put a FIFO or a symlink first.

Real daemons, real processes. "Another local user" is a real process running as uid 65534
(nobody): a fork of this test process that drops to that uid before it sends anything (the
interpreter itself lives where nobody may not exec it). The victims are `sleep` processes of
ours with a secret in their environment; the daemon also has one in its own.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import pytest
import zmq

from daemon_util import ROOT
from protocol import encode_hello
from telemetry.shared.stacks_file import proc_start_time
from test_forensics_ranks import events
from testkit import faults
from testkit.daemon_proc import raw_push

from other_user import OTHER_UID
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
# A hang is declared 2 s after the last step (the floor: the steps come every 50 ms).
HANG = {"hang_min_s": 2.0, "hang_factor": 10.0, "hang_stacks_wait_s": 3.0, "hang_py_spy": False,
        "warmup_steps": 3}

# A genuine rank: five steps, then it hangs (reads stdin until the test closes it).
RANK = r"""
import sys, time
import telemetry
tm = telemetry.TelemetryClient(sys.argv[1], rank=0)
for step in range(1, 6):
    tm.log(step, {"train/loss": 1.0})
    time.sleep(0.05)
sys.stdin.read()
tm.close(timeout_s=1.0)
"""


def as_other_user(fn, *args) -> int:
    """Run fn(*args) in a forked process that first becomes uid/gid 65534; its exit code."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            assert os.getuid() == os.geteuid() == OTHER_UID
            fn(*args)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def send_hellos(endpoint: str, hellos: list[tuple[int, dict]]) -> None:
    """The attacker: forged hellos, each naming a pid, a signal and a file (and the pid's true
    start time, which anyone can read in /proc/<pid>/stat)."""
    ctx = zmq.Context()
    push = raw_push(ctx, endpoint)
    for rank, info in hellos:
        start = proc_start_time(info["pid"])
        assert start is not None
        push.send(encode_hello(4000 + rank, rank, 0, 0, 1, {**info, "start_time": start}))
    push.close(linger=10_000)
    ctx.term()


def forged(victim: subprocess.Popen, bystander: subprocess.Popen, **extra) -> list[tuple[int, dict]]:
    host = socket.gethostname()
    return [  # SIGKILL for a process of ours, reading the daemon's own environment
        (1, {"host": host, "pid": victim.pid, "stacks_signal": 9, "stacks_file": "/proc/self/environ", **extra}),
        # another process's environment (signal 0: "does it exist", to get to the read)
        (2, {"host": host, "pid": bystander.pid, "stacks_signal": 0,
             "stacks_file": f"/proc/{bystander.pid}/environ", **extra})]


def start_rank(endpoint: str, tmp: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}   # its own stacks directory
    env.pop("TELEMETRY_STACKS_DIR", None)
    env.pop("TELEMETRY_STACKS_SIGNAL", None)
    return subprocess.Popen([sys.executable, "-c", RANK, endpoint], stdin=subprocess.PIPE, env=env)


def files_holding(root: Path, *needles: str) -> list[str]:
    found = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                data = Path(path).read_bytes()
            except OSError:
                continue
            found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


def hang_with_forged_hellos(make_daemon, tmp_path: Path, via: str, **daemon_kwargs) -> None:
    """Forged hellos go in first (to `via`: "ingest" or "remote"), then a genuine rank hangs:
    the daemon's hang check fires and collects a bundle. The forged processes come out of it
    untouched; the genuine rank's stacks are in it."""
    daemon_secret, victim_secret = secrets.token_hex(16), secrets.token_hex(16)
    d = make_daemon(world_size=1, env={"TEST_DAEMON_SECRET": daemon_secret},
                    config={"diagnosis": HANG, "pollers": {"nvml_enabled": False}}, **daemon_kwargs)
    victim_env = {**os.environ, "WANDB_API_KEY": victim_secret}
    victim = subprocess.Popen(["sleep", "600"], env=victim_env)
    bystander = subprocess.Popen(["sleep", "600"], env=victim_env)
    endpoint = d.ingest if via == "ingest" else daemon_kwargs["extra_args"][1]
    rank = None
    try:
        assert as_other_user(send_hellos, endpoint, forged(victim, bystander)) == 0
        d.wait_for(lambda rs: {r.get("rank") for r in rs if r["kind"] == "hello"} >= {1, 2}, timeout_s=60)
        rank = start_rank(d.ingest, tmp_path)
        recs = d.wait_for(lambda rs: bool(events(rs, "diagnosis/hang")), timeout_s=90)
        killed = [p.returncode for p in (victim, bystander) if p.poll() is not None]
    finally:
        for p in (victim, bystander):
            p.kill()
            p.wait(30)
        if rank is not None:
            rank.kill()
            rank.wait(30)
    # Nothing killed, no secret in any file the daemon wrote (the old daemon did both).
    leaked = files_holding(d.log_dir, daemon_secret, victim_secret)
    assert not killed and not leaked, f"killed: {killed}, secrets in: {leaked}"
    (ev,) = events(recs, "diagnosis/hang")
    bundle = Path(ev["data"]["bundle"])
    assert sorted(p.name for p in bundle.iterdir()) == ["rank0.json", "summary.json", "summary.txt"]
    rank0 = json.loads((bundle / "rank0.json").read_text())
    assert "most recent call first" in rank0["python_stacks"], rank0["python_stacks"]     # still works
    summary = json.loads((bundle / "summary.json").read_text())
    assert set(summary["ranks_unverified"]) == {"1", "2"}, summary
    # Private: the bundle is the owner's alone.
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o700 and stat.S_IMODE(bundle.parent.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in bundle.iterdir()} == {0o600}
    d.drain()


@needs_root
def test_forged_hellos_on_loopback_tcp_neither_kill_nor_leak(make_daemon, tmp_path):
    """Another user's hellos name a process of ours with SIGKILL and /proc/self/environ, and
    another with its /proc/<pid>/environ: the old daemon killed the first and copied both
    environments (the daemon's, the bystander's W&B key) into a bundle."""
    hang_with_forged_hellos(make_daemon, tmp_path, "ingest", transport="tcp")


@needs_root
def test_forged_hellos_through_the_remote_ingest_cause_no_local_action(make_daemon, tmp_path):
    """The same hellos from a "node daemon" on --remote-ingest, claiming the head's host and
    no forwarding: a record from the remote ingest never leads to a local signal or read."""
    port = faults.free_port()
    hang_with_forged_hellos(make_daemon, tmp_path, "remote", extra_args=("--remote-ingest", f"tcp://127.0.0.1:{port}"))


# -- the client's stacks directory -----------------------------------------------------------
CLIENT = r"""
import json, sys
import telemetry
sys.stdin.readline()                  # the test plants things for this pid first
tm = telemetry.TelemetryClient(sys.argv[1], rank=0)
print(json.dumps(tm._stacks_hello), flush=True)
tm.close(timeout_s=0.5)
"""


def _plant(kind: str, stacks_dir: Path, theirs: Path, pid: int) -> None:
    """What the client finds at its stacks directory's path that is not its own (another user's
    directory, a link, a FIFO) before it starts."""
    name = f"stacks-rank0-pid{pid}.txt"
    if kind == "dir_symlink":            # the directory is a symlink to theirs
        stacks_dir.symlink_to(theirs.parent)
        return
    stacks_dir.mkdir(mode=0o777)
    stacks_dir.chmod(0o777)
    if kind == "fifo":                   # their directory, a FIFO at the file's name: open() blocked forever
        os.mkfifo(stacks_dir / name, 0o666)
        os.chown(stacks_dir / name, OTHER_UID, OTHER_UID)
    elif kind == "file_symlink":         # their directory, a symlink to their file at the file's name
        (stacks_dir / name).symlink_to(theirs)
        os.lchown(stacks_dir / name, OTHER_UID, OTHER_UID)
    if kind == "own_dir_fifo":           # our own private directory, a FIFO in it: refused, not waited on
        stacks_dir.chmod(0o700)
        os.mkfifo(stacks_dir / name, 0o600)
        return
    os.chown(stacks_dir, OTHER_UID, OTHER_UID)


def _stacks_env(base: Path) -> dict:
    """A client's environment whose private directory (telemetry/shared/userdir.py) is
    `base`/telemetry-<uid>: $TMPDIR, no session runtime directory, a home without a fallback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(base), "HOME": str(base / "home")}
    for name in ("TELEMETRY_STACKS_DIR", "TELEMETRY_STACKS_SIGNAL", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME"):
        env.pop(name, None)
    return env


@needs_root
@pytest.mark.parametrize("kind", ["fifo", "file_symlink", "dir_symlink", "other_users_dir", "own_dir_fifo"])
def test_a_stacks_path_planted_by_another_user_is_refused_without_blocking(tmp_path, kind):
    base = Path(tempfile.mkdtemp(prefix="tst-", dir="/tmp"))       # TMPDIR of the client
    theirs_dir = base / "theirs"
    theirs_dir.mkdir()
    theirs = theirs_dir / "theirs.txt"
    theirs.write_text("their own file\n")
    theirs.chmod(0o644)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    os.chown(theirs_dir, OTHER_UID, OTHER_UID)
    (base / f"telemetry-{os.geteuid()}").mkdir(mode=0o700)            # the user's private directory
    stacks_dir = base / f"telemetry-{os.geteuid()}" / "stacks"
    env = _stacks_env(base)
    endpoint = f"tcp://127.0.0.1:{faults.free_port()}"   # TCP: the stacks go in the user's directory
    p = subprocess.Popen([sys.executable, "-c", CLIENT, endpoint], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        _plant(kind, stacks_dir, theirs, p.pid)
        try:
            out, err = p.communicate("go\n", timeout=60)         # a hang detector, not a deadline
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            pytest.fail(f"TelemetryClient() hung on a planted {kind}: {err[-2000:]}")
        assert p.returncode == 0, err[-2000:]
        hello = json.loads(out.strip().splitlines()[-1])
        assert "stacks_signal" not in hello and "stacks_file" not in hello, hello
        assert hello["stacks_unavailable"], hello                    # off, and it says why
        st = theirs.stat()
        assert theirs.read_text() == "their own file\n" and stat.S_IMODE(st.st_mode) == 0o644
        assert st.st_uid == OTHER_UID
        if kind != "dir_symlink":
            assert not any(stat.S_ISREG(os.lstat(f).st_mode) for f in stacks_dir.iterdir()), list(stacks_dir.iterdir())
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(30)


def test_the_stacks_directory_is_made_private_and_the_file_says_who_holds_it(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="tst-", dir="/tmp"))
    env = _stacks_env(base)
    endpoint = f"tcp://127.0.0.1:{faults.free_port()}"
    # The file is looked at while its process lives: at its exit it is removed.
    looks = CLIENT.replace("tm.close(", "p = tm._stacks_hello['stacks_file']; "
                                        "print(json.dumps([oct(os.lstat(p).st_mode), open(p).readline()]), flush=True); "
                                        "tm.close(").replace("import json, sys", "import json, os, sys")
    p = subprocess.run([sys.executable, "-c", looks, endpoint], input="go\n", capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    hello, (mode, first) = (json.loads(line) for line in p.stdout.strip().splitlines()[-2:])
    path = Path(hello["stacks_file"])
    assert path.parent == base / f"telemetry-{os.geteuid()}" / "stacks"
    assert stat.S_IMODE(path.parent.lstat().st_mode) == 0o700 and stat.S_IMODE(int(mode, 8)) == 0o600
    assert first.rstrip("\n") == f"telemetry-stacks v1 rank=0 pid={path.name.split('pid')[1][:-4]} " \
                                  f"signal={hello['stacks_signal']}"
    assert not path.exists()


# -- the verifier, against processes made to fit each check but one ---------------------------
# A process of ours holding a stacks file (first line as given, PID filled in) and a connection.
HOLDER = r"""
import os, signal, sys, time, zmq
endpoint, stacks_dir, header, catch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rank = header.split("rank=")[1].split()[0]
if catch:
    signal.signal(catch, lambda *a: None)
f = open(os.path.join(stacks_dir, f"stacks-rank{rank}-pid{os.getpid()}.txt"), "w")
f.write(header.replace("PID", str(os.getpid())) + "\n")
f.flush()
ctx = zmq.Context()
push = ctx.socket(zmq.PUSH)
push.connect(endpoint)
push.send(b"x")
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("case", ["ok", "unsafe_signal", "not_caught", "wrong_rank", "wrong_start", "other_port",
                                  "forwarded"])
def test_the_verifier_believes_a_claim_only_when_every_check_holds(tmp_path, case):
    import signal

    from telemetry.daemon.forensics.verify import LocalRank, Verifier

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    other = ctx.socket(zmq.PULL)
    other_port = other.bind_to_random_port("tcp://127.0.0.1")
    sig = {"unsafe_signal": signal.SIGTERM}.get(case, signal.SIGUSR2)
    catch = 0 if case == "not_caught" else int(sig)
    claimed_rank = 3
    header_rank = 4 if case == "wrong_rank" else claimed_rank
    connect = other_port if case == "other_port" else port
    p = subprocess.Popen([sys.executable, "-c", HOLDER, f"tcp://127.0.0.1:{connect}", str(tmp_path),
                          f"telemetry-stacks v1 rank={header_rank} pid=PID signal={int(sig)}", str(catch)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert p.stdout.readline().strip() == "ready"
        receiver = other if case == "other_port" else pull
        assert receiver.poll(60_000), "the holder never connected"     # its connection is up
        receiver.recv()
        info = {"host": socket.gethostname(), "pid": p.pid, "start_time": proc_start_time(p.pid)}
        if case == "wrong_start":
            info["start_time"] += 1
        if case == "forwarded":
            info["forwarded_by"] = "node daemon"
        from telemetry.daemon.forensics.verify import claims_this_host

        assert claims_this_host(info, socket.gethostname()) == (case != "forwarded")
        got = Verifier(f"tcp://127.0.0.1:{port}", socket.gethostname()).verify(claimed_rank, info)
        if case in ("ok", "unsafe_signal", "not_caught"):
            assert isinstance(got, LocalRank) and got.pid == p.pid and got.rank == claimed_rank, got
            assert got.stacks_signal == (int(sig) if case == "ok" else None), got
            assert case == "ok" or got.stacks_unavailable, got
        elif case != "forwarded":
            assert isinstance(got, str), got
    finally:
        p.kill()
        p.wait(30)
        pull.close(0)
        other.close(0)
        ctx.term()


# A process of ours holding a stacks file and no connection, mapping a file (or none: "-").
MAPPER = r"""
import mmap, os, sys
stacks_dir, header, mapped = sys.argv[1], sys.argv[2], sys.argv[3]
rank = header.split("rank=")[1].split()[0]
f = open(os.path.join(stacks_dir, f"stacks-rank{rank}-pid{os.getpid()}.txt"), "w")
f.write(header.replace("PID", str(os.getpid())) + "\n")
f.flush()
if mapped != "-":
    fd = os.open(mapped, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, 4096)
    m = mmap.mmap(fd, 4096)
    os.close(fd)
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("case", ["page", "none", "elsewhere", "open_dir", "replaced", "deleted"])
def test_on_ipc_a_client_not_yet_connected_is_known_by_the_page_it_maps(tmp_path, case):
    """A client writing a record ring says hello before libzmq has connected its socket: on an
    ipc ingest, a process that maps a file of the ingest's own private pages directory is one
    of this daemon's clients. A file mapped elsewhere, in a directory others may enter, or no
    longer the file at that path, is no such proof."""
    from telemetry.daemon.forensics.verify import LocalRank, Verifier

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    ingest = runtime / "ingest.sock"
    pages = Path(str(ingest) + ".clients")
    pages.mkdir(mode=0o755 if case == "open_dir" else 0o700)
    pages.chmod(0o755 if case == "open_dir" else 0o700)
    stacks = tmp_path / "stacks"
    stacks.mkdir(mode=0o700)
    (tmp_path / "other").mkdir(mode=0o700)
    mapped = {"none": "-", "elsewhere": str(tmp_path / "other" / ("0" * 16))}.get(case, str(pages / ("ab" * 8)))
    p = subprocess.Popen([sys.executable, "-c", MAPPER, str(stacks), "telemetry-stacks v1 rank=2 pid=PID signal=0",
                          mapped], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        if case == "replaced":                 # another file now has the name the process mapped
            os.unlink(mapped)
            Path(mapped).write_bytes(b"\0" * 4096)
            os.chmod(mapped, 0o600)
        elif case == "deleted":
            os.unlink(mapped)
        info = {"host": socket.gethostname(), "pid": p.pid, "start_time": proc_start_time(p.pid)}
        got = Verifier(f"ipc://{ingest}", socket.gethostname()).verify(2, info)
        if case == "page":
            assert isinstance(got, LocalRank) and got.pid == p.pid and got.rank == 2, got
        else:
            assert isinstance(got, str) and "holds no connection" in got, got
    finally:
        p.kill()
        p.wait(30)


def test_a_rank_that_said_hello_and_bye_in_one_batch_is_not_warned_about(tmp_path, caplog):
    """A short script's whole life (hello ... bye) read in one batch: by then it has closed its
    connection and cannot be verified; that is no forged claim, so no warning (one for a hello
    alone, which is)."""
    import logging
    import os
    import socket
    from collections import deque

    from telemetry.daemon.forensics.stage import ForensicsStage
    from telemetry.daemon.sinks.base import Out

    host = socket.gethostname()
    stage = ForensicsStage(type("Cfg", (), {"enabled": True})(), tmp_path, host, post=lambda rec: None,
                           recent=deque(), ingest=f"ipc://{tmp_path}/ingest.sock")
    hello = {"kind": "hello", "t": 1.0, "rank": 0, "info": {"host": host, "pid": os.getpid(), "rank": 0}}
    bye = {"kind": "bye", "t": 2.0, "rank": 0, "stats": {}}
    with caplog.at_level(logging.DEBUG, logger="telemetry.daemon.forensics"):
        stage.consume([Out("hello", hello, b""), Out("bye", bye, b"")])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    with caplog.at_level(logging.DEBUG, logger="telemetry.daemon.forensics"):
        stage.consume([Out("hello", {**hello, "rank": 1}, b"")])
    assert "rank 1's hello" in caplog.text and "not verified" in caplog.text
