"""Timed regions of a training step: `with tm.span("forward"): ...`.

On a GPU the time that matters is the device's, and the host only knows it after a sync. So
when CUDA is in use a span records two timing events on the current stream and nothing else;
the client's sender thread reads `elapsed_time` once the end event has completed. Without
CUDA a span is two `perf_counter` reads.

Spans are not sent on their own: each log() call carries the spans that closed since the
previous one, as the mean duration in seconds per occurrence under `perf/<name>_time` (a name
with a "/" is used as given). So `span("forward")` lands as `perf/forward_time` in the same
record, and the same step, as the loss it belongs with.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from telemetry.client.fastlog import PyLogState

# CUDA event pairs kept per name between two log() calls; a loop that logs rarely but spans
# often keeps the first ones (a mean over them) instead of holding events without bound.
MAX_CUDA_SPANS_PER_NAME = 256


def metric_name(name: str) -> str:
    """The metric a span named `name` reports: "forward" -> "perf/forward_time"."""
    if not name:
        raise ValueError("span name must not be empty")
    return name if "/" in name else f"perf/{name}_time"


def _cuda_in_use() -> Any:
    """torch, if this process already uses CUDA; never imports torch or initialises CUDA."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch
    return None


class PendingSpans:
    """CUDA spans handed to the sender thread; `resolve` there, never on the caller's thread."""

    __slots__ = ("_pairs",)

    def __init__(self, pairs: dict[str, list[tuple[Any, Any]]]) -> None:
        self._pairs = pairs

    def resolve(self) -> dict[str, float]:
        out = {}
        for key, pairs in self._pairs.items():
            total_ms = 0.0
            for start, end in pairs:
                # CPU-GPU sync point, on the sender thread only (instant for all but the
                # last pair when they share a stream; a span may have used another one).
                end.synchronize()
                total_ms += start.elapsed_time(end)
            out[key] = total_ms / 1000.0 / len(pairs)
        return out


class Span:
    """One timed region; create through `SpanRecorder.span`."""

    __slots__ = ("_rec", "_key", "_torch", "_t0", "_start")

    def __init__(self, rec: "SpanRecorder", key: str, torch: Any) -> None:
        self._rec = rec
        self._key = key
        self._torch = torch
        self._t0 = 0.0
        self._start = None

    def __enter__(self) -> "Span":
        if self._torch is not None:
            self._start = self._torch.cuda.Event(enable_timing=True, blocking=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._torch is not None:
            end = self._torch.cuda.Event(enable_timing=True, blocking=True)
            end.record()
            self._rec._add_cuda(self._key, self._start, end)
        else:
            self._rec._add_cpu(self._key, time.perf_counter() - self._t0)


class SpanRecorder:
    """Collects closed spans between two log() calls (the caller's thread only)."""

    __slots__ = ("_cpu", "_cuda", "_st")

    def __init__(self, state: Any = None) -> None:
        self._cpu: dict[str, list] = {}           # key -> [total_s, count]
        self._cuda: dict[str, list[tuple[Any, Any]]] = {}
        # Whether spans wait for the next log() is the client's state's `spans` (fastlog.py),
        # which log()'s common case reads.
        self._st = state if state is not None else PyLogState()
        self.pending = False

    @property
    def pending(self) -> bool:
        return self._st.spans

    @pending.setter
    def pending(self, value: bool) -> None:
        self._st.spans = value

    def span(self, name: str, cuda: bool | None = None) -> Span:
        """A context manager timing its body; `cuda` None: CUDA events if CUDA is in use."""
        torch = _cuda_in_use() if cuda is None else (sys.modules["torch"] if cuda else None)
        return Span(self, metric_name(name), torch)

    def _add_cpu(self, key: str, dt_s: float) -> None:
        acc = self._cpu.get(key)
        if acc is None:
            self._cpu[key] = [dt_s, 1]
        else:
            acc[0] += dt_s
            acc[1] += 1
        self.pending = True

    def _add_cuda(self, key: str, start: Any, end: Any) -> None:
        pairs = self._cuda.setdefault(key, [])
        if len(pairs) < MAX_CUDA_SPANS_PER_NAME:
            pairs.append((start, end))
        self.pending = True

    def take(self) -> tuple[dict[str, float], PendingSpans | None]:
        """The closed spans since the last call: CPU means now, CUDA spans to resolve later."""
        cpu = {k: total / n for k, (total, n) in self._cpu.items()}
        cuda = PendingSpans(self._cuda) if self._cuda else None
        self._cpu = {}
        self._cuda = {}
        self.pending = False
        return cpu, cuda
