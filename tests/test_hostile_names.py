"""Names and strings from the wire never drive the terminal, nor matplotlib.

A rank (or anyone who reaches the ingest) chooses metric names, event names and data. On a
terminal, ESC ] 52;c;... BEL writes the clipboard, ESC [2J clears the screen, ESC ]0;... BEL
sets the window title; rich reads "[red]" as markup; matplotlib reads "$...$" as mathtext (an
unbalanced one made savefig raise) and ±1e308 broke its axis limits.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from daemon_util import ROOT

OSC52 = "\x1b]52;c;aGVsbG8=\x07"      # the clipboard
CLEAR = "\x1b[2J"                      # the screen
TITLE = "\x1b]0;pwned\x07"             # the window title
C1 = "\x9b31m"                          # CSI as one C1 byte
MARKUP = "[red]markup[/red]"

NAMES = {f"evil/{OSC52}clip": 1.0, f"evil/{CLEAR}clear": 2.0, f"evil/{TITLE}title": 3.0,
         f"evil/{C1}c1": 4.0, f"evil/{MARKUP}": 5.0}


def _log_hostile(endpoint: str) -> None:
    from telemetry import TelemetryClient

    tm = TelemetryClient(endpoint=endpoint, rank=0)
    try:
        tm.log(1, dict(NAMES))
        tm.event(f"evil{TITLE}event", {f"k{CLEAR}": f"v{OSC52}", "message": f"msg {TITLE}{MARKUP}"})
    finally:
        tm.close()


def test_tail_plain_prints_no_escape_sequence_from_the_wire(make_daemon, tmp_path):
    d = make_daemon(world_size=1, config={"pollers": {"nvml_enabled": False, "host_enabled": False}})
    out_path = tmp_path / "tail.out"
    with open(out_path, "wb") as out:
        tail = subprocess.Popen([sys.executable, "-m", "telemetry", "tail", "--plain", "--pub", d.pub],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            # PUB/SUB slow joiner: send until tail has printed the step (a first send may be lost).
            deadline = time.monotonic() + 60
            while b"step=1" not in out_path.read_bytes() or b"event" not in out_path.read_bytes():
                assert time.monotonic() < deadline and tail.poll() is None, out_path.read_bytes()[-2000:]
                _log_hostile(d.ingest)
                for _ in range(20):
                    if b"event" in out_path.read_bytes():
                        break
                    time.sleep(0.1)
        finally:
            tail.terminate()
            tail.wait(30)
    raw = out_path.read_bytes()
    assert b"\x1b" not in raw and b"\x07" not in raw and "\x9b".encode() not in raw, raw[-2000:]
    text = raw.decode()
    # Still there, visibly: the escapes are shown, not dropped.
    assert "evil/\\x1b]52;c;aGVsbG8=\\x07clip=1" in text and "evil/\\x1b[2Jclear=2" in text
    assert "evil/\\x9b31mc1=4" in text and f"evil/{MARKUP}=5" in text
    assert "evil\\x1b]0;pwned\\x07event" in text


def test_tail_live_view_shows_names_as_text(tmp_path):
    """The rich view: no escape from the wire, and "[red]" is shown, not read as markup."""
    from rich.console import Console

    from telemetry.consumers import tail
    from telemetry.consumers.tail import TailState, render

    # What _run_live does to each record before the state takes it (before the fix: nothing).
    printable_record = getattr(tail, "printable_record", lambda rec: rec)

    state = TailState()
    recs = [("metrics", {"kind": "metrics", "t": time.time(), "step": 1, "values": {
                 **NAMES, f"eval/{TITLE}{MARKUP}/loss": 1.5}}),
            ("gpu", {"kind": "gpu", "t": time.time(), "host": f"h{CLEAR}{MARKUP}", "gpu": 0,
                     "values": {"gpu/util_percent": 50}}),
            ("event", {"kind": "event", "t": time.time(), "rank": 0, "name": f"e{OSC52}",
                       "data": {"message": f"m{TITLE} {MARKUP}"}})]
    for kind, rec in recs:
        state.consume(kind, printable_record(rec))   # what _run_live does with each record
    buf = io.StringIO()
    Console(file=buf, width=200, force_terminal=True, color_system=None).print(render(state, "ipc://x", "evil/"))
    out = buf.getvalue()
    assert "\x1b" not in out and "\x07" not in out, repr(out[-2000:])
    assert MARKUP in out and "\\x1b]52;c;aGVsbG8=\\x07" in out and "\\x1b[2J" in out


def test_status_and_a_refused_token_print_no_escape(make_daemon, tmp_path):
    """status' text lines go through the same filter (a run name is the user's; a sink's last
    error may quote a name)."""
    d = make_daemon(run_name=f"run{TITLE}x")
    p = subprocess.run([sys.executable, "-m", "telemetry", "status", "--control", d.control],
                       cwd=ROOT, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert b"\x1b" not in p.stdout and b"run\\x1b]0;pwned\\x07x" in p.stdout, p.stdout


def _write_run(run: Path, values_per_step, datasets=()) -> None:
    (run / "telemetry").mkdir(parents=True)
    with open(run / "telemetry" / "metrics.jsonl", "w") as f:
        for s in range(1, 41):
            v = {"train/loss": 2.0 - s * 0.01, **values_per_step(s)}
            for ds in datasets:
                v[f"dataset/{ds}/loss"] = 1.0 + 0.01 * s
                v[f"eval/{ds}/loss"] = 1.5
            f.write(json.dumps({"kind": "metrics", "t": 1.7e9 + s, "step": s, "values": v}) + "\n")
            f.write(json.dumps({"kind": "metrics", "t": 1.7e9 + s, "step": s, "rank": 0,
                                "values": {"perf/step_time": values_per_step(s).get("perf/step_time", 0.1)}}) + "\n")
        f.write(json.dumps({"kind": "gpu", "t": 1.7e9 + 3, "host": "h$a", "gpu": 0,
                            "values": {"gpu/util_percent": 1e308, "gpu/memory_used_gb": 10.0,
                                       "gpu/memory_total_gb": 80.0}}) + "\n")
        f.write(json.dumps({"kind": "event", "t": 1.7e9 + 3, "name": f"diagnosis/x{TITLE}",
                            "data": {"message": f"m{CLEAR}", "severity": "critical"}}) + "\n")


def _report(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "telemetry", "report", str(run)], cwd=ROOT,
                          capture_output=True, timeout=300, env={**os.environ, "MPLBACKEND": "Agg"})


def test_report_draws_mathtext_names_literally(tmp_path):
    """A dataset named with "$": an unbalanced or invalid mathtext made savefig raise."""
    run = tmp_path / "run"
    _write_run(run, lambda s: {}, datasets=("$x^$", "$\\notacommand{$", "cost $5 and $6"))
    p = _report(run)
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr.decode()[-3000:]
    assert (run / "telemetry" / "report" / "loss.png").stat().st_size > 0
    assert (run / "telemetry" / "report" / "eval.png").stat().st_size > 0
    assert b"\x1b" not in p.stdout and b"diagnosis/x\\x1b]0;pwned\\x07: m\\x1b[2J" in p.stdout, p.stdout


def test_report_survives_huge_and_non_finite_values_and_counts_them(tmp_path):
    run = tmp_path / "run"
    huge = {1: 1e308, 2: -1e308, 3: float("inf"), 4: float("-inf"), 5: float("nan")}

    def values(s):
        bad = huge.get(s % 6)
        v = {"perf/tokens_per_second": 1000.0 + s, "perf/mfu": 0.3, "perf/step_time": 0.1,
             "train/lr": 1e-3, "train/grad_norm": 1.0, "perf/data_loading_time": 0.01}
        if bad is not None:
            v = {k: bad for k in v}
        return v
    _write_run(run, values)
    # json.dumps writes Infinity/NaN, as Python's json reads them back
    p = _report(run)
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr.decode()[-3000:]
    for png in ("throughput.png", "mfu.png", "step_time.png", "training.png"):
        assert (run / "telemetry" / "report" / png).stat().st_size > 0, png
    text = p.stdout.decode()
    line = next(ln for ln in text.splitlines() if "not plotted" in ln)
    assert int(line.split()[2]) > 0, text
