"""A metrics record refused only for some of its values keeps the rest: the daemon takes the
record without them (received, its seq accounted, not malformed) and counts each one by reason in
values_refused (status, the `daemon` record, one log line per reason); fed raw frames, as
another client may send them. Our own client leaves such a value out itself (counted in its
skipped_values, said once), so from it the daemon refuses none (it used to send them as logged).
Both inner loops (C and pure Python) give the same."""
from __future__ import annotations

import subprocess
import sys
import warnings

import msgpack
import pytest

import protocol
from daemon_util import feed, start_daemon
from telemetry.client import TelemetryClient
from telemetry.daemon import hotpath
from telemetry.daemon import loops as python_loops
from telemetry.daemon.receiver import Receiver

LONG = "n" * (protocol.MAX_NAME_CHARS + 1)


def _nested(depth: int) -> dict:
    value = 1.0
    for _ in range(depth):
        value = {"a": value}
    return value


# (step, the row logged, the reason the one bad value is refused for)
ROWS = [
    (0, {"x": 0.5, "deep": {"a": 1.0}}, "map"),
    (1, {"x": 1.5, "deeper": {"a": {"b": {"c": 1.0}}}}, "map"),
    (2, {"x": 2.5, "l": [1.0, 2.0]}, "list"),
    (3, {"x": 3.5, "t": (1.0,)}, "list"),          # msgpack sends a tuple as an array
    (4, {"x": 4.5, "s": "text"}, "text"),
    (5, {"x": 5.5, LONG: 1.0}, "name"),
    (6, {"x": 6.5, "abyss": _nested(1000)}, "map"),   # deeper than msgspec decodes, as deep as msgpack packs
    (7, {"x": 7.5, "y": 2}, None),                 # all good
]
WANT_REFUSED = {"map": 3, "list": 2, "text": 1, "name": 1}

LOOPS = [pytest.param(python_loops, id="python_loops"),
         pytest.param(hotpath.native, id="c_loops",
                      marks=pytest.mark.skipif(hotpath.native is None, reason="C loops not built"))]


@pytest.mark.parametrize("loops", LOOPS)
def test_the_receiver_keeps_the_good_values_of_a_row(loops):
    protocol.codec._good_names.clear()      # the overlong name's key set must be checked here
    r = Receiver(loops)
    frames = [protocol.encode_metrics(7, 0, seq, 0, 1, step, row) for seq, (step, row, _) in enumerate(ROWS)]
    recs, all_metrics = feed(r, frames)
    assert all_metrics
    assert [(rec.seq, rec.step, dict(rec.values)) for rec in recs] == \
        [(seq, step, {k: v for k, v in row.items() if k == "x" or reason is None})
         for seq, (step, row, reason) in enumerate(ROWS)]
    t = r.totals()
    assert (t["records_in"], t["records_malformed"], t["records_lost"]) == (len(ROWS), 0, 0), t
    assert r.values_refused == WANT_REFUSED and t["values_refused"] == sum(WANT_REFUSED.values())
    assert r.sources[7].received == len(ROWS) and r.sources[7].refused == 0


@pytest.mark.parametrize("loops", LOOPS)
def test_a_record_bad_beyond_its_values_is_still_malformed(loops):
    """Salvage is for the values only: a bad header or step, or every value good but the frame
    not a record, is refused whole as before (and nothing is counted as a refused value)."""
    r = Receiver(loops)
    frames = [msgpack.packb([2, 1, 7, 0, 0, 0, 1, -5, {"x": 1.0, "s": "text"}]),      # a negative step
              msgpack.packb([2, 2, 7, 0, 1, 0, 1, 0, {"x": 1.0, "s": "text"}]),       # another version
              msgpack.packb([2, 1, 7, 0, 2, 0, 1, 0, {"x": 1.0}, 0]),                 # parts 0
              protocol.encode_metrics(7, 0, 3, 0, 1, 3, {"x": 1.0})]
    recs, _ = feed(r, frames)
    assert [rec.seq for rec in recs] == [3]
    t = r.totals()
    assert (t["records_in"], t["records_malformed"], t["values_refused"]) == (1, 3, 0), t
    assert r.values_refused == {}


@pytest.mark.parametrize("pure_python", ["0", "1"], ids=["c_loops", "python_loops"])
def test_a_daemon_fed_bad_values_says_each_reason_in_status_its_record_and_its_log(tmp_path, pure_python):
    """What another client (not ours, which leaves them out) sends: each refused value counted by
    reason in `telemetry status`, the daemon record and one log line per reason."""
    import zmq

    from testkit.daemon_proc import raw_push

    d = start_daemon(tmp_path, world_size=1, env={"TELEMETRY_PURE_PYTHON": pure_python})
    ctx = zmq.Context()
    try:
        push = raw_push(ctx, d.ingest)
        for seq, (step, row, _) in enumerate(ROWS):
            push.send(protocol.encode_metrics(7, 0, seq, 0, 1, step, row))
        d.wait_for(lambda recs: any(r.get("step") == ROWS[-1][0] and "values" in r and "rank" not in r
                                    for r in recs))
        st = d.status()
        assert st["values_refused_by_reason"] == WANT_REFUSED and st["records_malformed"] == 0, st
        out = subprocess.run([sys.executable, "-m", "telemetry", "status", "--control", d.control],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert f"values refused {st['values_refused']}" in out.stdout, out.stdout
        push.close()
        assert d.stop() == 0, d.output()[-3000:]
        (last_daemon, *_) = reversed(d.read_jsonl(kind="daemon"))
        assert last_daemon["values"]["telemetry/values_refused"] == st["values_refused"]
        log = (d.log_dir / "daemon.log").read_text()
        for reason in st["values_refused_by_reason"]:
            assert log.count(f"{reason} is not a number" if reason != "name" else "characters wanted") == 1, log
        assert "Traceback" not in d.output()
    finally:
        ctx.destroy(linger=0)
        d.cleanup()


@pytest.mark.parametrize("pure_python", ["0", "1"], ids=["c_loops", "python_loops"])
def test_a_real_client_loses_only_the_bad_values_and_counts_them_itself(tmp_path, pure_python):
    d = start_daemon(tmp_path, world_size=1, env={"TELEMETRY_PURE_PYTHON": pure_python})
    try:
        assert d.status()["inner_loops"] == ("python" if pure_python == "1" else "c")
        tm = TelemetryClient(d.ingest, rank=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")         # whether the client itself says anything is not asked here
            for step, row, _ in ROWS:
                tm.log(step, row)
        sent = tm.stats()
        tm.close()
        last = ROWS[-1][0]
        d.wait_for(lambda recs: any(r.get("step") == last and "values" in r and "rank" not in r for r in recs))
        steps = d.steps()
        for step, row, reason in ROWS:
            got = {k: v for k, v in steps[step]["values"].items() if not k.startswith("_")}
            want = {k: v for k, v in row.items() if k == "x" or reason is None}
            assert {k: got.get(k) for k in want} == want, (step, got)
            assert not set(row) - set(want) & set(got), (step, got)
        st = d.status()
        # Each bad value left out by the client, counted there; none sent for the daemon to refuse.
        assert sent["skipped_values"] == len(ROWS) - 1 and sent["dropped"] == 0, sent
        assert st["values_refused"] == 0 and st["values_refused_by_reason"] == {}, st
        assert st["records_malformed"] == 0 and st["records_lost"] == 0, st
        assert st["per_rank"]["0"]["refused"] == 0
        assert d.stop() == 0, d.output()[-3000:]
        assert "Traceback" not in d.output()
    finally:
        d.cleanup()



def test_the_drain_summary_says_the_values_refused():
    from telemetry.consumers.drain import summary_lines

    assert any("values refused alone (the rest of their rows kept) 3" in line
               for line in summary_lines({"values_refused": 3, "records_lost": 0}))
    assert not any("values refused" in line for line in summary_lines({"values_refused": 0, "records_lost": 0}))


def test_the_drain_summary_says_how_long_the_daemon_ran_not_the_drain():
    from telemetry.consumers.drain import summary_lines

    first = summary_lines({"run_name": "r", "drained": True, "stop_reason": "SIGTERM", "uptime_s": 6.2})[0]
    assert first == "run r: drained (SIGTERM); the daemon ran 6 s", first
