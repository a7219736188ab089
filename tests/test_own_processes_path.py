"""The processes our tools start (`telemetry run`'s daemon, the daemon a script starts for
itself) import our package, never a module or directory of the same name in the user's working
directory: `python -m` puts that directory first on sys.path, where a user's `telemetry.py` (or,
with an editable install behind an import hook, the default run directory `./telemetry/<id>/`)
stood in for the package and the daemon died at start."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from telemetry.shared.ourpython import module_cmd

ROOT = Path(__file__).resolve().parent.parent
TRAP = "raise SystemExit('the working directory\\'s telemetry.py was imported')\n"


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_", "WANDB_"))}
    env.update(PYTHONPATH=str(ROOT), **extra)
    return env


def test_our_module_command_ignores_the_working_directorys_namesake(tmp_path):
    (tmp_path / "telemetry.py").write_text(TRAP)
    plain = subprocess.run([sys.executable, "-m", "telemetry", "--version"], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode != 0 and "was imported" in plain.stderr     # the hazard is real
    ours = subprocess.run([*module_cmd("telemetry"), "--version"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert ours.returncode == 0 and ours.stdout.startswith("telemetry "), ours
    # The working directory is still on the path, behind ours: a user's custom sink there loads.
    (tmp_path / "mysink.py").write_text("X = 1\n")
    probe = subprocess.run([sys.executable, "-c", module_cmd("telemetry")[2].replace(
        "runpy.run_module('telemetry', run_name='__main__', alter_sys=True)", "import mysink; print(mysink.X)")],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "1", probe


def test_a_scripts_own_daemon_starts_beside_a_namesake_in_the_working_directory(tmp_path):
    work, scripts = tmp_path / "work", tmp_path / "scripts"
    work.mkdir()
    scripts.mkdir()
    (work / "telemetry.py").write_text(TRAP)
    script = scripts / "s.py"
    script.write_text(textwrap.dedent("""
        from telemetry import TelemetryClient
        c = TelemetryClient()
        for step in range(3):
            c.log(step, {"x": float(step)})
        c.close()
    """))
    runtime = Path("/tmp") / f"tmown-{os.getpid()}-{abs(hash(str(tmp_path))) % 10**8}"
    out = subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True, timeout=180,
                         env=_env(TELEMETRY_AUTOSTART="1", TELEMETRY_RUNTIME_DIR=str(runtime)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "telemetry daemon started" in out.stderr and "no daemon could be started" not in out.stderr, out.stderr
    (metrics,) = list((work / "telemetry").glob("*/metrics.jsonl"))
    assert '"x"' in metrics.read_text()


def test_telemetry_runs_own_processes_start_beside_a_namesake(tmp_path):
    """`telemetry run` (a console script: no working directory on its path) starts its daemon and
    its launcher as ours, with a user's telemetry.py and trainer.py in the working directory."""
    (tmp_path / "telemetry.py").write_text(TRAP)
    (tmp_path / "trainer.py").write_text(TRAP.replace("telemetry.py", "trainer.py"))
    (tmp_path / "plain.py").write_text("print('the script ran')\n")
    runtime = Path("/tmp") / f"tmown-{os.getpid()}-{abs(hash(str(tmp_path))) % 10**8}"
    for nproc in ("1", "2"):
        out = subprocess.run([*module_cmd("telemetry"), "run", "--nproc", nproc, "--", "plain.py"], cwd=tmp_path,
                             env=_env(TELEMETRY_RUNTIME_DIR=str(runtime), WANDB_MODE="disabled"),
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and "the script ran" in out.stdout, (nproc, out.stdout[-2000:], out.stderr[-3000:])
        assert "was imported" not in out.stdout + out.stderr
