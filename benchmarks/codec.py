"""msgspec or msgpack for the wire format: measured on the two paths that matter.

Client side: encoding one metrics record (the 7-field header + step + 10 named floats), the
only codec work on the training thread. Daemon side: decoding and validating that frame into
a typed record, the receiver's per-record cost (it bounds ingest throughput).

    msgspec   msgspec.msgpack.Encoder().encode(tuple) / protocol.decode (typed Decoder + bounds)
    msgpack   msgpack.Packer().pack(tuple) / msgpack.unpackb + the same checks in Python,
              building the same protocol.Metrics struct, so both produce the same result
    C         the client's own encode of the tuple (protocol/_pack.c), when built: msgpack's bytes

Also measured, for a possible wire change: a per-connection name table, where a record
carries a table id and a list of values instead of a name -> value map.

Each figure is the median over `--repeats` batches of `--batch` operations, per operation,
so the timer's own cost (~50 ns) does not count.

    .venv/bin/python benchmarks/codec.py [--batch 2000] [--repeats 200] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Callable, Union

import msgpack
import msgspec

import protocol
from protocol import codec
from protocol.constants import KIND_METRICS, MAX_NAME_CHARS, MAX_VALUES, PROTOCOL_VERSION
from protocol.records import Metrics

KEYS = ["train/loss", "train/lr", "train/grad_norm", "train/epoch", "perf/step_time",
        "perf/tokens_per_second", "perf/samples_per_second", "perf/mfu", "memory/allocated_gb",
        "perf/data_loading_time"]
VALUES = {k: 1.0 / (i + 3) for i, k in enumerate(KEYS)}
HEADER = (KIND_METRICS, PROTOCOL_VERSION, 4_611_686_018_427_387_903, 3, 120_000, 0, 1_763_800_000_123_456_789)
_I64_MAX = (1 << 63) - 1


def per_op_ns(ops: dict[str, Callable[[], Any]], batch: int, repeats: int) -> dict[str, float]:
    """Median ns per op of each of `ops`, run round-robin (a batch of each in turn), so that
    load from other processes on a shared machine hits every op alike."""
    for fn in ops.values():
        for _ in range(batch):
            fn()
    pc = time.perf_counter_ns
    samples: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, fn in ops.items():
            t0 = pc()
            for _ in range(batch):
                fn()
            samples[name].append((pc() - t0) / batch)
    return {name: statistics.median(v) for name, v in samples.items()}


def msgpack_decode_validated(frame: bytes) -> Metrics:
    """What protocol.decode does, for a metrics record, with msgpack + Python checks."""
    try:
        a = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise protocol.MalformedRecord(str(exc)) from None
    if type(a) is not list or len(a) < 9 or a[0] != KIND_METRICS:
        raise protocol.MalformedRecord("not a metrics record")
    kind, version, src, rank, seq, dropped, t_ns, step, values = a[:9]
    if version != PROTOCOL_VERSION:
        raise protocol.MalformedRecord("version")
    for v in (src, rank, seq, dropped, t_ns, step):
        if type(v) is not int or not 0 <= v <= _I64_MAX:
            raise protocol.MalformedRecord("header field")
    if type(values) is not dict or len(values) > MAX_VALUES:
        raise protocol.MalformedRecord("values")
    for name, v in values.items():
        if not 0 < len(name) <= MAX_NAME_CHARS or (type(v) is not float and type(v) is not int):
            raise protocol.MalformedRecord("value")
    return Metrics(version, src, rank, seq, dropped, t_ns, step, values)


# The record bounds written as msgspec constraints, so that validation runs inside the C decoder:
# measured here first, since taken up by protocol/records.py.
_U63 = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_CHARS)]


class ConstrainedMetrics(msgspec.Struct, array_like=True, tag_field="kind", tag=KIND_METRICS, frozen=True):
    version: Annotated[int, msgspec.Meta(ge=PROTOCOL_VERSION, le=PROTOCOL_VERSION)]
    src: _U63
    rank: _U63
    seq: _U63
    dropped: _U63
    t_ns: _U63
    step: _U63
    values: Annotated[dict[_Name, Union[float, int]], msgspec.Meta(max_length=MAX_VALUES)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    b, r = args.batch, args.repeats

    record = (*HEADER, 120, VALUES)
    ms_enc = msgspec.msgpack.Encoder()
    mp_pack = msgpack.Packer(use_bin_type=True)
    ms_frame, mp_frame = ms_enc.encode(record), mp_pack.pack(record)
    assert ms_frame == mp_frame, "both must produce the same bytes for this record"
    pack_ints_map = codec.pack_ints_map
    assert pack_ints_map is None or pack_ints_map(*record) == mp_frame
    assert protocol.decode(ms_frame) == msgpack_decode_validated(mp_frame)

    table_record = (*HEADER, 120, 1, list(VALUES.values()))
    table_frame = ms_enc.encode(table_record)
    table_dec = msgspec.msgpack.Decoder(tuple[int, int, int, int, int, int, int, int, int, list[float]])

    raw_dec = msgspec.msgpack.Decoder(protocol.Record)
    c_dec = msgspec.msgpack.Decoder(ConstrainedMetrics)
    assert c_dec.decode(ms_frame).values == VALUES

    key_set = frozenset(KEYS)

    def table_client() -> bytes:
        # A table client must notice a changed key set (then send a new table) every call.
        if VALUES.keys() != key_set:
            raise AssertionError
        return ms_enc.encode((*HEADER, 120, 1, list(VALUES.values())))

    ops = {
        "client encode: msgspec Encoder.encode": lambda: ms_enc.encode(record),
        "client encode: msgpack Packer.pack": lambda: mp_pack.pack(record),
        "client encode: msgpack.packb": lambda: msgpack.packb(record),
        **({"client encode: C (protocol.codec.pack_ints_map, what log() uses)": lambda: pack_ints_map(*record)}
           if pack_ints_map is not None else {}),
        "daemon decode+validate: msgspec (protocol.decode)": lambda: protocol.decode(ms_frame),
        "daemon decode+validate: msgpack + Python checks": lambda: msgpack_decode_validated(mp_frame),
        "daemon decode only: msgspec typed Decoder(Record), no bounds": lambda: raw_dec.decode(ms_frame),
        "daemon decode only: msgpack.unpackb": lambda: msgpack.unpackb(mp_frame, raw=False, strict_map_key=True),
        "daemon decode+validate: msgspec, bounds as Meta constraints (all in C)": lambda: c_dec.decode(ms_frame),
        "name table, client: key check + list(values()) + encode": table_client,
        "name table, daemon: typed decode + zip to names": lambda: dict(zip(KEYS, table_dec.decode(table_frame)[9])),
    }
    rows = per_op_ns(ops, b, r)
    sizes = {"map of names (v1)": len(ms_frame), "name table": len(table_frame)}

    print(f"one metrics record of 10 floats; median of {r} batches x {b} ops; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print("| operation | ns per op |")
    print("|---|---:|")
    for name, ns in rows.items():
        print(f"| {name} | {ns:.0f} |")
    print(f"frame bytes: {sizes}")
    if args.json:
        args.json.write_text(json.dumps({"ns_per_op": rows, "frame_bytes": sizes,
                                         "versions": {"msgspec": msgspec.__version__,
                                                      "msgpack": ".".join(map(str, msgpack.version))}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
