"""The daemon's memory budget (telemetry/daemon/memory.py): each buffer bounded in bytes, what is
shed beyond it counted. Exact counts; the memory figures themselves are benchmarks
(benchmarks/daemon_memory.py), never asserted here."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time

from daemon_util import start_daemon

from protocol import encode_bye, encode_hello, encode_metrics
from telemetry.daemon.memory import HELLO_INFO_MAX_BYTES, RECORD_BYTES_PER_FRAME_BYTE, NameCatalogue, RecentRing, Shed

# A small budget the daemon keeps (its own baseline is ~40 MB of it): its shares are small enough
# to be passed by a test quickly. What each share is depends on the baseline measured at start:
# read from status (memory.split_mb, memory.held.max_names, intake.max_mb).
MEMORY_MB = 160
WIDE = 4096


def test_recent_ring_keeps_its_bytes_and_counts_what_it_sheds():
    shed = Shed()
    ring = RecentRing(1000, shed)
    for i in range(10):
        ring.append([i], 300)
    assert [b[0] for b in ring] == [7, 8, 9]            # the newest, oldest first, as the deque was
    assert ring.num_bytes == 900
    assert shed.counts["recent_batches"] == 7
    ring.append(list(range(100)), 5000)                  # one batch over the whole share: its tail
    assert [b for b in ring] == [list(range(80, 100))]
    assert ring.num_bytes == 1000
    assert shed.counts["recent_records"] == 80 and shed.counts["recent_batches"] == 10


def test_name_catalogue_sheds_new_names_beyond_its_cap():
    shed = Shed()
    cat = NameCatalogue(3, shed)
    assert cat.admit({"a": 1.0, "b": 2.0}) is None
    assert cat.admit({"a": 1.0, "c": 3.0, "d": 4.0, "e": 5.0}) == {"a": 1.0, "c": 3.0}
    assert cat.admit({"a": 1.0, "b": 2.0, "c": 3.0}) is None     # known names pass as they are
    assert len(cat) == 3 and shed.counts["metric_values"] == 2


def _wait_status(d, predicate, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        st = d.status()
        if predicate(st):
            return st
        assert time.monotonic() < deadline, f"not reached within {timeout_s} s: {json.dumps(st.get('memory'))}"
        time.sleep(0.1)


def test_daemon_bounds_hellos_names_and_the_forensics_ring(tmp_path):
    d = start_daemon(tmp_path, world_size=1, config={"memory_mb": MEMORY_MB})
    try:
        split = d.status()["memory"]
        max_names, recent_bytes = split["held"]["max_names"], split["split_mb"]["recent"] * 2**20
        assert max_names < 4 * WIDE
        s = d.push()
        t = time.time_ns()
        # A hello whose info is ~1 MB (a model config with a big table): kept cut, counted.
        table = {str(i): f"LABEL_{i:010d}" for i in range(43_000)}
        info = {"world_size": 1, "rank": 0, "config": {"hidden_size": 2048, "id2label": table}}
        frame = encode_hello(7, 0, 0, 0, t, info)
        assert len(frame) > 900_000
        s.send(frame)
        # Names: 4 records of 4,096 new names each; the catalogue takes max_names of them.
        names = [f"user/m{i:06d}" for i in range(4 * WIDE)]
        seq = 1
        for k in range(4):
            s.send(encode_metrics(7, 0, seq, 0, t + seq, seq, {n: 1.0 for n in names[k * WIDE:(k + 1) * WIDE]}))
            seq += 1
        # Known names still flow, whole.
        s.send(encode_metrics(7, 0, seq, 0, t + seq, seq, {"user/m000000": 5.0, "user/m000001": 6.0}))
        seq += 1
        # Wide records with known names: far more than the forensics ring's share.
        wide = {n: 2.0 for n in names[:WIDE]}
        frame_bytes = len(encode_metrics(7, 0, seq, 0, t + seq, seq, wide))
        num_wide = int(3 * recent_bytes / (frame_bytes * RECORD_BYTES_PER_FRAME_BYTE)) + 1
        for _ in range(num_wide):
            s.send(encode_metrics(7, 0, seq, 0, t + seq, seq, wide))
            seq += 1
        st = _wait_status(d, lambda st: st["records_in"] == seq)
        mem = st["memory"]
        # Cut once, as it was read (bigger than an info is kept), not again when it was processed.
        assert mem["shed"]["hellos_cut_at_intake"] == 1 and mem["shed"]["hellos_truncated"] == 0
        assert mem["held"]["names"] == max_names
        assert mem["shed"]["metric_values"] == 4 * WIDE - max_names
        assert mem["held"]["recent_mb"] * 2**20 <= recent_bytes + 0.1 * 2**20
        assert mem["shed"]["recent_batches"] + mem["shed"]["recent_records"] > 0
        assert mem["records_shed"] == sum(mem["shed"].values())
        steps = d.wait_for(lambda recs: any(r.get("step") == 5 for r in recs), kind="metrics")
        by_step = {r["step"]: r for r in steps if "rank" not in r}
        assert by_step[5]["values"]["user/m000000"] == 5.0 and by_step[5]["values"]["user/m000001"] == 6.0
        assert sum(len(by_step[k]["values"]) for k in range(1, 5)) >= max_names
        hello = d.wait_for(lambda recs: bool(recs), kind="hello")[0]
        kept = json.dumps(hello["info"], separators=(",", ":"))   # as the daemon measures it
        assert len(kept) <= HELLO_INFO_MAX_BYTES
        assert "_truncated" in hello["info"] and hello["info"]["world_size"] == 1
        assert hello["info"]["config"]["hidden_size"] == 2048     # the scalars stay
        s.close(linger=0)
        daemon_rec = _wait_status(d, lambda st: True)
        assert daemon_rec["memory"]["records_shed"] >= 1
    finally:
        d.stop()
        d.cleanup()


def _limit_memory():
    # The old code allocates a set of 10^9 ranks until the machine's OOM killer fires: a cap makes
    # it fail fast here instead (a MemoryError), so this test can fail without taking the box.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def _daemon(tmp_path, *args, config: str | None = None):
    cmd = [sys.executable, "-m", "telemetry", "daemon", "--log-dir", str(tmp_path / "t"), "--wandb", "disabled",
           "--ingest", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0", "--control", "tcp://127.0.0.1:0", *args]
    if config is not None:
        path = tmp_path / "daemon.yaml"
        path.write_text(config)
        cmd += ["--config", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, preexec_fn=_limit_memory)


def test_world_size_beyond_bounds_exits_2_with_one_line(tmp_path):
    r = _daemon(tmp_path, "--world-size", "1000000000")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(lines) == 1 and "world_size" in lines[0], r.stderr
    assert "ready" not in r.stdout


def test_memory_and_queue_sizes_beyond_bounds_exit_2_with_one_line(tmp_path):
    for config, key in (("memory_mb: 1", "memory_mb"), ("memory_mb: 1e9", "memory_mb"),
                        ("memory_mb: .nan", "memory_mb"), ("jsonl: {max_queued: 100000000000}", "max_queued")):
        r = _daemon(tmp_path, config=config + "\n")
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2, (config, r.stderr[-2000:])
        assert len(lines) == 1 and key in lines[0], (config, r.stderr)


def _start_or_exit(tmp_path, config: str) -> tuple[int | None, list[str]]:
    """A daemon with this YAML config: (its exit code, its stderr lines) if it exits at start,
    (None, []) if it says ready instead (then stopped)."""
    import re

    from testkit.daemon_proc import DaemonProc, daemon_command

    path = tmp_path / "budget.yaml"
    path.write_text(config)
    log_dir = tmp_path / re.sub(r"\W", "_", config)
    cmd = daemon_command(log_dir, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", config=path)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    d = DaemonProc(proc, log_dir, None)
    try:
        d.wait_ready(120)
    except RuntimeError:
        if proc.returncode is None:
            raise
        return proc.returncode, [ln for ln in proc.stderr.read().splitlines() if ln.strip()]
    d.stop()
    d.cleanup()
    return None, []


def test_a_budget_below_the_process_baseline_is_refused_naming_the_smallest_that_works(tmp_path):
    """memory_mb is the whole process's RSS: a budget below what the daemon itself takes (its
    interpreter and libraries, measured at start) plus what it needs to work cannot be kept (the
    old code took 64 MB and grew to ~200 MB under load). Refused at start: exit 2, one line that
    names the smallest budget that works, no socket bound; that budget (a little noise above it:
    the baseline is measured anew by each start) is accepted."""
    import re

    rc, lines = _start_or_exit(tmp_path, "memory_mb: 64\n")
    assert rc == 2, "a 64 MB budget was accepted: the daemon alone takes most of it"
    assert len(lines) == 1 and "memory_mb 64 cannot be kept" in lines[0], lines
    m = re.search(r"the smallest that works here is (\d+)", lines[0])
    assert m, lines
    least = int(m.group(1))
    assert least > 64
    rc, lines = _start_or_exit(tmp_path, f"memory_mb: {least + 8}\n")
    assert rc is None, lines


def test_a_backlog_beyond_the_ingest_share_is_shed_and_counted_exactly(tmp_path):
    """libzmq's receive queue counts messages, not bytes: 10,240 wide frames a connection (1.3 GB)
    piled up there while the daemon was busy. Now the daemon reads what libzmq holds into a queue
    bounded by the ingest share and sheds the rest, counted exactly: every frame sent is either
    taken in or counted lost (records_shed_at_intake), none vanishes, and the queue never held
    more than its share. The backlog is made certain: the daemon is stopped (SIGSTOP) while the
    rank sends 5x the share of wide records, then let go."""
    d = start_daemon(tmp_path, world_size=1, config={"memory_mb": MEMORY_MB})
    try:
        share_mb = d.status()["intake"]["max_mb"]
        s = d.push()
        t = time.time_ns()
        s.send(encode_hello(9, 0, 0, 0, t, {"world_size": 1, "rank": 0}))
        _wait_status(d, lambda st: st["records_in"] == 1)
        wide = {f"user/w{i:05d}": float(i) for i in range(WIDE)}
        frame = encode_metrics(9, 0, 1, 0, t + 1, 1, wide)
        num = int(5 * share_mb * 2**20 / len(frame)) + 1
        # Behind the metrics, a second client's hello with a ~1 MB config, then the first's bye:
        # beyond the share too, but a rank's identity and its final count are not shed.
        table = {str(i): f"LABEL_{i:010d}" for i in range(43_000)}
        big_hello = encode_hello(10, 0, 0, 0, t, {"world_size": 1, "rank": 0, "pid": 4242,
                                                  "config": {"hidden_size": 2048, "id2label": table}})
        assert len(big_hello) > 900_000
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            for seq in range(1, num + 1):
                s.send(encode_metrics(9, 0, seq, 0, t + seq, seq, wide))    # queued by the sender's libzmq
            s.send(big_hello)
            s.send(encode_bye(9, 0, num + 1, 0, t + num + 1, {"sent": num + 2}))
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        st = _wait_status(d, lambda st: st["records_in"] + st.get("records_shed_at_intake", 0) == num + 3)
        shed = st.get("records_shed_at_intake", 0)
        assert shed > 0, (num, st["records_in"], st["memory"])
        assert st["records_in_by_kind"]["hello"] == 2 and st["records_in_by_kind"]["bye"] == 1
        assert st["memory"]["shed"]["hellos_cut_at_intake"] == 1 and st["intake"]["hellos_cut_at_intake"] == 1
        assert st["per_rank"]["0"]["open"] == 1         # src 9 said bye; src 10 (a hello only) is open
        # What was taken in went on: one step each (world 1). Which ones: the frames that fitted
        # when each turn read ahead, so not a contiguous range; every one of them once.
        st = _wait_status(d, lambda st: st["steps_out"] == num - shed)
        assert st["steps_incomplete"] == 0 and st["records_late"] == 0
        s.close(linger=0)
    finally:
        d.stop()
        d.cleanup()


def test_cut_hello_keeps_the_scalars_and_drops_the_big_tables_without_decoding_them():
    """intake.cut_hello: a hello bigger than an info is kept is cut as it is read, from its
    encoded form (its values are not built: 0.4 ms for a 0.7 MB config against 25 ms decoded
    and cut), to at most `limit` bytes; anything it cannot read is left to the receiver."""
    from protocol import decode
    from telemetry.daemon.intake import cut_hello

    table = {str(i): f"LABEL_{i:010d}" for i in range(30_000)}
    info = {"world_size": 8, "rank": 3, "pid": 77, "host": "node-1",
            "config": {"model_type": "llama", "hidden_size": 2048, "id2label": table, "num_hidden_layers": 22},
            "tags": list(range(50_000))}
    frame = encode_hello(5, 3, 0, 0, 123, info)
    for limit in (65536, 1024):
        out = cut_hello(frame, limit)
        assert len(out) <= limit
        rec = decode(out)
        assert (rec.src, rec.rank, rec.seq, rec.t_ns) == (5, 3, 0, 123)
        assert {k: rec.info[k] for k in ("world_size", "rank", "pid", "host")} == \
            {"world_size": 8, "rank": 3, "pid": 77, "host": "node-1"}
        assert rec.info["config"] == {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 22}
        assert "tags" not in rec.info and "cut to" in rec.info["_truncated"]
    small = encode_hello(5, 3, 0, 0, 123, {"world_size": 8})
    assert cut_hello(small, 1024) is small                          # fits: the frame itself
    assert cut_hello(encode_metrics(5, 3, 1, 0, 1, 1, {"a": 1.0}) + bytes(2000), 1024) is None
    import msgpack
    hostile = msgpack.packb((1, 1, 5, 3, 0, 0, 123, {1: "x" * 5000}))   # a non-str key: not read here
    assert cut_hello(hostile, 1024) is None


def test_the_governor_cuts_the_intake_above_its_high_mark_and_restores_it_below_the_low():
    """The budget kept by measure: this process's own RSS against a budget it is over (engaged:
    the intake's share cut to MIN_SHARE_BYTES, counted once) and one it is far under (released:
    the share back)."""
    from telemetry.daemon.memory import MIN_SHARE_BYTES, Budget, Governor, rss_bytes

    class Intake:
        max_bytes = 64 << 20

    rss_mb = rss_bytes() / 2**20
    intake = Intake()
    over = Governor(Budget(rss_mb / 2, 1.0), intake)
    over.check(0.0)
    over.check(1.0)
    assert over.engaged and intake.max_bytes == MIN_SHARE_BYTES and over.num_engaged == 1
    assert over.stats()["peak_rss_mb"] > rss_mb / 2
    over.high_bytes, over.low_bytes = 5 * rss_bytes(), 4 * rss_bytes()   # as if the budget were far above the RSS
    over.check(2.0)
    assert not over.engaged and intake.max_bytes == 64 << 20 and over.num_engaged == 1
    over.close()


def test_a_heads_node_links_are_in_its_budget_and_one_that_cannot_hold_them_is_refused(tmp_path):
    """A head reserves what each node link may hold (memory.LINK_BYTES, one link a node) out of its
    budget: a head of more nodes than its budget holds is refused at start, one line that names
    its links and the smallest budget that holds them; that budget is accepted."""
    import re

    head = "remote_ingest: tcp://127.0.0.1:0\naggregator: {world_size: 4096}\n"
    rc, lines = _start_or_exit(tmp_path, head + "memory_mb: 256\n")
    assert rc == 2, "a head of 4,096 nodes was given 256 MB: its links alone take more than what is left"
    assert len(lines) == 1 and "4,096 node links" in lines[0], lines
    least = int(re.search(r"the smallest that works here is (\d+)", lines[0]).group(1))
    rc, lines = _start_or_exit(tmp_path, head + f"memory_mb: {least + 8}\n")
    assert rc is None, lines

