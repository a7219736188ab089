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
        if pos + length > len(data):
            break                       # a chunk still being written (the file is read live)
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


def history_key_paths(path: str | Path) -> set[tuple[str, ...]]:
    """Every history key as W&B stored it: a nested dict's value under its path ("a", "b"), a
    flat key under ("a/b",)."""
    return {tuple(item.nested_key) if item.nested_key else (item.key,)
            for rec in read_records(path) if rec.WhichOneof("record_type") == "history"
            for item in rec.history.item}


def config(path: str | Path) -> dict:
    """The run config as last updated (values JSON-decoded): the run record's (what wandb.init
    was given), then each config record's updates."""
    cfg: dict = {}
    for rec in read_records(path):
        kind = rec.WhichOneof("record_type")
        updates = rec.config.update if kind == "config" else rec.run.config.update if kind == "run" else ()
        for item in updates:
            cfg[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return cfg


def run_ids(path: str | Path) -> list[tuple[str, str]]:
    """(run_id, resume setting) of each run record in the file."""
    return [(rec.run.run_id, rec.run.resumed) for rec in read_records(path)
            if rec.WhichOneof("record_type") == "run"]


def summary(path: str | Path) -> dict:
    """The run summary as last updated (values JSON-decoded)."""
    out: dict = {}
    for rec in read_records(path):
        if rec.WhichOneof("record_type") == "summary":
            for item in rec.summary.update:
                out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


def user_history_paths(path: str | Path) -> dict[int, dict[tuple[str, ...], object]]:
    """The history by `_step`, each value under its key's path as W&B stored it (a nested dict's
    value under ("a", "b"), a flat key under ("a/b",): two keys user_history would join into
    one), without W&B's own row keys."""
    rows: dict[int, dict[tuple[str, ...], object]] = {}
    for rec in read_records(path):
        if rec.WhichOneof("record_type") == "history":
            row = {tuple(item.nested_key) if item.nested_key else (item.key,): json.loads(item.value_json)
                   for item in rec.history.item}
            step = row.pop(("_step",))
            rows[step] = {k: v for k, v in row.items() if k not in (("_timestamp",), ("_runtime",))}
    return rows


def summary_tree(path: str | Path) -> dict:
    """The run summary as W&B's server builds it from the file's summary records: each update
    set at its key or nested key (inside the dicts above it), each removal applied; W&B's own
    keys (_runtime, _timestamp, _wandb) left out."""
    out: dict = {}
    for rec in read_records(path):
        if rec.WhichOneof("record_type") != "summary":
            continue
        for item in rec.summary.update:
            keys = [item.key] if item.key else list(item.nested_key)
            node = out
            for k in keys[:-1]:
                if not isinstance(node.get(k), dict):
                    node[k] = {}
                node = node[k]
            node[keys[-1]] = json.loads(item.value_json)
        for item in rec.summary.remove:
            keys = [item.key] if item.key else list(item.nested_key)
            node = out
            for k in keys[:-1]:
                node = node.get(k) if isinstance(node.get(k), dict) else {}
            node.pop(keys[-1], None)
    return {k: v for k, v in out.items() if k not in ("_runtime", "_timestamp", "_wandb")}


def stats_rows(path: str | Path) -> list[dict]:
    """The run's system metrics (stats records of type SYSTEM: W&B's System section), as dicts."""
    from wandb.proto import wandb_internal_pb2

    return [{item.key: json.loads(item.value_json) for item in rec.stats.item}
            for rec in read_records(path) if rec.WhichOneof("record_type") == "stats"
            and rec.stats.stats_type == wandb_internal_pb2.StatsRecord.StatsType.SYSTEM]


def console(path: str | Path) -> dict[str, str]:
    """The console output W&B kept (its Logs tab): the text of each stream, in order."""
    out = {"stdout": "", "stderr": ""}
    for rec in read_records(path):
        kind = rec.WhichOneof("record_type")
        if kind in ("output_raw", "output"):
            o = getattr(rec, kind)
            out[type(o).OutputType.Name(o.output_type).lower()] += o.line
    return out


def user_history(path: str | Path) -> dict[int, dict]:
    """The history by `_step`, without the keys W&B adds to every row (_timestamp, _runtime)."""
    return {r["_step"]: {k: v for k, v in r.items() if k not in ("_step", "_timestamp", "_runtime")}
            for r in history_rows(path)}


def user_summary(path: str | Path) -> dict:
    """The summary without W&B's own keys (_runtime, _timestamp, _wandb/...): what a script put
    there, and the last value of each of its history keys; `_step` is kept."""
    return {k: v for k, v in summary(path).items() if k not in ("_runtime", "_timestamp") and not k.startswith("_wandb")}


def run_info(path: str | Path) -> dict:
    """What the run was opened with: project, name, group, tags, id (the first run record)."""
    for rec in read_records(path):
        if rec.WhichOneof("record_type") == "run":
            r = rec.run
            return {"project": r.project, "name": r.display_name, "group": r.run_group, "tags": list(r.tags),
                    "id": r.run_id}
    return {}


def wait_finished(path: str | Path, timeout_s: float = 30.0) -> str:
    """Wait until the run's file holds its exit record, and return the path.

    `run.finish()` can return before wandb's core process has written the run's records to the
    file (seen with wandb 0.31: a file of the 7-byte header alone right after finish, whole a
    moment later), so a test reads it only once it is complete. The file is read while the core
    writes it: a record torn at the read's end is read again on the next try."""
    import time

    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if any(rec.WhichOneof("record_type") == "exit" for rec in read_records(path)):
                return str(path)
        except (ValueError, DecodeError) as e:
            last = e                     # not even the header yet, or a record half written
        else:
            last = None
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: no exit record within {timeout_s} s (last read: {last!r})")
        time.sleep(0.05)
