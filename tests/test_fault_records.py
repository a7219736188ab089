"""The issue's single records that stopped the daemon, each against a real daemon process:
invalid UTF-8, an ext type, non-str map keys, a None where throughput expects a number, model
configs that hung or broke MFU, world sizes of 10^6 and 10^9. The daemon stays up, answers
status, counts what it refuses, writes what it keeps, and stops cleanly on SIGTERM."""
from __future__ import annotations

import time

import msgpack
import pytest
import zmq

from protocol import encode_event, encode_hello, encode_metrics
from daemon_util import start_daemon
from telemetry.client import TelemetryClient

LOOPS = pytest.mark.parametrize("pure_python", ["0", "1"], ids=["c_loops", "python_loops"])


def _settle(d, expected: int, timeout_s: float = 120) -> dict:
    """Status once `expected` records were taken in (or refused), or at the deadline (a hang
    detector, generous for a loaded machine: the caller's assertion then shows what was seen)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert d.proc.poll() is None, d.output()[-3000:]
        s = d.status()
        if s["records_in"] + s["records_malformed"] >= expected or time.monotonic() > deadline:
            return s
        time.sleep(0.02)


def _wait_output(d, *needles: str, timeout_s: float = 120) -> str:
    """The daemon's output once one of `needles` is in it: its log lines reach us through a pipe
    and a reader thread, after the records it wrote at the same time."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = d.output()
        if any(n in out for n in needles):
            return out
        assert d.proc.poll() is None and time.monotonic() < deadline, f"none of {needles} in: {out[-3000:]}"
        time.sleep(0.05)


@LOOPS
def test_invalid_utf8_ext_types_and_odd_keys(tmp_path, pure_python):
    d = start_daemon(tmp_path, transport="tcp", world_size=1, env={"TELEMETRY_PURE_PYTHON": pure_python})
    ctx = zmq.Context()
    push = d.push(ctx)
    try:
        bad_utf8_metric = encode_metrics(1, 0, 0, 0, 1, 1, {"ab": 1.0}).replace(b"\xa2ab", b"\xa2\xff\xfe")
        bad_utf8_event = encode_event(1, 0, 1, 0, 1, "e", {"k": "vv"}).replace(b"\xa2vv", b"\xa2\xc0\x80")
        ext_hello = msgpack.packb([1, 1, 1, 0, 2, 0, 1, {"x": msgpack.ExtType(3, b"ab")}])
        odd_keys = msgpack.packb([3, 1, 1, 0, 3, 0, 1, "odd", {"a": {None: 1, 2: [1], (0, 1): True}}])
        for f in (bad_utf8_metric, bad_utf8_event, ext_hello, odd_keys):
            push.send(f)
        s = _settle(d, 4)
        assert (s["records_in"], s["records_malformed"], s["records_failed"]) == (1, 3, 0), s
        assert d.stop() == 0, d.output()[-3000:]
        (event,) = [r for r in d.read_jsonl(kind="event") if r["name"] == "odd"]
        assert event["data"] == {"a": {"null": 1, "2": [1], "[0,1]": True}}
        assert "Traceback" not in d.output()
    finally:
        push.close(linger=0)
        ctx.term()
        d.cleanup()


@LOOPS
def test_a_none_where_throughput_wants_a_number(tmp_path, pure_python):
    d = start_daemon(tmp_path, world_size=1, env={"TELEMETRY_PURE_PYTHON": pure_python})
    try:
        tm = TelemetryClient(d.ingest, rank=0)
        tm.log(1, {"perf/step_time": 0.1, "perf/tokens": None, "perf/samples": None})
        tm.log(2, {"perf/step_time": 0.1, "perf/tokens": 100})
        tm.close()
        d.wait_for(lambda recs: any(r.get("step") == 2 and "values" in r for r in recs))
        steps = d.steps()
        assert steps[1]["values"]["perf/steps_per_second"] == pytest.approx(10.0)
        assert steps[2]["values"]["perf/tokens_per_second"] == pytest.approx(1000.0)
        assert d.status()["records_failed"] == 0
    finally:
        d.cleanup()


MODEL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 128, "vocab_size": 1000}


@pytest.mark.parametrize("hf_config", [
    {**MODEL, "num_attention_heads": 0},
    {**MODEL, "head_dim": float("inf")},
    {**MODEL, "model_type": "qwen2_moe", "num_hidden_layers": 10**12, "num_experts": 8, "num_experts_per_tok": 2},
    {**MODEL, "hidden_size": "wide", "vocab_size": [1]},
], ids=["zero_heads", "inf_head_dim", "1e12_moe_layers", "strings"])
def test_a_hostile_model_config_costs_mfu_not_the_daemon(tmp_path, hf_config):
    d = start_daemon(tmp_path, transport="tcp", world_size=1)
    ctx = zmq.Context()
    push = d.push(ctx)
    try:
        push.send(encode_hello(5, 0, 0, 0, 1, {"model": {"hf_config": hf_config, "seq_len": 16}}))
        push.send(encode_metrics(5, 0, 1, 0, 1, 1, {"perf/step_time": 0.5, "perf/tokens": 64}))
        s = _settle(d, 2)
        assert s["records_in"] == 2 and s["records_failed"] == 0, s
        d.wait_for(lambda recs: any(r.get("step") == 1 for r in recs), timeout_s=120)
        _wait_output(d, "no MFU for this run", "MFU disabled")
        assert d.stop() == 0
    finally:
        push.close(linger=0)
        ctx.term()
        d.cleanup()


@pytest.mark.parametrize("world_size", [10**6, 10**9])
def test_a_hello_world_size_is_believed_only_within_bounds(tmp_path, world_size):
    d = start_daemon(tmp_path, transport="tcp", config={"aggregator": {"step_timeout_s": 0.2}})
    ctx = zmq.Context()
    push = d.push(ctx)
    try:
        push.send(encode_hello(5, 0, 0, 0, 1, {"world_size": world_size}))
        for step in range(3):
            push.send(encode_metrics(5, 0, step + 1, 0, 1, step, {"train/loss": 1.0}))
        s = _settle(d, 4)
        assert s["world_size"] == 1, s
        d.wait_for(lambda recs: any(r.get("step") == 2 for r in recs), timeout_s=120)
        assert all("missing_ranks" not in r for r in d.read_jsonl(kind="metrics"))
        _wait_output(d, "world_size=%d" % world_size)
    finally:
        push.close(linger=0)
        ctx.term()
        d.cleanup()


@pytest.mark.timeout(600)
def test_a_flood_of_fake_hellos_is_bounded(tmp_path):
    """Hellos from 100k distinct fake ranks, each with a pid on this host: neither memory nor the
    time per hello grows with them (each hello used to rebuild the pid map of all hellos)."""
    import socket as _socket

    from telemetry.daemon.aggregator import MAX_WORLD_SIZE

    d = start_daemon(tmp_path, transport="tcp", world_size=1)
    ctx = zmq.Context()
    push = d.push(ctx, sndhwm=200_000)
    try:
        n = 100_000
        host = _socket.gethostname()
        for rank in range(n):
            push.send(encode_hello(1000 + rank, rank, 0, 0, 1, {"pid": 4242, "host": host}))
        # A hang detector, not a speed: rebuilding a map of every hello per hello took hours.
        s = _settle(d, n, timeout_s=300)
        assert s["records_in"] == n, s
        assert s["hellos_not_kept"] == n - MAX_WORLD_SIZE, s
    finally:
        push.close(linger=0)
        ctx.term()
        d.cleanup()


def test_a_hostile_pid_in_a_hello_reaches_no_poller(tmp_path):
    """A hello's pid goes to the host poller (psutil): a negative one raised there (found by the
    fuzz test). Only a pid in 1..2^22 is passed on."""
    import socket as _socket

    d = start_daemon(tmp_path, transport="tcp", world_size=1, config={"pollers": {"host_interval_s": 0.1}})
    ctx = zmq.Context()
    push = d.push(ctx)
    try:
        host = _socket.gethostname()
        push.send(encode_hello(5, 0, 0, 0, 1, {"pid": -610357, "host": host}))
        push.send(encode_hello(6, 1, 0, 0, 1, {"pid": 1 << 40, "host": host}))
        _settle(d, 2)
        time.sleep(0.5)                        # a few poller rounds
        assert d.stop() == 0
        assert "Traceback" not in d.output(), d.output()[-3000:]
    finally:
        push.close(linger=0)
        ctx.term()
        d.cleanup()
