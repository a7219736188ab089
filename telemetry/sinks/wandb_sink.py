"""Weights & Biases, in the daemon only: the training processes never import wandb.

One W&B run per training run: its id is derived from the run name and kept in the log dir, and
`resume="allow"`, so a restarted daemon continues the same run. `wandb` is imported on this
sink's thread at start (about 0.7 s), never on the daemon's. The run's config comes from the
ranks' hello records. `finish()` gets a deadline: an unreachable server must not hold up the
daemon's exit (offline data stays on disk; `telemetry replay` or `wandb sync` uploads it later).
"""
from __future__ import annotations

import hashlib
import logging

import threading
from pathlib import Path

from telemetry.sinks.base import Out, Sink

log = logging.getLogger("telemetry.sinks.wandb")

MODES = ("disabled", "offline", "online")
FINISH_TIMEOUT_S = 30.0
# Hello keys that describe one process, not the run: they stay out of the run config.
PER_PROCESS_KEYS = frozenset({"pid", "src", "rank", "local_rank", "host"})
_MISSING = object()


def stable_run_id(run_name: str) -> str:
    return "tm-" + hashlib.sha1(run_name.encode()).hexdigest()[:12]


class WandbSink(Sink):
    name = "wandb"

    def __init__(self, mode: str, log_dir: str | Path, run_name: str, project: str = "telemetry",
                 entity: str | None = None, finish_timeout_s: float = FINISH_TIMEOUT_S) -> None:
        if mode not in MODES:
            raise ValueError(f"wandb mode {mode!r}: expected one of {', '.join(MODES)}")
        self.mode = mode
        self.log_dir = Path(log_dir)
        self.run_name = run_name
        self.project = project
        self.entity = entity
        self.finish_timeout_s = finish_timeout_s
        self.run = None
        self.run_id = ""
        self.num_logged = 0
        self._last_step = -1
        self._hellos: dict[int, dict] = {}
        self._config: dict = {}

    def start(self) -> None:
        import wandb  # lazy: ~0.7 s, on this sink's thread

        id_file = self.log_dir / "wandb_run_id"
        if id_file.exists():
            self.run_id = id_file.read_text().strip()
        else:
            self.run_id = stable_run_id(self.run_name + ":" + str(self.log_dir.resolve()))
            self.log_dir.mkdir(parents=True, exist_ok=True)
            id_file.write_text(self.run_id + "\n")
        self.run = wandb.init(mode=self.mode, project=self.project, entity=self.entity, name=self.run_name,
                              id=self.run_id, resume="allow", dir=str(self.log_dir), reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
        # Steps are training steps; host and GPU records follow wall time.
        self.run.define_metric("train/step")
        self.run.define_metric("*", step_metric="train/step")

    def consume(self, batch: list[Out]) -> None:
        run = self.run
        for o in batch:
            kind = o.kind
            rec = o.record
            if kind == "metrics" and "rank" not in rec:
                step = rec["step"]
                if step < self._last_step:
                    continue  # W&B refuses to go back in step; JSONL keeps everything
                self._last_step = step
                run.log({"train/step": step, **rec["values"]})
                self.num_logged += 1
            elif kind in ("gpu", "system", "daemon"):
                values = rec["values"]
                if kind == "gpu":
                    values = {k.replace("gpu/", f"gpu{rec['gpu']}/", 1): v for k, v in values.items()}
                run.log({"train/step": max(self._last_step, 0), **values})
                self.num_logged += 1
            elif kind == "hello":
                self._on_hello(rec.get("rank", 0), rec.get("info") or {})

    def _on_hello(self, rank: int, info: dict) -> None:
        """The run config: the lowest rank's latest hello (a rank's explicit hello supersedes its
        automatic one), without per-process keys; plus the world size and the hosts seen."""
        self._hellos[rank] = info
        base = self._hellos[min(self._hellos)]
        cfg = {k: v for k, v in base.items() if k not in PER_PROCESS_KEYS}
        sizes = [h.get("world_size") for h in self._hellos.values() if isinstance(h.get("world_size"), int)]
        if sizes:
            cfg["world_size"] = max(sizes)
        hosts = sorted({str(h["host"]) for h in self._hellos.values() if h.get("host")})
        if hosts:
            cfg["hosts"] = hosts
        changed = {k: v for k, v in cfg.items() if self._config.get(k, _MISSING) != v}
        if changed:
            self.run.config.update(changed, allow_val_change=True)
            self._config.update(changed)

    def close(self) -> None:
        if self.run is None:
            return
        t = threading.Thread(target=self.run.finish, name="wandb-finish", daemon=True)
        t.start()
        t.join(self.finish_timeout_s)
        if t.is_alive():
            log.error("wandb finish did not return within %.0f s; its data stays in %s", self.finish_timeout_s,
                      self.log_dir)
        self.run = None

    def stats(self) -> dict:
        return {"mode": self.mode, "run_id": self.run_id, "logged": self.num_logged}


