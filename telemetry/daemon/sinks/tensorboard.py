"""TensorBoard event files (optional extra `tensorboard`), written on the sink's own thread.

Written with the `tensorboard` package's own event-file writer and protobufs, imported lazily at
start; not torch.utils.tensorboard, which would pull torch (hundreds of MB) into the daemon.
One TensorBoard event per record, holding all of its scalars. Aggregated steps use their step;
GPU, host and daemon records use the latest step seen (GPU values under gpu<i>/...).

Turned on (`tensorboard.enabled`) where the package is not installed, the daemon refuses to start
(one line naming the extra to install, exit 2) rather than run with a sink whose every record
would be dropped: the user asked for TensorBoard files and would find none, after the run.
"""
from __future__ import annotations

from pathlib import Path

from telemetry import DIST_NAME
from telemetry.daemon.sinks.base import Out, Sink, StartupError

# What installs the `tensorboard` package with this project (pyproject.toml's extra).
INSTALL_HINT = f"pip install '{DIST_NAME}[tensorboard]'"


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, log_dir: str | Path) -> None:
        if not _installed():
            import sys

            raise StartupError(f"tensorboard.enabled is set, but the tensorboard package is not installed for "
                               f"{sys.executable}: {INSTALL_HINT} (or set tensorboard.enabled: false)")
        self.log_dir = Path(log_dir) / "tensorboard"
        self._writer = None
        self._last_step = 0
        self.num_scalars = 0

    def start(self) -> None:
        try:      # lazy: optional extra, imported on the sink's thread
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as exc:      # installed, but broken (a protobuf it does not work with)
            raise ImportError(f"{exc} (reinstall it: {INSTALL_HINT})") from exc

        self._Event, self._Summary = Event, Summary
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.log_dir))

    def consume(self, batch: list[Out]) -> None:
        Event, Summary = self._Event, self._Summary
        Value = Summary.Value
        add = self._writer.add_event
        for o in batch:
            rec = o.record
            kind = o.kind
            if kind == "metrics" and "rank" not in rec:
                self._last_step = step = rec["step"]
            elif kind in ("gpu", "system", "daemon"):
                step = self._last_step
            else:
                continue
            prefix = f"gpu{rec.get('gpu', 0)}/" if kind == "gpu" else ""
            values = [Value(tag=prefix + k, simple_value=float(v)) for k, v in rec["values"].items()
                      if isinstance(v, (int, float))]
            if values:
                add(Event(wall_time=float(rec["t"]), step=int(step), summary=Summary(value=values)))
                self.num_scalars += len(values)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def stats(self) -> dict:
        return {"scalars": self.num_scalars}


def _installed() -> bool:
    """Whether `tensorboard` can be found, without importing it (that is the sink thread's)."""
    from importlib.util import find_spec

    try:
        return find_spec("tensorboard") is not None
    except (ImportError, ValueError):
        return False
