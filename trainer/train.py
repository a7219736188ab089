"""Train a causal LM with DeepSpeed (or torch/DDP) and report through the telemetry sidecar.

    python -m trainer.train --config launch/configs/tiny.yaml steps=20 run_dir=runs/x optim.lr=1e-4
    torchrun --nproc_per_node 2 -m trainer.train --config ... run_dir=... steps=...

The step path never waits on the device: loss, grad norm and per-dataset counters stay on the
device and go to the telemetry client as 0-dim tensors, which it reads on its own thread.
Phase timings come from CUDA events read once they have completed (perf_counter on CPU).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from trainer import checkpoint as ckpt
from trainer.config import TrainConfig, load_config
from trainer.data import IGNORE_INDEX, make_loader
from trainer.engine import make_engine, resolve_backend
from trainer.faults import make_faults
from trainer.memory_estimate import device_memory_gb, estimate, memory_warning
from trainer.metrics import (DatasetMetrics, HostFlag, PhaseTimer, ddp_of, memory_stats, time_ddp_waits,
                             time_gather_waits, time_update)
from trainer.model import DTYPES, build_model, forward_loss, num_params, prepare_batch, uses_block_mask
from trainer.runtime import STOP_NONFINITE, LossLog, StopSignal, init_distributed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None, help="YAML config (default: launch/configs/tiny.yaml)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. optim.lr=1e-4")
    p.add_argument("--check-config", action="store_true",
                   help="only load and validate the config (exit 0, or 2 with the error), train nothing")
    # The deepspeed launcher passes --local_rank=N; the rank is read from $LOCAL_RANK.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except (ValueError, OSError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    problem = check_run_dir(cfg.run_dir)
    if problem:
        print(f"config error: run_dir: {problem}", file=sys.stderr)
        return 2
    if cfg.checkpoint.resume not in ("auto", "none"):
        problem = ckpt.incomplete_reason(Path(cfg.checkpoint.resume))
        if problem:
            print(f"config error: checkpoint.resume: {cfg.checkpoint.resume} is not a complete checkpoint: {problem}",
                  file=sys.stderr)
            return 2
    if args.check_config:
        return 0
    info = init_distributed(need_process_group=resolve_backend(cfg) == "deepspeed")
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    engine = make_engine(cfg, build_model(cfg.model), info)
    from telemetry import TelemetryClient
    tm = TelemetryClient(endpoint=cfg.telemetry_endpoint, rank=info.rank)
    run = Run(cfg, engine, info, tm)
    try:
        return run.train()
    finally:
        run.close()


def check_run_dir(run_dir: str) -> str:
    """Why checkpoints could not be written under `run_dir` ("" if they can): its nearest existing
    ancestor must be a directory that takes a file (tried with a temporary one, removed at once;
    rank 0 makes the directory on its first save)."""
    import tempfile

    path = Path(os.path.abspath(run_dir))
    while not path.exists():
        path = path.parent
    if not path.is_dir():
        return f"{path} is a file, not a directory"
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return f"{path} is not writable ({exc.strerror or exc})"
    return ""


class Run:
    """One training run on one rank: the loop, its metrics, checkpoints and stop handling."""

    def __init__(self, cfg: TrainConfig, engine, info, tm) -> None:
        self.cfg, self.engine, self.info, self.tm = cfg, engine, info, tm
        self.device = info.device
        self.names = [d.name for d in cfg.data.datasets]
        self.is_main = info.rank == 0
        self.block_mask = uses_block_mask(cfg.model.attn_implementation)
        self.compute_dtype = DTYPES[cfg.model.dtype]
        self.faults = make_faults(cfg.debug, info.rank)
        self.pin = self.device.type == "cuda" and cfg.data.pin_memory
        self.config_yaml = _yaml(cfg)
        self.loss_log = LossLog(cfg.debug_loss_log, info.rank)
        # Each checkpoint save's time, and the part of it debug.slow_checkpoint_s slept, beside it.
        self.save_log = LossLog(cfg.debug_loss_log + ".saves" if cfg.debug_loss_log else "", info.rank)
        self.stop = StopSignal(info.world_size)
        self.step = 0  # completed optimizer steps
        self.samples_seen = 0  # documents this rank has trained on, kept across resumes

    # -- set-up ----------------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.cfg
        path = None if cfg.checkpoint.resume in ("none", "auto") else Path(cfg.checkpoint.resume)
        if cfg.checkpoint.resume == "auto":
            path, skipped = ckpt.latest(cfg.run_dir)
            for bad, why in skipped:
                self._print(f"checkpoint {bad} is incomplete ({why}): skipped"
                            + (f"; resuming from {path.name}" if path is not None else ""))
        accum = cfg.engine.grad_accum_steps
        if path is not None:
            t0 = time.perf_counter()
            self.step = ckpt.load(self.engine, path, self.info.rank)
            restore_s = time.perf_counter() - t0
            # Without this rank's count (resumed on more ranks than saved): one document per row.
            self.samples_seen = ckpt.rank_state(path, self.info.rank).get(
                "samples_seen", self.step * cfg.data.micro_batch_size * accum)
            self._print(f"resumed from {path} at step {self.step}")
            # For the goodput ledger (telemetry/consumers/goodput.py): the restore's wall time.
            self.tm.event("checkpoint_restored", {"path": str(path), "step": self.step, "duration_s": restore_s})
        if self.faults.describe():
            self._print(f"debug fault injection on: {self.faults.describe()}", all_ranks=True)
        hf = self.engine.module.config
        n = num_params(self.engine.module)
        if self.is_main:
            ckpt.checkpoint_root(cfg.run_dir).mkdir(parents=True, exist_ok=True)
            (ckpt.checkpoint_root(cfg.run_dir) / "config.yaml").write_text(self.config_yaml)
            if cfg.estimate_memory:
                est = estimate(num_params=n, hidden_size=hf.hidden_size, num_layers=hf.num_hidden_layers,
                               num_heads=hf.num_attention_heads, vocab_size=hf.vocab_size, seq_len=cfg.data.seq_len,
                               micro_batch_size=cfg.data.micro_batch_size, dtype=cfg.model.dtype,
                               zero_stage=cfg.engine.zero_stage if self.engine.name == "deepspeed" else 0,
                               world_size=self.info.world_size, gradient_checkpointing=cfg.model.gradient_checkpointing)
                self._print(f"model: {n / 1e6:.2f}M params, engine {self.engine.name}, "
                            f"{self.info.world_size} rank(s); memory estimate per rank:\n{est.table()}")
                warning = memory_warning(est, device_memory_gb(self.device), device=str(self.device),
                                         zero_stage=cfg.engine.zero_stage if self.engine.name == "deepspeed" else 0,
                                         world_size=self.info.world_size,
                                         gradient_checkpointing=cfg.model.gradient_checkpointing,
                                         micro_batch_size=cfg.data.micro_batch_size)
                if warning:
                    print(f"[trainer rank 0] WARNING: {warning}", file=sys.stderr, flush=True)
                    self.tm.event("memory_warning", {"message": warning, "estimate_gb": est.total_gb})
        cuda = self.device.type == "cuda"
        self.tm.hello({
            "run_name": cfg.run_name, "config": cfg.to_dict(),
            "model": {"hf_config": hf.to_dict(), "num_params": n, "seq_len": cfg.data.seq_len,
                      "gradient_checkpointing": cfg.model.gradient_checkpointing, "dtype": cfg.model.dtype,
                      "causal": True},
            "device_name": torch.cuda.get_device_name(self.device) if cuda else "cpu",
            "num_gpus_per_node": torch.cuda.device_count() if cuda else 0,
        })

    # -- the loop --------------------------------------------------------------------------------
    def train(self) -> int:
        cfg, engine, tm = self.cfg, self.engine, self.tm
        self.start()
        accum = cfg.engine.grad_accum_steps
        loader = make_loader(cfg.data, rank=self.info.rank, world_size=self.info.world_size, grad_accum=accum,
                             start_step=self.step, block_mask=self.block_mask, pin_memory=self.pin)
        batches = iter(loader)
        ds_metrics = DatasetMetrics(self.names, self.device)
        timer = PhaseTimer(self.device)
        # The update runs inside engine.step(), before self.step counts the step being computed.
        hooks = time_update(engine.update_optimizer, timer,
                            lambda: self.faults.phase("optimizer_update", self.step + 1))
        if engine.gathers_in_forward:  # ZeRO-3: the others' wait for a slow rank lands in forward
            hooks = (*hooks, *time_gather_waits(engine.module, timer))
        ddp = ddp_of(engine.model)
        if ddp is not None:  # DDP: in forward (the buffer broadcast) and backward (the all-reduce)
            hooks = (*hooks, *time_ddp_waits(ddp, timer))
        waits_apart = engine.gathers_in_forward or ddp is not None
        nonfinite = HostFlag(self.device, size=2)  # [loss, grad_norm] nonfinite step counts
        num_nonfinite_seen = [0.0, 0.0]
        engine.train()
        t_last = time.perf_counter()
        try:
            while self.step < cfg.steps:
                signum = self.stop.should_stop()
                if signum:
                    return self.emergency_stop(signum)
                step_loss = torch.zeros((), device=self.device)
                num_tokens = num_samples = doc_len_sq = 0
                data_time_s = 0.0
                step = self.step + 1  # the step being computed, as the metrics number it
                for _ in range(accum):
                    t0 = time.perf_counter()
                    self.faults.phase("data", step)
                    host_batch = next(batches)
                    batch = self.prepare(host_batch)
                    data_time_s += time.perf_counter() - t0
                    num_tokens += host_batch["num_tokens"]
                    num_samples += host_batch["num_samples"]
                    doc_len_sq += host_batch["attn_doc_len_sq"]
                    timer.start("forward")
                    self.faults.phase("forward", step)
                    loss, token_loss, correct = engine.forward_loss(batch)
                    loss = self.faults.poison(loss, step)
                    timer.stop("forward")
                    ds_metrics.update(token_loss, correct, batch["labels"] != IGNORE_INDEX, batch["dataset_ids"])
                    step_loss += loss.detach()
                    timer.start("backward")
                    self.faults.phase("backward", step)
                    engine.backward(loss)
                    timer.stop("backward")
                step_loss /= accum
                timer.start("optimizer")
                self.faults.phase("optimizer", step)
                lr = engine.lr  # the LR this update uses (host-side schedule)
                # A step with non-finite gradients is not applied, whatever nonfinite_action says.
                grad_norm = engine.step()
                timer.stop("optimizer")
                timer.end_step()
                nonfinite.add(torch.stack([~torch.isfinite(step_loss), ~torch.isfinite(grad_norm)]).float())
                self.step = step
                self.samples_seen += num_samples
                epoch = self.samples_seen * self.info.world_size / cfg.data.epoch_samples
                now = time.perf_counter()
                step_time_s, t_last = now - t_last, now
                # (t: the step's end, wall clock: what a test times the run's timeline by, apart from telemetry)
                self.loss_log.log(self.step, {"loss": step_loss, "grad_norm": grad_norm, "lr": lr, "epoch": epoch,
                                              "data_loading_time": data_time_s, "step_time": step_time_s,
                                              "t": time.time()})
                # An eval step sends two records (this step's metrics, then eval's): each says so
                # (parts=2), and the daemon writes the step once, both reduced across the ranks.
                logged = self.step % cfg.log_every == 0
                evals = bool(cfg.eval.every_steps) and self.step % cfg.eval.every_steps == 0
                if logged:
                    phases = timer.latest()
                    compute_s = sum(v for k, v in phases.items() if k in ("forward", "backward", "optimizer"))
                    tm.log(self.step, {
                        "train/loss": step_loss, "train/lr": lr, "train/grad_norm": grad_norm,
                        "train/epoch": epoch,
                        "perf/step_time": step_time_s, "perf/tokens": num_tokens, "perf/samples": num_samples,
                        "perf/tokens_per_second": num_tokens / step_time_s,
                        "perf/samples_per_second": num_samples / step_time_s,
                        "perf/attn_doc_len_sq": doc_len_sq,
                        "perf/forward_time": phases.get("forward", 0.0),
                        "perf/backward_time": phases.get("backward", 0.0),
                        "perf/optimizer_time": phases.get("optimizer", 0.0),
                        "perf/optimizer_update_time": phases.get("optimizer_update", 0.0),
                        **({"perf/forward_compute_time": phases.get("forward", 0.0)
                            - phases.get("forward_gather_wait", 0.0) - phases.get("forward_sync_wait", 0.0)}
                           if waits_apart else {}),
                        **({"perf/backward_compute_time": phases["backward_compute"]}
                           if "backward_compute" in phases else {}),
                        "perf/data_loading_time": data_time_s,
                        "perf/data_loading_ratio": data_time_s / step_time_s,
                        "perf/compute_ratio": min(1.0, compute_s / step_time_s),
                        **memory_stats(self.device), **ds_metrics.values("dataset")}, parts=1 + evals)
                    ds_metrics.reset()
                    nonfinite.start_readback()
                counts = nonfinite.poll()  # never waits: None until the copy has landed
                if counts is not None and counts != num_nonfinite_seen:
                    what = [w for w, a, b in zip(("loss", "grad_norm"), counts, num_nonfinite_seen) if a > b]
                    num_nonfinite_seen = counts
                    tm.event("nonfinite", {"step": self.step, "what": ",".join(what), "action": cfg.nonfinite_action})
                    self._print(f"non-finite {' and '.join(what)} seen by step {self.step} ({cfg.nonfinite_action})")
                    if cfg.nonfinite_action == "stop":
                        # Every rank must stop at the same step for the collective checkpoint:
                        # the request is agreed like a signal, at the next step boundary.
                        self.stop.request(STOP_NONFINITE)
                if evals:
                    t0 = time.perf_counter()
                    eval_values = self.evaluate()
                    t_last = time.perf_counter()  # eval time is not the next step's time
                    tm.log(self.step, {**eval_values, "perf/eval_time": t_last - t0}, parts=1 + logged)
                if cfg.checkpoint.every_steps and self.step % cfg.checkpoint.every_steps == 0:
                    self.save("periodic")
                    t_last = time.perf_counter()
            if cfg.checkpoint.save_final and not (cfg.checkpoint.every_steps
                                                  and self.step % cfg.checkpoint.every_steps == 0):
                self.save("final")
            tm.event("train_end", {"step": self.step})
            self._print(f"done: {self.step} steps")
            return 0
        except Exception:
            traceback.print_exc()
            self.emergency_save("exception", collective=False)
            # How training ended, as a W&B run's train_end says it: the goodput ledger books the
            # time since the last step as the failure's, not as a finished run's tail.
            tm.event("train_end", {"step": self.step, "status": "failed", "exit_code": 1})
            return 1
        finally:
            for hook in hooks:
                hook.remove()

    # -- eval, checkpoints, stopping -----------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Loss and token accuracy per dataset on a fixed held-out set, as device tensors."""
        self.engine.train(False)
        metrics = DatasetMetrics(self.names, self.device)
        for k in range(len(self.names)):
            loader = make_loader(self.cfg.data, rank=self.info.rank, world_size=self.info.world_size, grad_accum=1,
                                 start_step=0, block_mask=self.block_mask, pin_memory=self.pin, split="eval",
                                 only=k, num_steps=self.cfg.eval.num_batches, num_workers=0)
            for host_batch in loader:
                batch = self.prepare(host_batch)
                _, token_loss, correct = forward_loss(self.engine.model, batch)
                metrics.update(token_loss, correct, batch["labels"] != IGNORE_INDEX, batch["dataset_ids"])
        self.engine.train(True)
        # With the token counts: the daemon weights each rank's figure by them (one per dataset).
        return metrics.values("eval")

    def prepare(self, host_batch: dict) -> dict:
        """The batch on the device, its mask in the attention's form: one path for train and eval."""
        return prepare_batch(host_batch, self.device, self.cfg.model.attn_implementation, self.compute_dtype)

    def save(self, reason: str, collective: bool = True) -> None:
        t0 = time.perf_counter()
        self.faults.phase("checkpoint", self.step)
        injected_s = time.perf_counter() - t0
        path = ckpt.save(self.engine, run_dir=self.cfg.run_dir, step=self.step, rank=self.info.rank,
                         config_yaml=self.config_yaml, keep_last=self.cfg.checkpoint.keep_last,
                         collective=collective, reason=reason, rank_state={"samples_seen": self.samples_seen})
        duration_s = time.perf_counter() - t0
        self.tm.event("checkpoint_saved", {"path": str(path), "step": self.step, "reason": reason,
                                           "duration_s": duration_s})
        self.save_log.log(self.step, {"duration_s": duration_s, "injected_s": injected_s})

    def emergency_save(self, reason: str, collective: bool) -> None:
        try:
            self.save(reason, collective=collective)
            self.tm.event("emergency_checkpoint", {"step": self.step, "reason": reason})
            self._print(f"emergency checkpoint ({reason}) at step {self.step}", all_ranks=True)
        except Exception as e:  # the original failure matters more than this one
            self._print(f"emergency checkpoint ({reason}) not written: {e}", all_ranks=True)

    def emergency_stop(self, signum: int) -> int:
        if signum == STOP_NONFINITE:  # nonfinite_action=stop
            self.emergency_save("nonfinite", collective=True)
            return 3
        import signal
        self.emergency_save(signal.Signals(signum).name, collective=True)
        return 128 + signum  # the shell's convention for "ended by signal N"

    def close(self) -> None:
        self.stop.restore()
        self.loss_log.close()
        self.save_log.close()
        self.tm.close()
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()

    def _print(self, msg: str, all_ranks: bool = False) -> None:
        if self.is_main or all_ranks:
            print(f"[trainer rank {self.info.rank}] {msg}", flush=True)


def _yaml(cfg: TrainConfig) -> str:
    import yaml
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


if __name__ == "__main__":
    sys.exit(main())
