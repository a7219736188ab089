"""Whether W&B's run file (its transaction log, run-<id>.wandb) holds the whole run, read once
the run has finished.

W&B's writer (its Go core, wandb-core) saves each record of a run to this file; offline it is
the run (what `wandb sync` uploads). A write that fails there (the disk full: ENOSPC; a quota:
EDQUOT; EIO; a file size limit: EFBIG) is only logged by the core, in its debug-internal.log:
nothing the SDK returns says it (`run.finish()` returns as usual; its exit result says only
whether it timed out, and poll_exit counts uploads). The core's writer keeps the first error it
met and writes nothing after it, so a file written whole ends with the run's exit record, and a
file that lost records does not: it ends where the writer stopped. Its last blocks say which,
whatever its size; the file is never read whole.

The file, as W&B writes it: a 7-byte header (b":W&B", 0xBEE1 little-endian, version 0), then
32 KiB blocks (the header is in the first) of chunks [crc32 u32][length u16][type u8][data],
the crc over the type and the data; type 1 is a whole record, 2/3/4 the first/middle/last piece
of one split across blocks; fewer than 7 bytes left in a block are zero padding. A record is a
`wandb.proto.wandb_internal_pb2.Record`.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from typing import NamedTuple

from telemetry.shared import files

BLOCK = 32 * 1024
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
CHUNK_HEADER = struct.Struct("<IHB")
FULL, FIRST, LAST = 1, 2, 4         # 3: a middle piece, taken as any piece after the first
# How much of the file's end is read: the exit record is its last, and the last history row
# (its step: where the file stops) is within this of the end.
TAIL_BYTES = 32 * BLOCK
# How much of the end of W&B's core log is searched for the write error that stopped the file.
LOG_TAIL_BYTES = 256 * 1024


class RunFileEnd(NamedTuple):
    complete: bool               # the file ends with the run's exit record
    last_step: int | None        # not complete: the step of its last history row, if within TAIL_BYTES of the end


def tail_records(path: str) -> list[bytes]:
    """The whole records (each a Record's bytes) in the last TAIL_BYTES (from a block's start) of
    a .wandb file, in order, up to the first chunk that is torn or fails its crc (where the writer
    stopped). [] for a file without W&B's header (empty: nothing was written). Only a regular
    file is read (a FIFO put there never blocks the reader: NotRegularFile, an OSError)."""
    with files.open_regular(path, nofollow=True) as f:
        size = os.fstat(f.fileno()).st_size
        if f.read(len(HEADER)) != HEADER:
            return []
        start = max(0, size - TAIL_BYTES) // BLOCK * BLOCK
        f.seek(start)
        data = f.read(size - start)
    pos = len(HEADER) if start == 0 else 0
    out, pieces = [], None       # pieces: a record's chunks so far; None before its first one
    while pos + CHUNK_HEADER.size <= len(data):
        left_in_block = BLOCK - (start + pos) % BLOCK
        if left_in_block < CHUNK_HEADER.size:
            pos += left_in_block
            continue
        crc, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        chunk = data[pos + CHUNK_HEADER.size:pos + CHUNK_HEADER.size + length]
        if len(chunk) < length or zlib.crc32(bytes([kind]) + chunk) != crc:
            break
        pos += CHUNK_HEADER.size + length
        if kind in (FULL, FIRST):
            pieces = [chunk]
        elif pieces is not None:
            pieces.append(chunk)
        if kind in (FULL, LAST) and pieces is not None:
            out.append(b"".join(pieces))
            pieces = None
    return out


def run_file_end(path: str, step_key: str = "_step") -> RunFileEnd:
    """Whether the .wandb file at `path` ends with the run's exit record, and the step of its last
    history row: its value at `step_key` (W&B's own `_step`, or a run's step metric such as
    "train/step"). OSError when it cannot be read (it was never made)."""
    from wandb.proto import wandb_internal_pb2

    last_step = None
    for i, data in enumerate(reversed(tail_records(path))):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if i == 0 and kind == "exit":
            return RunFileEnd(True, None)       # whole: where its rows end is not asked
        if kind == "history":
            last_step = _item(rec.history, step_key)
            if last_step is None and step_key == "_step" and rec.history.HasField("step"):
                last_step = rec.history.step.num
            break
    return RunFileEnd(False, last_step)


def _item(history, key: str) -> int | None:
    """A history row's integer value at `key`, or None."""
    for item in history.item:
        if item.key == key:
            try:
                value = json.loads(item.value_json)
            except ValueError:
                return None
            return int(value) if isinstance(value, (int, float)) and value == value and abs(value) < 2**63 else None
    return None


def logged_error(run_file: str, core_log: str | None) -> str:
    """The last error W&B's core log (its debug-internal.log) names the run's file with, as the
    system said it ("no space left on device"); "" when it names none, or cannot be read (on the
    same full disk, it may hold nothing). The core's writer stops at its first error: one named
    here means the file will get nothing more."""
    if not core_log:
        return ""
    name = os.path.basename(run_file)
    try:
        with files.open_regular(core_log) as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_TAIL_BYTES))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if name not in line or '"ERROR"' not in line:
            continue
        try:
            msg = json.loads(line).get("msg")
        except (ValueError, AttributeError):
            continue
        if isinstance(msg, str) and name in msg:
            # "...: write /dir/run-x.wandb: no space left on device": what the system said
            return msg.rsplit(name + ": ", 1)[-1][:200]
    return ""


def full_disk(run_file: str) -> str:
    """The file system that holds the run's file, when it has no room left for a block of it, in
    words; else ""."""
    try:
        st = os.statvfs(os.path.dirname(run_file) or ".")
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    return f"its file system has {free:,} bytes free" if free < BLOCK else ""
