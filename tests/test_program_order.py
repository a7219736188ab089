"""A rank's records are handled in the order it made them, though they reach the daemon by two
pipes: its metrics with tensor values go out on the client's sender-thread socket, everything
else on its main socket (telemetry/client/deferred.py), and the ingest socket interleaves the two
in any order. An event sent before a step's record (wandb/nested: how W&B must store that step's
keys; wandb/values: its row's text values) was written after the step on a loaded machine (CI:
the W&B drop-in's history had `extra/rank/plus_iter` flat beside the nested key)."""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

from protocol import encode_event, encode_hello, encode_metrics
from telemetry.daemon.config import load
from telemetry.daemon.core import Daemon
from telemetry.shared.control import request
from testkit import faults

SRC, STEPS = 4242, 20


def _frames_as_two_pipes_interleave_them() -> list[bytes]:
    """Step k: the event about it (seq 2k+1, main socket) and its record (seq 2k+2, the sender
    thread's socket), read record first, as the ingest socket may hand them over."""
    t = time.time_ns()
    frames = [encode_hello(SRC, 0, 0, 0, t, {"world_size": 1})]
    for k in range(STEPS):
        frames.append(encode_metrics(SRC, 0, 2 * k + 2, 0, t + k, k, {"train/loss": float(k)}))
        frames.append(encode_event(SRC, 0, 2 * k + 1, 0, t + k, "wandb/nested", {"paths": {"a/b": ["a", "b"]},
                                                                                "before_step": k}))
    # Another client's records between them keep their place and their own order.
    frames.insert(5, encode_event(SRC + 1, 1, 0, 0, t, "other", {"before_step": -1}))
    return frames


def test_a_ranks_event_is_written_before_the_step_it_preceded(tmp_path):
    rt = Path(faults.Endpoints().dir)
    cfg = load(None, {"log_dir": str(tmp_path / "tm"), "wandb.mode": "disabled", "ingest": f"ipc://{rt}/i",
                      "pub": f"ipc://{rt}/p", "control": f"ipc://{rt}/c", "aggregator.world_size": 1})
    d = Daemon(cfg)
    old_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    d.start()
    try:
        frames = _frames_as_two_pipes_interleave_them()
        d.intake._q.extend(frames)           # one batch, in the order the two pipes gave them
        d.intake.num_bytes += sum(map(len, frames))
        d.turn(max_wait_s=0)
        assert len(d.intake) == 0
        t = threading.Thread(target=lambda: setattr(d, "rc", d.run()), daemon=True)
        t.start()
        final = request(d.endpoints["control"], "drain", timeout_s=120)   # a hang detector
        t.join(120)
        assert not t.is_alive()
    finally:
        signal.set_wakeup_fd(-1)
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
    assert final["records_lost"] == 0 and final["records_in"] == len(frames)
    recs = [json.loads(x) for x in (tmp_path / "tm" / "metrics.jsonl").read_text().splitlines()]
    order = [("step", r["step"]) if r["kind"] == "metrics" else ("event", r["data"]["before_step"])
             for r in recs if r["kind"] == "metrics" or (r["kind"] == "event" and "before_step" in r["data"])]
    # Each step's event, then the step; the other client's event where it came.
    want = [("event", 0), ("step", 0), ("event", 1), ("step", 1), ("event", -1)]
    want += [x for k in range(2, STEPS) for x in (("event", k), ("step", k))]
    assert order == want
