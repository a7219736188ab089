"""Reading a W&B offline run file (offline-run-*/run-<id>.wandb) without uploading it.

The file is a LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version), then 32 KiB
blocks of chunks, each `crc32 (4) | length (2, little-endian) | type (1) | data`, type 1 a whole
record, 2/3/4 its first/middle/last part; a block's last <7 bytes are padding. Each record is a
`wandb_internal_pb2.Record` protobuf. Used by replay to tell a finished run (it holds an `exit`
record, written by run.finish()) from one a live daemon is still writing.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768
HEADER = 7  # ":W&B" + magic 0xBEE1 + version


def records(wandb_file: Path) -> Iterator[Any]:
    """The Record protos of an offline run file, in order (a torn tail ends the iteration)."""
    from wandb.proto import wandb_internal_pb2 as pb

    from telemetry.shared import files

    with files.open_regular(wandb_file) as f:    # NotRegularFile (an OSError): a FIFO is never waited on
        data = f.read()
    if data[:4] != b":W&B":
        return
    pos, buf = HEADER, b""
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:
            pos += left_in_block  # block trailer padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        if len(chunk) < length:
            return
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            try:
                rec.ParseFromString(buf)
            except Exception:   # a torn record: nothing after it is trustworthy
                return
            yield rec


def is_finished(run_dir: Path) -> bool:
    """Whether an offline run directory's run was finished (its .wandb file has an exit record)."""
    for f in Path(run_dir).glob("run-*.wandb"):
        try:
            if any(r.WhichOneof("record_type") == "exit" for r in records(f)):
                return True
        except OSError:
            return False
    return False
