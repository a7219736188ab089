"""One trainer process of the GPU benchmark: the real trainer (trainer.train.main) with a recorder.

    python -m benchmarks.gpu.child --variant off|ours|seed --out R.json --run-dir D \\
        [--warmup N] [--sync-check-from S] -- [trainer overrides: key=value ...]

The telemetry client the trainer builds is wrapped in a Recorder that
  - keeps the trainer's own perf/step_time of every logged step (host time between step ends,
    which includes the previous step's logging);
  - at the end of step `warmup` and at "train_end" waits for the device (torch.cuda.synchronize,
    outside the measured steps) so window_s / window_steps is the true mean step time;
  - with --sync-check-from S, opens a SyncWindow (benchmarks/gpu/syncguard.py) after step S's
    log call and closes it at "train_end": every step in between, log steps and others, runs
    with syncs as errors.
Variants: off = telemetry disabled (the trainer's do-nothing client), ours = our TelemetryClient
to the daemon at telemetry_endpoint, seed = benchmarks/gpu/seed_monitor.SeedMonitor.
Writes one JSON object to --out, whatever the trainer's exit code.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.gpu import seed_monitor
from benchmarks.gpu.syncguard import SyncWindow


class Recorder:
    """Wraps the variant's client; records step times, the synchronized window and the sync check."""

    def __init__(self, inner, warmup: int, sync_from: int | None, cuda: bool, inject_sync: bool = False,
                 sync_mode: str = "error") -> None:
        self.inner, self.warmup, self.sync_from, self.cuda = inner, warmup, sync_from, cuda
        self.inject_sync = inject_sync
        self.steps: list[int] = []
        self.step_times_s: list[float] = []
        self.t_window = None
        self.window_s = None
        self.window_steps = 0
        self.last_step = 0
        self.sync = SyncWindow(cuda, sync_mode) if sync_from is not None else None

    def _device_wait(self) -> None:
        if self.cuda:
            import torch
            torch.cuda.synchronize()  # benchmark bookkeeping, outside the measured steps

    def hello(self, info: dict) -> None:
        self.inner.hello(info)

    def event(self, name: str, data: dict | None = None) -> None:
        if name == "train_end":
            self.last_step = int((data or {}).get("step", self.last_step))  # steps after the last log count too
            self.finish()
        self.inner.event(name, data)

    def stats(self) -> dict:
        return self.inner.stats()

    def log(self, step: int, values: dict, parts: int = 1) -> None:
        if "perf/step_time" in values:
            self.steps.append(step)
            self.step_times_s.append(float(values["perf/step_time"]))  # a host float, no sync
        self.inner.log(step, values, parts)
        self.last_step = step
        if self.sync is not None:
            self.sync.step = step + 1
            if step >= self.sync_from and not self.sync.active and self.sync.first_step is None:
                self.sync.first_step = step + 1  # the rest of this step is checked too
                self.sync.start()
            if self.inject_sync and self.sync.active:
                values["train/loss"].item()  # --inject-sync: proves the check can fail
        if step == self.warmup and self.t_window is None:
            self._device_wait()
            self.t_window = time.perf_counter()

    def finish(self) -> None:
        """Close the sync window and the timing window (idempotent)."""
        if self.sync is not None and self.sync.active:
            self.sync.last_step = self.last_step
            self.sync.stop()
        if self.t_window is not None and self.window_s is None:
            self._device_wait()
            self.window_s = time.perf_counter() - self.t_window
            self.window_steps = self.last_step - self.warmup

    def close(self, timeout_s: float | None = None) -> None:
        self.finish()
        self.inner.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", choices=("off", "ours", "seed"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--config", default=None)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--sync-check-from", type=int, default=None)
    ap.add_argument("--inject-sync", action="store_true",
                    help="self-test: read train/loss on the training thread inside the sync window")
    ap.add_argument("--sync-mode", choices=("error", "warn"), default="error",
                    help="torch's sync debug mode in the window: error (the first sync ends the run) or warn "
                         "(every sync recorded with its caller; a library's own listed, ours failing)")
    ap.add_argument("--seed-profile-every", type=int, default=seed_monitor.PROFILE_EVERY)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)

    import torch

    import telemetry
    import telemetry.client as tc
    from trainer import train

    cuda = torch.cuda.is_available()
    recorders: list[Recorder] = []

    def make_client(endpoint=None, rank=None, **kwargs):
        if args.variant == "seed":
            inner = seed_monitor.SeedMonitor(args.run_dir, profile_every=args.seed_profile_every)
        else:
            inner = tc.TelemetryClient(endpoint=endpoint, rank=rank, **kwargs)
        rec = Recorder(inner, args.warmup, args.sync_check_from, cuda, args.inject_sync, args.sync_mode)
        recorders.append(rec)
        return rec

    seed_monitor.capture_forward_loss()  # every variant runs the same wrapper
    telemetry.__dict__["TelemetryClient"] = make_client  # train.main imports it at call time
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    argv_train = (["--config", args.config] if args.config else []) + [*args.overrides, f"run_dir={args.run_dir}"]
    t0 = time.perf_counter()
    rc = train.main(argv_train)
    wall_s = time.perf_counter() - t0
    rec = recorders[0] if recorders else None
    result = {
        "variant": args.variant, "rc": rc, "wall_s": wall_s,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "steps": rec.steps if rec else [], "step_times_s": rec.step_times_s if rec else [],
        "warmup": args.warmup,
        "window_s": rec.window_s if rec else None, "window_steps": rec.window_steps if rec else 0,
        "client_stats": _safe_stats(rec),
        "max_memory_allocated_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "sync_check": rec.sync.summary() if rec and rec.sync else None,
        "sync_check_from": args.sync_check_from,
    }
    Path(args.out).write_text(json.dumps(result))
    return rc


def _safe_stats(rec: Recorder | None) -> dict:
    try:
        return {k: v for k, v in rec.inner.stats().items() if isinstance(v, (int, float, str))} if rec else {}
    except Exception as e:  # a closed client may refuse; the figures matter more
        return {"error": str(e)}


if __name__ == "__main__":
    sys.exit(main())
