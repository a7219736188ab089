"""The trainer's DataLoader workers never hold the process at exit.

Workers ignore SIGTERM (so a scheduler's signal to the process group leaves them to the
trainer's emergency checkpoint), and multiprocessing's exit hook ends daemonic children with
SIGTERM, then joins them: a loader iterator still alive when the interpreter exits kept a
trainer that had printed "done: 200 steps" waiting for its worker forever (seen under load in
test_e2e_run.py::test_killing_the_daemon_does_not_stop_the_trainer)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import sys
    from trainer.data import {cls} as Loader, _worker_init
    loader = Loader(list(range(1000)), batch_size=2, num_workers=2, worker_init_fn=_worker_init)
    it = iter(loader)            # alive until the interpreter exits, as a frame or a cycle can keep it
    next(it)
    print("pids", *[w.pid for w in it._workers], flush=True)
    sys.exit(0)
""")


def _run(cls: str, timeout_s: float) -> tuple[int | None, str, list[int]]:
    p = subprocess.Popen([sys.executable, "-c", SCRIPT.format(cls=cls)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        rc = None
    else:
        rc = p.returncode
    pids = [int(x) for line in out.splitlines() if line.startswith("pids ") for x in line.split()[1:]]
    return rc, out, pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(300)
def test_an_iterator_alive_at_exit_does_not_hold_the_process():
    rc, out, pids = _run("ExitSafeLoader", 120)      # a hang detector, generous for a loaded machine
    try:
        assert rc == 0, f"the process did not exit (rc {rc}); its output: {out[-2000:]}"
        assert len(pids) == 2, out
        assert not [p for p in pids if _alive(p)], f"workers left running: {pids}"
    finally:
        for pid in pids:
            if _alive(pid):
                subprocess.run(["kill", "-9", str(pid)])
