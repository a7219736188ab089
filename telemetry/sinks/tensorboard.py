"""TensorBoard event files (optional extra `tensorboard`); imported lazily on the sink's thread."""
from __future__ import annotations

from pathlib import Path

from telemetry.sinks.base import Out, Sink


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir) / "tensorboard"
        self._writer = None
        self._last_step = 0
        self.num_scalars = 0

    def start(self) -> None:
        from torch.utils.tensorboard import SummaryWriter  # lazy: heavy, optional

        self._writer = SummaryWriter(str(self.log_dir))

    def consume(self, batch: list[Out]) -> None:
        w = self._writer
        for o in batch:
            rec = o.record
            if o.kind == "metrics" and "rank" not in rec:
                self._last_step = step = rec["step"]
            elif o.kind in ("gpu", "system", "daemon"):
                step = self._last_step
            else:
                continue
            prefix = f"gpu{rec['gpu']}/" if o.kind == "gpu" else ""
            for k, v in rec["values"].items():
                if isinstance(v, (int, float)):
                    w.add_scalar(prefix + k if prefix else k, v, step, walltime=rec["t"])
                    self.num_scalars += 1

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def stats(self) -> dict:
        return {"scalars": self.num_scalars}
