"""The GPU benchmark (issue 10): step overhead, zero syncs, NVML against nvidia-smi, MFU.

    bash benchmarks/gpu/run.sh                     # on a GPU machine: everything, ~8 min on an H100
    bash benchmarks/gpu/run.sh --cpu-smoke         # the same code paths, reduced, on CPU (~1 min)
    python -m benchmarks.gpu.bench [--cpu-smoke] [--parts overhead,nosync,mfu,nvml] [--out DIR]

Parts, in this order (each writes into results.json as it finishes, so a run cut short keeps
what it measured):
  overhead  the real trainer (trainer.train.main) on the config, one process per run, variants
            interleaved per round (off, ours, seed, off, ours, seed, ...), the same seed and data:
              off   telemetry disabled;
              ours  our TelemetryClient logging every step to a daemon started for that run
                    (NVML and host pollers at 1 s, JSONL, W&B offline);
              seed  the seed's in-process monitor (benchmarks/gpu/seed_monitor.py).
            Per variant: median and p99 of the trainer's per-step time after warm-up, the mean
            step time over a device-synchronized window, and ours/off, seed/off with a
            bootstrap 95 % CI and the per-round ratios.
  nosync    the trainer with our client to a live daemon, syncs made errors
            (torch.cuda.set_sync_debug_mode("error") + a host-read tracer, syncguard.py) from
            a warm-up step to the end, log_every=2 so log steps and other steps both run;
            on GPU once per engine (DeepSpeed when importable, and plain torch).
  mfu       the daemon's analytic MFU of the first "ours" run, FlopCounterMode's count of one
            step, the measured matmul rate (mfu_compare.py).
  nvml      NvmlPoller.poll_once() beside nvidia-smi at the same moment, GPU loaded (nvml_compare.py).

Writes <out>/results.json, <out>/results.md (the tables for RESULTS.md, also printed), and
<out>/logs/ (each process's output, the daemons' metrics.jsonl).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from benchmarks.gpu import stats

ROOT = Path(__file__).resolve().parents[2]

PARTS = ("overhead", "nosync", "mfu", "nvml")
VARIANTS = ("off", "ours", "seed")
DAEMON_READY_TIMEOUT_S = 120
DAEMON_STOP_TIMEOUT_S = 60
SYNC_ERROR_TEXT = "called a synchronizing CUDA operation"  # torch's message in sync debug "error" mode


@dataclass(kw_only=True)
class Preset:
    """How big each part runs: the GPU defaults, or the reduced CPU smoke form."""
    config: str
    overrides: list[str]
    warmup: int                 # steps dropped before measuring
    measure: int                # steps measured per run
    rounds: int                 # runs per variant, interleaved
    sync_from: int              # the sync check starts after this step ...
    sync_steps: int             # ... and runs this many more steps
    matmul_n: int
    nvml_samples: int
    seed_profile_every: int     # the seed monitor's profiler interval (the seed's: 50)
    deadline_s: float           # runs that would start after this many seconds are skipped
    child_timeout_s: float
    env: dict = field(default_factory=dict)


GPU = Preset(
    config="launch/configs/qwen2-0.5b-gpu.yaml",
    # One micro-batch per optimizer step (8 x 2048 tokens): ~0.1-0.3 s per step on an H100,
    # so three variants x two rounds fit the device's 10-minute command.
    overrides=["engine.grad_accum_steps=1"],
    warmup=15, measure=55, rounds=2, sync_from=5, sync_steps=8, matmul_n=8192, nvml_samples=5,
    seed_profile_every=50, deadline_s=480, child_timeout_s=420)
CPU_SMOKE = Preset(
    config="launch/configs/tiny.yaml",
    overrides=["data.num_workers=1"],
    warmup=3, measure=6, rounds=1, sync_from=3, sync_steps=4, matmul_n=512, nvml_samples=1,
    seed_profile_every=4, deadline_s=600, child_timeout_s=300, env={"OMP_NUM_THREADS": "1"})

# The same for every run: no checkpoints, no eval, nothing resumed, every step logged.
COMMON = ["checkpoint.every_steps=0", "checkpoint.save_final=false", "checkpoint.resume=none",
          "eval.every_steps=0", "estimate_memory=false", "log_every=1"]


def has_cuda() -> bool:
    """CUDA present, asked in a child so this process never holds a CUDA context during runs."""
    p = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                       capture_output=True, text=True, timeout=120)
    return p.stdout.strip().endswith("True")


def engines(cuda: bool) -> list[str]:
    """DeepSpeed first where it imports (the seed's engine), then plain torch."""
    found = importlib.util.find_spec("deepspeed") is not None
    return (["deepspeed", "ddp"] if found else ["ddp"]) if cuda else ["ddp"]


def engine_overrides(engine: str) -> list[str]:
    return ["engine.backend=deepspeed", "engine.zero_stage=2"] if engine == "deepspeed" else \
        ["engine.backend=ddp", "engine.zero_stage=0"]


class Bench:
    def __init__(self, preset: Preset, out: Path, cuda: bool, parts: list[str], inject_sync: bool = False,
                 sync_engines: list[str] | None = None, sync_mode: str = "warn",
                 variants: tuple[str, ...] = VARIANTS) -> None:
        self.p, self.out, self.cuda, self.parts = preset, out, cuda, parts
        self.inject_sync = inject_sync
        self.sync_mode = sync_mode
        self.variants = variants
        self.sync_engines = sync_engines or engines(cuda)
        self.t_start = time.monotonic()
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="gpub-"))  # short: ipc paths are length-limited
        self.engine = engines(cuda)[0]
        self.results: dict = {"meta": self._meta(), "parts": {}}

    # -- plumbing --------------------------------------------------------------------------------
    def _meta(self) -> dict:
        import torch
        return {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
                "cuda": self.cuda, "cpu_count": os.cpu_count(), "engine": self.engine,
                "preset": asdict(self.p), "parts": self.parts, "command": os.environ.get("GPU_BENCH_COMMAND")
                or " ".join(["python -m benchmarks.gpu.bench", *sys.argv[1:]])}

    def elapsed_s(self) -> float:
        return time.monotonic() - self.t_start

    def over_deadline(self, next_run_s: float = 0.0) -> bool:
        """Whether something expected to take next_run_s would end past the deadline."""
        return self.elapsed_s() + next_run_s > self.p.deadline_s

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=2, default=str))

    def env(self, run_dir: Path) -> dict:
        env = {**os.environ, **self.p.env, "WANDB_MODE": "offline", "WANDB_DIR": str(run_dir),
               "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true", "PYTHONPATH": _pythonpath()}
        env.pop("TELEMETRY_DISABLED", None)
        return env

    def start_daemon(self, name: str, wandb_mode: str) -> tuple[subprocess.Popen, str, Path]:
        d = self.tmp / name
        d.mkdir(parents=True)
        log_dir = d / "telemetry"
        cfg = d / "daemon.yaml"
        # The pollers as the issue asks: NVML (and host) every second.
        cfg.write_text("pollers:\n  nvml_interval_s: 1.0\n  host_interval_s: 1.0\n"
                       "wandb:\n  project: gpu-bench\n")
        ingest = f"ipc://{d}/in"
        cmd = [sys.executable, "-m", "telemetry", "daemon", "--config", str(cfg), "--ingest", ingest,
               "--pub", f"ipc://{d}/pub", "--control", f"ipc://{d}/ctl", "--log-dir", str(log_dir),
               "--run-name", name, "--wandb", wandb_mode]
        out_path = self.logs / f"daemon-{name}.out"
        out = open(out_path, "w")  # a file, not a pipe: a full pipe would stall the daemon
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=self.env(d))
        deadline = time.monotonic() + DAEMON_READY_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if "telemetry daemon ready" in out_path.read_text():
                return proc, ingest, log_dir
            time.sleep(0.1)
        proc.kill()
        raise RuntimeError(f"daemon {name} not ready:\n{out_path.read_text()[-2000:]}")

    def stop_daemon(self, proc: subprocess.Popen, name: str, log_dir: Path) -> None:
        proc.send_signal(signal.SIGTERM)  # stop intake, drain, flush
        try:
            proc.wait(timeout=DAEMON_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if (log_dir / "metrics.jsonl").is_file():
            shutil.copy(log_dir / "metrics.jsonl", self.logs / f"metrics-{name}.jsonl")

    def run_child(self, name: str, variant: str, steps: int, overrides: list[str], endpoint: str,
                  sync_from: int | None = None) -> dict:
        run_dir = self.tmp / f"run-{name}"
        out_json = run_dir / "result.json"
        run_dir.mkdir(parents=True)
        cmd = [sys.executable, "-m", "benchmarks.gpu.child", "--variant", variant, "--out", str(out_json),
               "--run-dir", str(run_dir), "--config", str(ROOT / self.p.config), "--warmup", str(self.p.warmup),
               "--seed-profile-every", str(self.p.seed_profile_every)]
        if sync_from is not None:
            cmd += ["--sync-check-from", str(sync_from), "--sync-mode", self.sync_mode] + \
                (["--inject-sync"] if self.inject_sync else [])
        cmd += ["--", *self.p.overrides, *COMMON, *overrides, f"steps={steps}", f"telemetry_endpoint={endpoint}",
                f"run_name={name}"]
        log_path = self.logs / f"{name}.log"
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            try:
                p = subprocess.run(cmd, cwd=ROOT, env=self.env(run_dir), stdout=log, stderr=subprocess.STDOUT,
                                   timeout=self.p.child_timeout_s)
                rc = p.returncode
            except subprocess.TimeoutExpired:
                rc = 124
        res = json.loads(out_json.read_text()) if out_json.is_file() else {"rc": rc, "steps": [], "step_times_s": []}
        res["rc"] = rc if rc else res.get("rc", 0)
        res["process_s"] = time.monotonic() - t0
        text = log_path.read_text(errors="replace")
        res["log"] = str(log_path.relative_to(self.out))
        res["sync_errors"] = _sync_error_lines(text)
        if rc:
            res["log_tail"] = text[-3000:]
        print(f"[gpu-bench {self.elapsed_s():6.0f}s] {name}: rc={rc} {res['process_s']:.0f}s", file=sys.stderr, flush=True)
        return res

    # -- parts -----------------------------------------------------------------------------------
    def overhead(self) -> dict:
        p = self.p
        steps = p.warmup + p.measure
        runs: list[dict] = []
        skipped = []
        longest_s = 0.0
        for r in range(p.rounds):
            for v in self.variants:
                name = f"{v}-r{r + 1}"
                if self.over_deadline(longest_s):
                    skipped.append(name)
                    continue
                daemon = None
                endpoint = ""
                if v == "ours":
                    daemon, endpoint, log_dir = self.start_daemon(name, "offline")
                try:
                    res = self.run_child(name, v, steps, engine_overrides(self.engine), endpoint)
                finally:
                    if daemon is not None:
                        self.stop_daemon(daemon, name, log_dir)
                res.update(round=r + 1, name=name)
                if v == "ours":
                    res["metrics_jsonl"] = f"logs/metrics-{name}.jsonl"
                runs.append(res)
                longest_s = max(longest_s, res["process_s"])
                # Saved after every run: a command cut off by its time limit keeps what it measured.
                self.results["parts"]["overhead"] = {**summarize_overhead(runs, p.warmup, skipped, self.engine),
                                                     "partial": True}
                self.save()
        return summarize_overhead(runs, p.warmup, skipped, self.engine)

    def nosync(self) -> dict:
        p = self.p
        checks = []
        for eng in self.sync_engines:
            name = f"nosync-{eng}"
            if self.over_deadline():
                checks.append({"engine": eng, "skipped": "time budget"})
                continue
            daemon, endpoint, log_dir = self.start_daemon(name, "disabled")
            try:
                # log_every=2: both log steps and steps without a log run inside the window.
                res = self.run_child(name, "ours", p.sync_from + p.sync_steps,
                                     [*engine_overrides(eng), "log_every=2"], endpoint, sync_from=p.sync_from)
            finally:
                self.stop_daemon(daemon, name, log_dir)
            sc = res.get("sync_check") or {}
            first, last = sc.get("first_step"), sc.get("last_step")
            covered = list(range(first, last + 1)) if first and last else []
            num_log = sum(1 for s in covered if s % 2 == 0)
            # Passing needs the window to have covered log steps and other steps, and no sync.
            ok = (res["rc"] == 0 and sc.get("num_reads", 1) == 0 and not res["sync_errors"]
                  and 0 < num_log < len(covered))
            checks.append({
                "engine": eng, "ok": ok, "rc": res["rc"], "device": res.get("device"),
                "steps_checked": f"{first}..{last}" if covered else "none",
                "num_steps_checked": len(covered), "num_log_steps_checked": num_log,
                "mode": sc.get("mode"), "num_reads": sc.get("num_reads"), "reads": sc.get("reads"),
                "num_allowed_reads": sc.get("num_allowed_reads"), "num_library_reads": sc.get("num_library_reads"),
                "library_reads": sc.get("library_reads"), "sync_errors": res["sync_errors"],
                "num_syncs_other_threads": sc.get("num_syncs_other_threads"),
                "client_stats": res.get("client_stats"), "log": res["log"]})
        return {"checks": checks, "ok": all(c.get("ok") for c in checks if "skipped" not in c)}

    def mfu(self) -> dict:
        from benchmarks.gpu import mfu_compare
        from trainer.config import load_config

        cfg = load_config(ROOT / self.p.config, [*self.p.overrides, *COMMON])
        ours = [r for r in self.results["parts"].get("overhead", {}).get("runs", []) if r["variant"] == "ours"]
        metrics = self.out / ours[0]["metrics_jsonl"] if ours else None
        res = mfu_compare.compare(cfg, metrics, self.p.matmul_n, skip_steps=self.p.warmup)
        if metrics is None:
            res["note"] = "no 'ours' run in this invocation: run the overhead part too for the analytic MFU"
        return res

    def nvml(self) -> dict:
        from benchmarks.gpu import nvml_compare
        return nvml_compare.compare(self.p.nvml_samples, 1.0, load=self.cuda)

    def run(self) -> dict:
        for part in self.parts:
            if self.over_deadline():
                self.results["parts"][part] = {"skipped": "time budget"}
                continue
            t0 = time.monotonic()
            try:
                self.results["parts"][part] = getattr(self, part)()
            except Exception as e:  # one part failing must not lose the others' figures
                import traceback
                self.results["parts"][part] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            self.results["parts"][part]["part_s"] = time.monotonic() - t0
            self.save()
        self.results["meta"]["total_s"] = self.elapsed_s()
        self.save()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return self.results


def _pythonpath() -> str:
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([*parts, str(ROOT)] if str(ROOT) not in parts else parts)


def _sync_error_lines(text: str) -> list[str]:
    """The sync-debug errors in a child's log, each with the project frame that was running."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if SYNC_ERROR_TEXT in line:
            frames = [l.strip() for l in lines[max(0, i - 40):i] if l.strip().startswith("File ")]
            out.append(" | ".join(frames[-4:] + [line.strip()]))
    return out[:10]


def summarize_overhead(runs: list[dict], warmup: int, skipped: list[str], engine: str) -> dict:
    by: dict[str, list[float]] = {v: [] for v in VARIANTS}
    window: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in runs:
        if r["rc"]:
            continue
        by[r["variant"]] += [t for s, t in zip(r["steps"], r["step_times_s"]) if s > warmup]
        if r.get("window_s") and r.get("window_steps"):
            r["window_mean_s"] = r["window_s"] / r["window_steps"]
            window[r["variant"]].append(r["window_mean_s"])
    variants = {}
    base = by["off"]
    for v in VARIANTS:
        xs = by[v]
        row = {"num_runs": sum(1 for r in runs if r["variant"] == v and not r["rc"]), "num_steps": len(xs),
               "median_s": stats.median(xs), "p99_s": stats.pct(xs, 0.99),
               "mean_s": statistics.fmean(xs) if xs else float("nan"),
               "window_mean_s": statistics.fmean(window[v]) if window[v] else float("nan")}
        if v != "off" and xs and base:
            row["median_vs_off"] = row["median_s"] / stats.median(base)
            row["median_vs_off_ci95"] = stats.ratio_ci(base, xs)
            if window[v] and window["off"]:
                row["window_vs_off"] = row["window_mean_s"] / statistics.fmean(window["off"])
            row["per_round_window_vs_off"] = _per_round(runs, v)
        variants[v] = row
    failed = [{"name": r["name"], "rc": r["rc"], "log_tail": r.get("log_tail", "")[-1500:]} for r in runs if r["rc"]]
    slim = [{k: r.get(k) for k in ("name", "variant", "round", "rc", "device", "window_s", "window_steps",
                                    "window_mean_s", "process_s", "client_stats", "max_memory_allocated_gb",
                                    "metrics_jsonl", "log")} | {"step_times_s": r["step_times_s"], "steps": r["steps"]}
            for r in runs]
    return {"engine": engine, "warmup": warmup, "variants": variants, "runs": slim, "failed": failed,
            "skipped_runs": skipped, "device": next((r.get("device") for r in runs if r.get("device")), None)}


def _per_round(runs: list[dict], v: str) -> list[float]:
    out = []
    for r in runs:
        if r["variant"] != v or not r.get("window_mean_s"):
            continue
        off = [o for o in runs if o["variant"] == "off" and o["round"] == r["round"] and o.get("window_mean_s")]
        if off:
            out.append(r["window_mean_s"] / off[0]["window_mean_s"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="the reduced form on CPU (tiny model, few steps)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "out" / "gpu"))
    ap.add_argument("--config", help="trainer YAML (default: the preset's)")
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--measure", type=int, help="steps measured per run")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--deadline-s", type=float, help="skip runs that would start later than this")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra trainer override for every run (repeatable), e.g. model.dtype=bf16")
    ap.add_argument("--allow-cpu", action="store_true", help="run the GPU preset even without CUDA")
    ap.add_argument("--sync-engines", help="engines for the nosync part (default: deepspeed where it imports "
                    "and CUDA is there, and ddp)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"overhead part: the variants to run, interleaved, from {','.join(VARIANTS)} (off is needed)")
    ap.add_argument("--sync-mode", choices=("error", "warn"), default="warn",
                    help="nosync part on CUDA: warn (default: every sync seen and attributed; a library's own, "
                         "such as DeepSpeed's overflow read, listed; ours fail) or error (the first sync ends the run)")
    ap.add_argument("--inject-sync", action="store_true",
                    help="self-test of the nosync part: add a host read to the checked steps (must FAIL)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"unknown part(s) {bad}; choose from {PARTS}")
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    if "off" not in variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: a comma-separated subset of {','.join(VARIANTS)} that holds off")
    cuda = has_cuda()
    if not cuda and not args.cpu_smoke and not args.allow_cpu:
        print("gpu-bench: no CUDA device here; run with --cpu-smoke for the reduced CPU form", file=sys.stderr)
        return 2
    preset = replace(CPU_SMOKE if args.cpu_smoke else GPU)  # a copy: the presets stay as defined
    for name in ("config", "warmup", "measure", "rounds", "deadline_s"):
        v = getattr(args, name)
        if v is not None:
            setattr(preset, name, v)
    preset.overrides = [*preset.overrides, *args.set]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(preset, out, cuda, parts, inject_sync=args.inject_sync,
                  sync_engines=[e for e in (args.sync_engines or "").split(",") if e] or None,
                  sync_mode=args.sync_mode, variants=variants)
    results = bench.run()
    from benchmarks.gpu.report import markdown

    md = markdown(results, smoke=args.cpu_smoke)
    (out / "results.md").write_text(md)
    print(md)
    failed = [p for p, r in results["parts"].items() if "error" in r]
    nosync = results["parts"].get("nosync", {})
    return 1 if failed or nosync.get("ok") is False else 0


if __name__ == "__main__":
    sys.exit(main())
