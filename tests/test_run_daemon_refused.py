"""`telemetry run` whose daemon refuses what it was given (a bad --daemon-config): one line that
is this daemon's own, exit 2 as for any bad input, and the script never runs. The run directory
may hold an earlier run's daemon.out: its lines are not this run's failure."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_refused_daemon_config_is_exit_2_with_this_runs_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    # An earlier run of the directory whose daemon failed on another file.
    (run_dir / "daemon.out").write_text("telemetry daemon: bad config: config file OLD.yaml: not a config\n" * 3)
    bad = tmp_path / "deep.yaml"
    bad.write_text("a: " + "[" * 200 + "]" * 200 + "\n")        # nested past the loader's bound
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRY_")}
    env["TELEMETRY_RUNTIME_DIR"] = str(tmp_path / "rt")
    p = subprocess.run([sys.executable, "-m", "telemetry", "run", "--run-dir", str(run_dir), "--wandb", "disabled",
                        "--daemon-config", str(bad), str(script)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "deep.yaml" in p.stderr and "nested deeper" in p.stderr, p.stderr[-2000:]
    assert "OLD.yaml" not in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert not marker.exists()
