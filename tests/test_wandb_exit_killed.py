"""A run whose launcher is gone records how its script died: `telemetry run` SIGKILLed (an OOM
killer, `kill -9`, a node's scheduler) takes its script with it (SIGKILL), and no drain request
says the script's exit code. The daemon, watching the launcher, drains by itself; it saw the
rank gone without its bye (`diagnosis/rank_exited`, killed by SIGKILL), and the W&B run it owns
ends with 137, as a shell reports the script. It ended with 0, a success, before."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon_util import kernel_keeps_exit_status
from wandb_offline import read_records, wait_finished

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import time
from telemetry import TelemetryClient
tm = TelemetryClient()
for step in range(3):
    tm.log(step, {"train/loss": 1.0 / (step + 1)})
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not kernel_keeps_exit_status(), reason="this kernel keeps no exit status for a process's "
                    "watcher (Linux < 6.15): the daemon cannot tell how its launcher ended")
def test_a_run_whose_launcher_was_sigkilled_ends_in_w_and_b_with_137(tmp_path):
    (tmp_path / "s.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", WANDB_SILENT="true",
               TELEMETRY_RUNTIME_DIR=str(tmp_path / "rt"))
    run_dir = tmp_path / "r"
    p = subprocess.Popen([sys.executable, "-m", "telemetry", "run", "--quiet", "--wandb", "offline",
                          "--run-dir", str(run_dir), "--", "s.py"], cwd=tmp_path, env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        said = []
        while not said or said[-1].strip() != "ready":     # telemetry run's own line comes first
            said.append(p.stdout.readline())
            assert said[-1], "".join(said)[-3000:]            # its output ended: it never said ready
        p.kill()
        p.wait(60)
        deadline = time.monotonic() + 180         # a hang detector: the daemon drains by itself
        while not (run_dir / "drain.json").exists():
            assert time.monotonic() < deadline, "the daemon did not drain after its launcher died"
            time.sleep(0.2)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    (path,) = [f for f in glob.glob(f"{run_dir}/**/run-*.wandb", recursive=True) if "latest-run" not in f]
    path = wait_finished(path, timeout_s=120)
    codes = [r.exit.exit_code for r in read_records(path) if r.WhichOneof("record_type") == "exit"]
    assert codes == [128 + signal.SIGKILL]


def test_the_exit_code_a_w_and_b_run_ends_with_when_no_launcher_says_it(tmp_path):
    """Where the kernel keeps no status for the daemon (or the launcher is not the one watched),
    a rank the daemon saw die without its bye (`diagnosis/rank_exited`) gives the code: the
    launcher's own word (`script_exit`) and a rank's finish still come first."""
    from telemetry.daemon.sinks.wandb_sink import RANK_EXITED_EVENT, SCRIPT_EXIT_EVENT, WandbSink

    def code(*events):
        sink = WandbSink("disabled", tmp_path, "r")
        for name, rank, data in events:
            sink._note_exit(name, {"name": name, "rank": rank, "data": data})
        return sink.exit_code()

    def died(rank, exit_code):
        return (RANK_EXITED_EVENT, rank, {"exited_rank": rank, "exit_code": exit_code, "how": "..."})

    assert code() == 0
    assert code(died(0, -signal.SIGKILL)) == 137
    # The first to go, as the daemon says them: rank 1 crashed, its launcher then ended rank 0.
    assert code(died(1, -signal.SIGSEGV), died(0, -signal.SIGTERM)) == 128 + signal.SIGSEGV
    assert code(died(0, 3), died(1, -signal.SIGTERM)) == 3
    assert code(died(0, None)) == 0                                    # unknown: not said to be a failure
    assert code(died(0, 0)) == 0
    assert code(died(0, -9), (SCRIPT_EXIT_EVENT, None, {"exit_code": 0})) == 0     # the launcher's word
    assert code(died(0, -9), ("train_end", 0, {"exit_code": 2})) == 2              # a rank's own finish
