"""Hang blame with the trainer itself (issue 29): 2 gloo ranks under torchrun, the trainer's own
model (it has buffers, so DDP broadcasts them at the start of every forward), one rank hung by
`debug.hang_*` in data loading, forward, backward or the optimizer, on DDP and on DeepSpeed
ZeRO-2, a real daemon whose forensics dump both ranks' stacks. The event names the hung rank,
never the one waiting for it in a collective (DDP's buffer broadcast, its gradient all-reduce,
ZeRO's reduce and gather), and says that the other one waits.

The stacks the daemon collected go through the classifier again in the test, so a failure shows
which frame was not recognised. The whole matrix (2 engines x 4 phases x 2 ranks, about 35 s a
case on a loaded 2-core box) is too slow for the suite: four cases run end to end, and the
dumps the daemon collected in all sixteen (tests/data/hang_stacks/<engine>-<phase>-hung<r>-rank<k>.txt,
faulthandler's own output from these runs, torch 2.x, DeepSpeed 0.1x) go through the classifier
and the message in test_real_dumps_name_the_hung_rank. test_stacks_classifier runs it on
trimmed dumps of the frames that decide."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from telemetry.daemon.forensics import stacks
from telemetry.daemon.forensics.stage import ForensicsStage

ROOT = Path(__file__).resolve().parent.parent
HANG = {"hang_min_s": 4.0, "hang_factor": 10.0, "hang_stacks_wait_s": 5.0, "hang_py_spy": False,
        "warmup_steps": 2}
HANG_STEP = 6
ENGINES = {"ddp": ("engine.backend=ddp", "engine.zero_stage=0"),
           "zero2": ("engine.backend=deepspeed", "engine.zero_stage=2")}


def _run_hang(make_daemon, tmp_path, engine: str, phase: str, rank: int) -> dict:
    d = make_daemon(world_size=2, config={"diagnosis": HANG, "pollers": {"nvml_enabled": False}})
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "trainer.train", "--config", str(ROOT / "launch" / "configs" / "tiny.yaml"),
            f"run_dir={tmp_path / 'run'}", "steps=1000", "log_every=1", "eval.every_steps=0",
            "checkpoint.every_steps=0", "checkpoint.save_final=false", "data.num_workers=0",
            *ENGINES[engine], f"telemetry_endpoint={d.ingest}",
            f"debug.hang_step={HANG_STEP}", f"debug.hang_rank={rank}", f"debug.hang_phase={phase}"]
    log = tmp_path / "trainer.log"
    with open(log, "w") as out:
        p = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        recs = d.wait_for(lambda rs: any(r.get("name") == "diagnosis/hang" for r in rs)
                          or p.poll() is not None, timeout_s=240)
    finally:
        # The ranks (torchrun starts them in sessions of their own), then the launcher.
        procs = psutil.Process(p.pid).children(recursive=True) if p.poll() is None else []
        for proc in [*procs, psutil.Process(p.pid)] if p.poll() is None else []:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        p.wait(60)
    evs = [r for r in recs if r.get("name") == "diagnosis/hang"]
    assert evs, log.read_text()[-4000:]
    return evs[0]


DUMPS = ROOT / "tests" / "data" / "hang_stacks"
MATRIX = [(e, p, r) for e in ENGINES for p in ("data", "forward", "backward", "optimizer") for r in (0, 1)]


@pytest.mark.parametrize("engine, phase, rank", MATRIX)
def test_real_dumps_name_the_hung_rank(engine, phase, rank):
    per_rank = {}
    for r in (0, 1):
        w = stacks.where(stacks.parse((DUMPS / f"{engine}-{phase}-hung{rank}-rank{r}.txt").read_text()))
        per_rank[r] = {"where": w.phrase, "waiting": w.waiting}
    message, ranks = _stage_message(per_rank)
    assert ranks == [rank] and f"rank {1 - rank} waits in" in message, message


@pytest.mark.slow
@pytest.mark.parametrize("engine, phase, rank", [("ddp", "forward", 0), ("ddp", "forward", 1),
                                                 ("zero2", "backward", 0), ("ddp", "optimizer", 1)])
def test_a_hung_rank_of_the_trainer_is_the_one_named(make_daemon, tmp_path, engine, phase, rank):
    ev = _run_hang(make_daemon, tmp_path, engine, phase, rank)
    data = ev["data"]
    bundle = Path(data["bundle"])
    seen = {}
    for r in (0, 1):
        dump = json.loads((bundle / f"rank{r}.json").read_text())["python_stacks"]
        w = stacks.where(stacks.parse(dump))
        seen[r] = (w.waiting, w.phrase) if w else None
    other = 1 - rank
    assert seen[rank] and not seen[rank][0], seen          # in faults.py, its own code
    assert seen[other] and seen[other][0], seen            # in a collective, waiting for it
    assert data["ranks"] == [rank] and ev["rank"] == rank, (data["message"], seen)
    assert f"rank {rank} is in phase at faults.py" in data["message"], data["message"]
    assert f"rank {other} waits in" in data["message"], data["message"]


# What each rank's main thread showed in the runs above (innermost first, trimmed to the frames
# that decide): (frames, waiting?).
def _dump(frames: list[tuple[str, str]]) -> str:
    lines = ["Thread 0x00007f0000000001 (most recent call first):",
             '  File "/usr/lib/python3.11/threading.py", line 324 in wait',
             '  File "/usr/lib/python3.11/threading.py", line 995 in _bootstrap', "",
             "Current thread 0x00007f0000000002 (most recent call first):"]
    lines += [f'  File "{f}", line 10 in {fn}' for f, fn in frames]
    lines += ['  File "/work/main/trainer/train.py", line 340 in <module>']
    return "\n".join(lines) + "\n"


SP = "/venv/lib/python3.11/site-packages/"
TRAIN = [("/work/main/trainer/train.py", "train"), ("/work/main/trainer/train.py", "main")]
CASES = {
    "ddp buffer broadcast": ([(SP + "torch/nn/parallel/distributed.py", "_distributed_broadcast_coalesced"),
                              (SP + "torch/nn/parallel/distributed.py", "_sync_buffers"),
                              (SP + "torch/nn/parallel/distributed.py", "_pre_forward"),
                              (SP + "torch/nn/parallel/distributed.py", "forward"),
                              (SP + "torch/nn/modules/module.py", "_call_impl"),
                              ("/work/main/trainer/model.py", "forward_loss"),
                              ("/work/main/trainer/engine.py", "forward_loss"), *TRAIN], True),
    "ddp params and buffers at start": ([(SP + "torch/distributed/utils.py", "_sync_params_and_buffers"),
                                         (SP + "torch/nn/parallel/distributed.py", "__init__"), *TRAIN], True),
    "ddp gradient all-reduce": ([(SP + "torch/autograd/graph.py", "_engine_run_backward"),
                                 (SP + "torch/autograd/__init__.py", "backward"),
                                 (SP + "torch/_tensor.py", "backward"),
                                 ("/work/main/trainer/engine.py", "backward"), *TRAIN], True),
    "c10d all_reduce": ([(SP + "torch/distributed/distributed_c10d.py", "all_reduce"),
                         (SP + "torch/distributed/c10d_logger.py", "wrapper"),
                         (SP + "deepspeed/comm/torch.py", "all_reduce"),
                         (SP + "deepspeed/comm/comm.py", "all_reduce"),
                         (SP + "deepspeed/runtime/zero/stage_1_and_2.py", "average_tensor"), *TRAIN], True),
    "zero work.wait": ([(SP + "deepspeed/runtime/zero/stage_1_and_2.py", "allreduce_and_copy_with_multiple_ranks"),
                        (SP + "deepspeed/runtime/zero/stage_1_and_2.py", "reduce_ipg_grads"), *TRAIN], True),
    "zero all-gather after step": ([(SP + "deepspeed/runtime/utils.py", "all_gather_into_tensor_dp_groups"),
                                    (SP + "deepspeed/runtime/utils.py", "all_gather_dp_groups"),
                                    (SP + "deepspeed/runtime/zero/stage_1_and_2.py", "step"), *TRAIN], True),
    "hung in faults under the zero step": ([("/work/main/trainer/faults.py", "phase"),
                                            ("/work/main/trainer/metrics.py", "begins"),
                                            (SP + "torch/optim/optimizer.py", "wrapper"),
                                            (SP + "deepspeed/runtime/zero/stage_1_and_2.py", "step"),
                                            (SP + "deepspeed/runtime/engine.py", "step"), *TRAIN], False),
    "loading data": ([("/work/main/trainer/data.py", "__next__"),
                      (SP + "torch/utils/data/dataloader.py", "__next__"), *TRAIN], False),
    "a user's sleep in forward": ([("/work/main/trainer/faults.py", "phase"), *TRAIN], False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_stacks_classifier(case):
    frames, waiting = CASES[case]
    w = stacks.where(stacks.parse(_dump(frames)))
    assert w is not None and w.waiting is waiting, (case, w)


def _stage_message(per_rank: dict) -> tuple[str, list[int]]:
    stage = ForensicsStage.__new__(ForensicsStage)   # only the message: no sockets, no processes
    stage.last_step, stage.step_times_s = 5, [0.2]
    return ForensicsStage._message(stage, "hang", per_rank, 12.0, None)


def test_when_the_stacks_do_not_tell_no_rank_is_named():
    # Both ranks in their own code at different places: nothing says which holds the other up.
    per_rank = {0: {"where": "is in load at data.py:10", "waiting": False},
                1: {"where": "is in forward at model.py:20", "waiting": False}}
    message, ranks = _stage_message(per_rank)
    assert ranks == [] and "cannot tell" in message, message
    per_rank = {0: {"where": "wait in a collective at x.py:1", "waiting": True},
                1: {"where": "wait in a collective at y.py:2", "waiting": True}}
    message, ranks = _stage_message(per_rank)
    assert ranks == [] and "cannot tell" in message, message
    per_rank = {0: {"where": "is in phase at faults.py:3", "waiting": False},
                1: {"where": "wait in a collective at y.py:2", "waiting": True}}
    message, ranks = _stage_message(per_rank)
    assert ranks == [0] and "rank 1 waits in a collective" in message, message
