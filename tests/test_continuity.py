"""What a daemon started on a log directory takes over from its predecessor (continuity.py), on
files made by hand: the lines past the predecessor's last checkpoint moved aside (a torn one cut
and counted), and nothing touched that is not the checkpoint's file (rotated, a symlink)."""
from __future__ import annotations

import json
import os

from telemetry.daemon.aggregator import Aggregator
from telemetry.daemon.config import AggregatorConfig
from telemetry.daemon.continuity import SOURCES_FILE, Continuity
from telemetry.daemon.receiver import Receiver

LINES = [json.dumps({"kind": "metrics", "t": 1.0, "step": s, "values": {"a": 1.0}}).encode() + b"\n" for s in range(6)]


def _predecessor(log_dir, checkpointed: int, tail: bytes = b"") -> int:
    """metrics.jsonl with LINES (+ `tail`), and a sources.json whose checkpoint counts the first
    `checkpointed` lines; returns where they end."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / "metrics.jsonl"
    path.write_bytes(b"".join(LINES) + tail)
    os.chmod(path, 0o600)
    end = sum(map(len, LINES[:checkpointed]))
    st = os.stat(path)
    snap = {"version": 1, "sources": [[7, 0, 0, 0, checkpointed, checkpointed - 1, 0]],
            "run": {"incarnations": 1, "records_in": checkpointed, "steps_out": checkpointed, "started_at": 123.0},
            "jsonl": {"ino": st.st_ino, "dev": st.st_dev, "end": end}}
    (log_dir / SOURCES_FILE).write_text(json.dumps(snap))
    return end


def _continuity(log_dir) -> Continuity:
    return Continuity(log_dir, Receiver(), Aggregator(AggregatorConfig()), per_rank=False, started_wall=456.0)


def test_lines_past_the_checkpoint_are_moved_aside_and_a_torn_one_is_cut(tmp_path):
    end = _predecessor(tmp_path, 4, tail=b'{"kind": "metr')
    c = _continuity(tmp_path)
    c.restore()
    assert (tmp_path / "metrics.jsonl").read_bytes() == b"".join(LINES[:4]) and os.path.getsize(
        tmp_path / "metrics.jsonl") == end
    (aside,) = tmp_path.glob("past-checkpoint-*.jsonl")
    assert aside.read_bytes() == b"".join(LINES[4:]) and oct(aside.stat().st_mode & 0o777) == "0o600"
    assert c.restart == {"moved_lines": 2, "moved_bytes": len(b"".join(LINES[4:])), "moved_to": str(aside)}
    assert c.repaired_bytes == len(b'{"kind": "metr')
    # The run's counts go on; the accounting of the predecessor's client too.
    st = c.status(records_lost=0)
    assert st["incarnations"] == 2 and st["records_in"] == 4 and st["steps_out"] == 4 and st["started_at"] == 123.0
    assert c.receiver.sources[7].earlier == 4


def test_nothing_is_moved_when_the_file_is_not_the_checkpoints(tmp_path):
    _predecessor(tmp_path, 2)
    path = tmp_path / "metrics.jsonl"
    # Rotated since: another file at the path (another inode).
    os.rename(path, tmp_path / "metrics.jsonl.1")
    path.write_bytes(b"".join(LINES))
    c = _continuity(tmp_path)
    c.restore()
    assert path.read_bytes() == b"".join(LINES) and not list(tmp_path.glob("past-checkpoint-*"))
    # A symlink at the path (to the checkpoint's own file): not followed, nothing cut.
    path.unlink()
    path.symlink_to(tmp_path / "metrics.jsonl.1")
    _continuity(tmp_path).restore()
    assert (tmp_path / "metrics.jsonl.1").read_bytes() == b"".join(LINES)
    assert not list(tmp_path.glob("past-checkpoint-*"))


def test_a_checkpoint_written_at_start_or_exit_ends_at_the_last_whole_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(b"".join(LINES[:3]) + b'{"kind": "met')
    c = _continuity(tmp_path)
    c.write(records_out=0)
    snap = json.loads((tmp_path / SOURCES_FILE).read_bytes())
    assert snap["jsonl"]["end"] == len(b"".join(LINES[:3]))
    assert snap["run"]["incarnations"] == 1 and snap["run"]["started_at"] == 456.0


def test_a_downsampled_jsonl_is_checkpointed_by_the_daemon_at_the_files_end(make_daemon):
    """jsonl.every_n_steps: most records have no line, so no line can say where they end; the
    daemon writes the checkpoint itself, at the file's end, and hands the sink none."""
    import time

    from telemetry.client import TelemetryClient

    d = make_daemon(world_size=1, config={"jsonl": {"every_n_steps": 4}})
    c = TelemetryClient(d.ingest, rank=0)
    for s in range(1, 41):
        c.log(s, {"train/loss": 1.0})
    c.close()
    d.wait_for(lambda recs: any(r.get("step") == 40 for r in recs), kind="metrics")
    deadline = time.monotonic() + 60          # a hang detector: a checkpoint comes every 0.1 s

    def arrived() -> int:
        return sum(row[4] for row in json.loads((d.log_dir / SOURCES_FILE).read_bytes())["sources"])

    while arrived() < 41:                     # its hello and 40 steps
        assert time.monotonic() < deadline, arrived()
        time.sleep(0.05)
    snap = json.loads((d.log_dir / SOURCES_FILE).read_bytes())
    assert snap["jsonl"]["end"] <= os.path.getsize(d.log_dir / "metrics.jsonl")
    assert d.status()["sinks"]["jsonl"]["checkpoints"] == 0
    d.drain()


def test_the_world_the_hellos_announced_carries_over(tmp_path):
    """A successor waits for the ranks whose hellos went to its predecessor (a surviving client
    says no hello again) and for no rank that only sent records; from an older checkpoint that
    does not say which ranks were announced, the ranks of the clients it continues."""
    first = _continuity(tmp_path)
    world = first.aggregator.world
    world.note_size(2)                          # rank 0's hello: WORLD_SIZE 2
    world.announce(0)
    world.announce(5)                           # a rank beyond it that said hello itself
    assert world.admit(9) is False              # records only: a stranger
    first.write(records_out=0)
    then = _continuity(tmp_path)
    then.restore()
    w = then.aggregator.world
    assert w.size() == 2 and w.announced == {0, 5} and w.expected == {0, 1}
    assert w.admit(1) and w.admit(5) and w.admit(9) is False
    # An older daemon's checkpoint: its clients' ranks (7 of rank 3), nothing else.
    older = tmp_path / "older"
    _predecessor(older, 2)
    snap = json.loads((older / SOURCES_FILE).read_text())
    snap["sources"][0][1] = 3
    (older / SOURCES_FILE).write_text(json.dumps(snap))
    c = _continuity(older)
    c.restore()
    assert c.aggregator.world.announced == {3} and c.aggregator.world.admit(3) and c.aggregator.world.admit(4) is False
