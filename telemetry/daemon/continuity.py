"""What carries over between the daemons that serve one log directory one after another (a
restart, after a SIGKILL too): the per-source loss accounting and the run's counts.

They are checkpointed in sources.json, tied to the lines of metrics.jsonl: every
SOURCES_CHECKPOINT_S while records flow the daemon's thread makes a checkpoint (Receiver.snapshot,
without the records still in open steps: they are in no line yet) and hands it to the JSONL sink,
which writes it once the lines handed out before it are written, with the offset where they end
(sinks/jsonl.py). At start and at exit it is written here, with the end of the file's whole
lines. So sources.json never counts a record the file does not hold. A daemon started on the
directory continues that accounting (Receiver.restore: what vanished with its predecessor is
counted lost once each surviving client's next record arrives) and moves aside what the
predecessor wrote past the checkpoint (it was killed before the next one) into
past-checkpoint-<time>.jsonl, counted lost: for every client, what metrics.jsonl holds + what is
counted lost == what it sent, exactly (tests/test_multinode_head_restart.py). The run's counts
(`run` in status: incarnations, records in, lost, steps out) go on from the checkpoint too.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import msgspec

from protocol.constants import MAX_RANK
from telemetry.daemon.world import MAX_WORLD_SIZE
from telemetry.shared import files
from telemetry.shared.jsonlines import FILE_NAME
from telemetry.shared.numbers import is_number

log = logging.getLogger("telemetry.daemon")

SOURCES_FILE = "sources.json"
# sources.json holds at most receiver.MAX_SOURCES rows of 7 integers (~10 MB): more is not ours.
MAX_SOURCES_FILE_BYTES = 32 << 20
# How often the accounting is checkpointed while records come and go: a SIGKILL's successor moves
# aside what was written after the last checkpoint (counted lost), so the shorter, the less. A
# checkpoint counts the records in open steps (a cost per record): above CHECKPOINT_HELD_MAX of
# them open, once per SLOW_CHECKPOINT_S only.
SOURCES_CHECKPOINT_S = 0.1
SLOW_CHECKPOINT_S = 1.0
CHECKPOINT_HELD_MAX = 10_000


class Continuity:
    def __init__(self, log_dir: Path, receiver, aggregator, per_rank: bool, started_wall: float) -> None:
        """receiver, aggregator: the daemon's; per_rank: every record is written as its rank's
        own line as it arrives (no record waits in an open step to be written)."""
        self.log_dir = log_dir
        self.receiver = receiver
        self.aggregator = aggregator
        self.per_rank = per_rank
        self.started_wall = started_wall
        # The run's counts in the daemons before this one on the directory (sources.json's "run").
        self.before = {"incarnations": 0, "records_in": 0, "steps_out": 0, "started_at": None}
        self.restart: dict = {}                 # what was moved aside at start (status)
        self.repaired_bytes = 0                 # a torn last line cut at start (the JSONL sink's count)
        self._checkpointed = (-1, -1)           # (records in, records out) at the last checkpoint
        self._next = time.monotonic() + SOURCES_CHECKPOINT_S
        self._write_failed = False

    # -- while the daemon runs ---------------------------------------------------------------------
    def due(self, now: float, records_out: int) -> bool:
        """A checkpoint to make at this turn (records came in or went out since the last)?"""
        if now < self._next:
            return False
        self._next = now + (SOURCES_CHECKPOINT_S if self.aggregator.num_open_records <= CHECKPOINT_HELD_MAX
                            else SLOW_CHECKPOINT_S)
        return (self.receiver.num_in, records_out) != self._checkpointed

    def through_jsonl(self, jsonl_runner, records_out: int) -> None:
        """A checkpoint, to the JSONL sink (after the daemon handed out `records_out` records). A
        downsampled JSONL (jsonl.every_n_steps, max_per_second) holds no line for most records, so
        no line can say where they end: the checkpoint is then written here, at the file's end."""
        if jsonl_runner.downsampler is not None:
            self.write(records_out)
            return
        self._checkpointed = (self.receiver.num_in, records_out)
        held = {} if self.per_rank else self.aggregator.held_by_source()
        jsonl_runner.sink.checkpoint(jsonl_runner.num_taken, self._snapshot(held))

    def write(self, records_out: int) -> None:
        """sources.json written here: at start (a successor knows a predecessor existed) and at exit
        (every line written: the JSONL sink has closed), with the end of the file's whole lines."""
        self._checkpointed = (self.receiver.num_in, records_out)
        snap = self._snapshot({})
        where = _whole_lines_end(self.log_dir / FILE_NAME)
        if where is not None:
            snap["jsonl"] = where
        path = self.log_dir / SOURCES_FILE
        try:
            files.write_file(path, msgspec.json.encode(snap) + b"\n")
        except OSError as exc:
            if not self._write_failed:          # (with a downsampled JSONL: every checkpoint)
                self._write_failed = True
                log.error("cannot write %s: %r (logged once)", path, exc)

    def status(self, records_lost: int) -> dict:
        """The run's counts across the daemons that served this log directory, this one included;
        `records_lost`: the daemon's (per source over its whole life)."""
        before = self.before
        return {"incarnations": before["incarnations"] + 1,
                "records_in": before["records_in"] + self.receiver.num_in, "records_lost": records_lost,
                "steps_out": before["steps_out"] + self.aggregator.num_steps_out,
                "started_at": before["started_at"] or self.started_wall, "restart": self.restart}

    def _snapshot(self, held: dict[int, int]) -> dict:
        """Receiver.snapshot and the run's counts so far, as of the records handed out: `held`, the
        records in open steps, are not counted."""
        snap = self.receiver.snapshot(held)
        # The world the hellos announced, to this daemon or to one before it: a successor's (a
        # surviving client does not say hello again), where its ranks' records count toward their steps.
        world = self.aggregator.world
        snap["world_size_announced"] = 0 if world.configured else world.size_hint
        snap["ranks_announced"] = sorted(world.announced)
        before = self.before
        snap["run"] = {"incarnations": before["incarnations"] + 1,
                       "records_in": before["records_in"] + self.receiver.num_in - sum(held.values()),
                       "steps_out": before["steps_out"] + self.aggregator.num_steps_out,
                       "started_at": before["started_at"] or self.started_wall}
        return snap

    # -- at start ----------------------------------------------------------------------------------
    def restore(self) -> None:
        """Continue a predecessor's accounting and counts from sources.json, if there is one."""
        path = self.log_dir / SOURCES_FILE
        try:
            with files.open_regular(path) as f:      # a FIFO or /dev/zero there: refused, not read
                data = f.read(MAX_SOURCES_FILE_BYTES + 1)
            if len(data) > MAX_SOURCES_FILE_BYTES:
                raise ValueError(f"larger than {MAX_SOURCES_FILE_BYTES} bytes")
            snap = msgspec.json.decode(data)
        except FileNotFoundError:
            return
        except (ValueError, OSError, msgspec.DecodeError) as exc:
            log.warning("cannot read %s (%s): loss across the restart is accounted from the first "
                        "record of each client", path, exc)
            return
        n = self.receiver.restore(snap)
        log.info("continuing the loss accounting of %d client(s) from %s", n, path)
        if not isinstance(snap, dict):
            return
        self._restore_world(snap.get("world_size_announced"), snap.get("ranks_announced"))
        run = snap.get("run")
        if isinstance(run, dict) and all(type(run.get(k)) is int and run[k] >= 0
                                         for k in ("incarnations", "records_in", "steps_out")):
            started = run.get("started_at")
            self.before = {**{k: run[k] for k in ("incarnations", "records_in", "steps_out")},
                           "started_at": started if is_number(started) else None}
        self._move_aside_past(snap.get("jsonl"))

    def _restore_world(self, size, announced) -> None:
        """The world the predecessor's hellos announced is this daemon's (world.py); from a
        checkpoint that does not say it (an older daemon's), the ranks of the clients it continues."""
        world = self.aggregator.world
        if type(size) is int and 0 < size <= MAX_WORLD_SIZE:
            world.note_size(size)
        if not isinstance(announced, list):
            sources = self.receiver.sources
            announced = [sources[i].rank for i in self.receiver.restored]
        for rank in announced[:MAX_WORLD_SIZE]:
            if type(rank) is int and 0 <= rank <= MAX_RANK:
                world.announce(rank)

    def _move_aside_past(self, where) -> None:
        """The lines a predecessor wrote after its last checkpoint are moved out of metrics.jsonl
        into past-checkpoint-<time>.jsonl (their records are counted lost); a torn last line among
        them is cut, as the JSONL sink would (its repaired_bytes). Through a descriptor opened as
        every run file is (never a symlink, only a regular file)."""
        if not isinstance(where, dict) or not all(type(where.get(k)) is int and where[k] >= 0
                                                  for k in ("ino", "dev", "end")):
            return
        path, end = self.log_dir / FILE_NAME, where["end"]
        try:
            fd = files.open_fd(path, os.O_RDWR)
        except OSError:
            return                            # none, or not one to touch: the JSONL sink says which
        try:
            st = os.fstat(fd)
            if (st.st_ino, st.st_dev) != (where["ino"], where["dev"]) or st.st_size <= end:
                return                        # rotated or replaced since, or nothing past it
            tail = os.pread(fd, st.st_size - end, end)
            whole = tail[:tail.rfind(b"\n") + 1]
            aside = self.log_dir / f"past-checkpoint-{int(time.time())}.jsonl"
            if whole:
                out = files.open_fd(aside, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                try:
                    os.write(out, whole)
                finally:
                    os.close(out)
            os.ftruncate(fd, end)
        except OSError as exc:
            log.error("cannot move what the previous daemon wrote after its last checkpoint out of %s (%r): "
                      "its records are counted both as written and as lost", path, exc)
            return
        finally:
            os.close(fd)
        self.repaired_bytes = len(tail) - len(whole)
        if not whole:
            return
        lines = whole.count(b"\n")
        self.restart = {"moved_lines": lines, "moved_bytes": len(whole), "moved_to": str(aside)}
        log.warning("moved %d line(s) the previous daemon wrote after its last checkpoint from %s to %s: their "
                    "records are counted lost (it was killed before it could count them)", lines, path, aside)


def _whole_lines_end(path: Path) -> dict | None:
    """Where metrics.jsonl's whole lines end (a torn last line, which the JSONL sink cuts at its
    start, not counted), with the file's identity; None without a regular file there."""
    from telemetry.daemon.sinks.jsonl import whole_lines_end

    try:
        with files.open_regular(path) as f:
            st = os.fstat(f.fileno())
            end = whole_lines_end(f, st.st_size)
    except OSError:
        return None
    return {"ino": st.st_ino, "dev": st.st_dev, "end": end}
