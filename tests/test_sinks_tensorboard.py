"""TensorBoard sink (optional extra): scalars land in event files that TensorBoard reads."""
import msgspec
import pytest

from protocol import output
from telemetry.daemon.sinks.base import Out
from telemetry.daemon.sinks.tensorboard import TensorBoardSink

pytest.importorskip("tensorboard")


def o(rec):
    """The record as the daemon hands it to a sink: the declared Struct (protocol/output.py)."""
    line = msgspec.json.encode(rec)
    return Out(rec["kind"], output.check(line), line)


def test_scalars_readable_by_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    s = TensorBoardSink(tmp_path)
    s.start()
    s.consume([o({"kind": "metrics", "t": 1.0, "step": s_, "values": {"train/loss": 1.0 / (s_ + 1)}})
               for s_ in range(5)])
    s.consume([o({"kind": "gpu", "t": 2.0, "host": "h", "gpu": 1, "values": {"gpu/util_percent": 97}}),
               o({"kind": "metrics", "t": 2.0, "step": 9, "rank": 3, "values": {"train/loss": 7.0}}),
               o({"kind": "event", "t": 2.0, "rank": 0, "name": "x", "data": {}})])
    s.flush()
    s.close()
    s.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [0, 1, 2, 3, 4]          # the per-rank record is not mixed in
    assert loss[1].value == pytest.approx(0.5)
    (gpu,) = acc.Scalars("gpu1/gpu/util_percent")
    assert gpu.step == 4 and gpu.value == 97
    assert s.stats()["scalars"] == 6
