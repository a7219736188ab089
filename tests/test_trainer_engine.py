"""Engine details: DDP's no_sync() never outlives a failed forward; the skipping AdamW."""
import ast
import copy
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.optim import SkippingAdamW

ROOT = Path(__file__).resolve().parent.parent

# A real DDP over a one-rank gloo group (DDP wraps only when the engine is told of more than one
# rank, so the DistInfo says two; the group itself has one, which DDP is happy with).
NO_SYNC_SCRIPT = r'''
import os, torch, torch.distributed as dist
from trainer.config import load_config
from trainer.engine import DistInfo, TorchEngine
from trainer.model import build_model
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
cfg = load_config(None, ["engine.backend=ddp", "engine.zero_stage=0", "engine.grad_accum_steps=2"])
engine = TorchEngine(cfg, build_model(cfg.model), DistInfo(0, 0, 2, torch.device("cpu")))
assert engine.model.require_backward_grad_sync
bad = {"input_ids": torch.full((1, 8), 10 ** 6), "position_ids": torch.arange(8)[None], "labels": torch.zeros(1, 8, dtype=torch.long)}
try:
    engine.forward_loss(bad)  # the first micro-batch of two: inside no_sync(), then an IndexError
except (IndexError, RuntimeError) as e:
    print("forward raised:", type(e).__name__)
print("SYNC_AFTER_FAILED_FORWARD", engine.model.require_backward_grad_sync)
dist.destroy_process_group()
'''


def test_no_sync_is_left_when_the_forward_raises():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.run([sys.executable, "-c", NO_SYNC_SCRIPT], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PORT": str(port), "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "forward raised" in p.stdout
    # Left entered, the next boundary micro-batch would not all-reduce: ranks would drift apart.
    assert "SYNC_AFTER_FAILED_FORWARD True" in p.stdout, p.stdout


def _pair(seed=0):
    torch.manual_seed(seed)
    a = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return a, copy.deepcopy(a)


def test_skipping_adamw_matches_torch_adamw_when_applied():
    ref, ours = _pair()
    o_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    o_ours = SkippingAdamW(ours.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(20):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(step))
        for model, opt in ((ref, o_ref), (ours, o_ours)):
            model(x).square().mean().backward()
            if opt is o_ours:
                opt.apply_if = torch.tensor(True)
            opt.step()
            opt.zero_grad()
    for p, q in zip(ref.parameters(), ours.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_skipping_adamw_leaves_everything_untouched_when_not_applied():
    model, _ = _pair()
    opt = SkippingAdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for first in (True, False):  # a dropped first step (no state yet) and a dropped later step
        if not first:
            model(torch.randn(3, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        weights = copy.deepcopy(model.state_dict())
        state = copy.deepcopy(opt.state_dict()["state"])
        (model(torch.randn(3, 8)).sum() * float("nan")).backward()
        opt.apply_if = torch.tensor(False)
        opt.step()
        opt.zero_grad()
        for k, v in model.state_dict().items():
            assert torch.equal(v, weights[k]), k
        for i, s in opt.state_dict()["state"].items():
            if i in state:
                assert all(torch.equal(s[k], state[i][k]) for k in ("step", "exp_avg", "exp_avg_sq"))
            else:  # created by the dropped first step: nothing counted, nothing accumulated
                assert s["step"] == 0 and not s["exp_avg"].any() and not s["exp_avg_sq"].any()
        # A later good step trains again.
        model(torch.randn(3, 8)).sum().backward()
        opt.apply_if = torch.tensor(True)
        opt.step()
        opt.zero_grad()
        assert any(not torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_skipping_adamw_step_reads_nothing_back_to_the_host():
    """Every value a GPU would have to copy to the host goes through aten._local_scalar_dense
    (.item(), bool(), a 0-dim tensor passed where an op takes a Python number): none in step()."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class HostReads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                self.calls.append(func)
            return func(*args, **(kwargs or {}))

    model, _ = _pair()
    opt = SkippingAdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for flag in (True, False, True):
        model(torch.randn(3, 8)).sum().backward()
        opt.apply_if = torch.tensor(flag)
        with HostReads() as reads:
            opt.step()
        opt.zero_grad()
        assert reads.calls == [], flag


DEEPSPEED_CPU_SCRIPT = r'''
import os, torch, torch.distributed as dist
from trainer.config import load_config
from trainer.engine import DeepSpeedEngine, DistInfo
from trainer.model import build_model
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
dist.init_process_group("gloo", rank=0, world_size=1)
cfg = load_config(None, ["engine.backend=deepspeed", "engine.zero_stage=2"])
engine = DeepSpeedEngine(cfg, build_model(cfg.model), DistInfo(0, 0, 1, torch.device("cpu")))
import deepspeed.comm.comm as ds_comm
print("SHM_OP", ds_comm.cdb.shm_comm_op)
m = engine.model
print("SYNCING", {"comms_logger": ds_comm.comms_logger.enabled, "throughput_timer": m.tput_timer.config.enabled,
                  "throughput_sync": m.tput_timer.config.synchronized, "wall_clock": m.wall_clock_breakdown(),
                  "flops_profiler": m.flops_profiler_enabled(), "monitor": m.monitor.enabled})
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def deepspeed_on_cpu(tmp_path_factory):
    """One DeepSpeed ZeRO-2 engine built by the trainer on a CPU, in its own process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ext = tmp_path_factory.mktemp("ds") / "torch_extensions"
    p = subprocess.run([sys.executable, "-c", DEEPSPEED_CPU_SCRIPT], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PORT": str(port), "OMP_NUM_THREADS": "1",
                                         "TORCH_EXTENSIONS_DIR": str(ext)})
    assert p.returncode == 0, p.stderr[-3000:]
    return p, ext


def test_deepspeed_on_a_cpu_builds_no_inference_only_op(deepspeed_on_cpu):
    # DeepSpeed's CPU communication would compile its shared-memory all-reduce (about a minute of
    # g++ on a fresh machine, the first run.sh's silent wait) although training never calls it.
    p, ext = deepspeed_on_cpu
    assert "SHM_OP None" in p.stdout, p.stdout[-2000:]
    assert not ext.exists() or not any(ext.rglob("*.so")), sorted(map(str, ext.rglob("*")))


def test_deepspeed_runs_none_of_its_own_syncing_monitors(deepspeed_on_cpu):
    """Each of DeepSpeed's timers and loggers that synchronizes the device is off in the engine as
    DeepSpeed parsed our config (not only in the dict we wrote): its comms logger, once on,
    synchronizes after every collective and re-reads every event it ever timed (seen on an H200:
    ~150 syncs a step by step 13, growing), and it is on whenever the key is present at all,
    even as {"enabled": false}."""
    p, _ = deepspeed_on_cpu
    line = next(l for l in p.stdout.splitlines() if l.startswith("SYNCING "))
    syncing = ast.literal_eval(line.removeprefix("SYNCING "))
    assert not any(syncing.values()), syncing
