"""Read back what a W&B offline run wrote, with wandb's own protobuf schema.

wandb 0.31 no longer ships a Python reader for run-<id>.wandb (the old
wandb.sdk.internal.datastore.DataStore is gone; syncing is done by the Go wandb-core). The file
is a LevelDB-style log: a 7-byte header (b":W&B", magic 0xBEE1 little-endian, version 0), then
32 KiB blocks of chunks, each chunk [crc32c u32][length u16][type u8][data], type 1 = a whole
record, 2/3/4 = first/middle/last piece of a record split across blocks; fewer than 7 bytes
left in a block are zero padding. Each record's bytes are a `wandb.proto.wandb_internal_pb2.Record`,
which we parse with wandb's own generated protobuf class.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: str | Path) -> list:
    """Every Record protobuf in a .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if not data.startswith(HEADER):
        raise ValueError(f"{path}: not a W&B transaction log (header {data[:7]!r})")
    out, pos, pieces = [], len(HEADER), []
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, pos)
        pos += 7
        chunk = data[pos:pos + length]
        pos += length
        if kind == 0 and length == 0:
            break                       # a preallocated, unwritten tail
        if kind in (FULL, FIRST):
            pieces = [chunk]
        else:
            pieces.append(chunk)
        if kind in (FULL, LAST):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(b"".join(pieces))
            out.append(rec)
    return out


def history_rows(path: str | Path) -> list[dict]:
    """The rows logged with run.log, as dicts (values JSON-decoded)."""
    rows = []
    for rec in read_records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append({(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                         for item in rec.history.item})
    return rows


def config(path: str | Path) -> dict:
    """The run config as last updated (values JSON-decoded)."""
    cfg: dict = {}
    for rec in read_records(path):
        if rec.WhichOneof("record_type") == "config":
            for item in rec.config.update:
                cfg[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return cfg


def run_ids(path: str | Path) -> list[tuple[str, str]]:
    """(run_id, resume setting) of each run record in the file."""
    return [(rec.run.run_id, rec.run.resumed) for rec in read_records(path)
            if rec.WhichOneof("record_type") == "run"]
