"""telemetry tail against a real daemon: line mode output, --filter, clean detach; the live view renders."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from telemetry.client import TelemetryClient
from telemetry.consumers.tail import RecordFilter, TailState, format_line, render, sparkline

ROOT = Path(__file__).resolve().parent.parent


class Tail:
    """`telemetry tail --pub EP --plain` as a subprocess (pub None: no --pub), its stdout lines
    (`lines`) and stderr lines (`errors`) collected by threads."""

    def __init__(self, pub: str | None, *extra: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "telemetry", "tail", *(["--pub", pub] if pub else []),
                                      "--plain", *extra],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.lines: list[str] = []
        self.errors: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.errors), daemon=True).start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_for(self, pred, timeout_s: float = 20.0, stream: str = "lines") -> list[str]:
        lines = getattr(self, stream)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if pred(lines):
                return lines
            time.sleep(0.05)
        raise AssertionError(f"tail never printed what was expected on {stream}:\n" + "\n".join(lines[-30:])
                             + "\nstderr:\n" + "\n".join(self.errors[-10:]))

    def detach(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def _send_until(client: TelemetryClient, tail: Tail, pred, values_of) -> None:
    """Log steps until the tail shows what `pred` wants (it joins the PUB socket a little late)."""
    deadline = time.monotonic() + 120
    step = 0
    while time.monotonic() < deadline:
        step += 1
        client.log(step, values_of(step))
        time.sleep(0.05)
        if pred(tail.lines):
            return
    raise AssertionError("tail never printed what was expected:\n" + "\n".join(tail.lines[-30:]))


def test_line_mode_prints_steps_and_events_and_detaches_cleanly(daemon):
    tail = Tail(daemon.pub)
    client = TelemetryClient(daemon.ingest, rank=0)
    try:
        _send_until(client, tail, lambda ls: any(" metrics step=" in l and "train/loss=" in l for l in ls),
                    lambda s: {"train/loss": 2.5 - s / 1000, "perf/step_time": 0.1, "perf/tokens": 512})
        client.event("checkpoint_saved", {"path": "/x/ckpt"})
        tail.wait_for(lambda ls: any("event checkpoint_saved" in l and "path=/x/ckpt" in l for l in ls))
    finally:
        client.close()
    assert tail.detach() == 0  # Ctrl-C is the normal way out
    metric_lines = [l for l in tail.lines if " metrics step=" in l]
    # an aggregated line: the daemon's derived throughput rides along with the rank's loss
    assert any("perf/tokens_per_second=" in l for l in metric_lines)
    assert not any("Traceback" in e for e in tail.errors)
    assert daemon.proc.poll() is None  # the daemon never noticed


def test_filter_keeps_only_matching_metric_names(daemon):
    tail = Tail(daemon.pub, "--filter", "train/")
    client = TelemetryClient(daemon.ingest, rank=0)
    try:
        _send_until(client, tail, lambda ls: any("train/loss=" in l for l in ls),
                    lambda s: {"train/loss": 1.5, "perf/step_time": 0.1, "memory/allocated_gb": 3.0})
    finally:
        client.close()
    assert tail.detach() == 0
    assert tail.lines
    for line in tail.lines:
        kind = line.split()[1]
        assert kind == "metrics", line  # gpu/system/daemon records have no train/ values
        assert "perf/" not in line and "memory/" not in line, line


def test_filter_unit():
    f = RecordFilter("diagnosis/")
    assert f.apply("event", {"name": "diagnosis/straggler"}) is not None
    assert f.apply("event", {"name": "checkpoint_saved"}) is None
    assert RecordFilter("gpu").apply("gpu", {"values": {"gpu/util_percent": 1}}) is not None
    assert RecordFilter("train/").apply("metrics", {"values": {"perf/mfu": 1}}) is None


def test_format_line_and_sparkline():
    line = format_line("event", {"t": 0, "rank": 3, "name": "diagnosis/straggler",
                                 "data": {"message": "rank 3 is slow"}})
    assert line.endswith("event diagnosis/straggler rank=3: rank 3 is slow")
    line = format_line("event", {"t": 0, "rank": 1, "name": "diagnosis/hang",
                                 "data": {"message": "rank 1 is in load_batch", "bundle": "/l/forensics/x"}})
    assert line.endswith("diagnosis/hang rank=1: rank 1 is in load_batch [forensics: /l/forensics/x]")
    assert format_line("gpu", {"t": 0, "host": "n0", "gpu": 1, "values": {"gpu/util_percent": 97.25}}) \
        .split(" ", 1)[1] == "gpu n0/1 gpu/util_percent=97.25"
    assert sparkline([1, 2, 3]) == "▁▅█"
    assert sparkline([]) == ""


def test_live_view_renders_every_panel():
    from rich.console import Console

    st = TailState()
    st.consume("hello", {"rank": 0, "info": {"run_name": "my-run"}})
    for step in range(1, 30):
        st.consume("metrics", {"step": step, "values": {"train/loss": 3 - step / 10, "perf/tokens_per_second": 1e5,
                                                        "perf/mfu": 0.4, "perf/step_time_max": 0.5,
                                                        "perf/step_time_min": 0.45, "perf/slowest_rank": 1}})
    st.consume("metrics", {"step": 29, "rank": 0, "values": {"perf/step_time": 0.45}})
    st.consume("metrics", {"step": 29, "rank": 1, "values": {"perf/step_time": 0.5}})
    st.consume("gpu", {"host": "n0", "gpu": 0, "values": {"gpu/util_percent": 97, "gpu/memory_used_gb": 40,
                                                          "gpu/memory_total_gb": 80}})
    st.consume("event", {"t": 0, "name": "diagnosis/straggler", "data": {"message": "rank 1 is slow",
                                                                        "severity": "warning"}})
    st.consume("daemon", {"t": 0, "values": {"goodput/fraction": 0.873, "goodput/startup_s": 12.0,
                                             "goodput/hang_s": 3.0, "goodput/productive_s": 200.0}})
    for width in (80, 140):
        console = Console(width=width, record=True, file=open(os.devnull, "w"))
        console.print(render(st, "ipc:///x", width=width))
        text = console.export_text()
        for needle in ("my-run", "0.1000", "100,000", "40.0 %", "rank 1 is slow", "97 %", "40.0/80 GB",
                       "spread 10.0 %", "goodput", "87.3 %", "startup", "12 s"):
            assert needle in text, (width, needle, text)


def test_an_event_from_every_rank_is_one_line_and_the_end_is_said(daemon):
    tail = Tail(daemon.pub)
    clients = [TelemetryClient(daemon.ingest, rank=r) for r in (0, 1)]
    try:
        _send_until(clients[0], tail, lambda ls: any(" metrics step=" in l for l in ls),
                    lambda s: {"train/loss": 1.0, "perf/step_time": 0.1})
        for c in clients:
            c.hello({"run_name": "two-ranks"})
        for c in clients:
            c.event("checkpoint_saved", {"path": "/ckpt/step_5", "step": 5})
        tail.wait_for(lambda ls: any("event checkpoint_saved" in l for l in ls))
    finally:
        for c in clients:
            c.close()
    tail.wait_for(lambda ls: any("run ended: all 2 ranks closed" in l for l in ls))
    assert tail.detach() == 0
    saved = [l for l in tail.lines if "event checkpoint_saved" in l]
    assert len(saved) == 1 and "ranks=0-1" in saved[0] and "path=/ckpt/step_5" in saved[0], saved


def test_line_mode_says_when_the_daemon_goes_and_comes_back(make_daemon, tmp_path):
    import tempfile

    sockets = Path(tempfile.mkdtemp(prefix="ttail-", dir="/tmp"))
    eps = ("--ingest", f"ipc://{sockets}/i.sock", "--pub", f"ipc://{sockets}/p.sock",
           "--control", f"ipc://{sockets}/c.sock")
    first = make_daemon(extra_args=eps)
    tail = Tail(f"ipc://{sockets}/p.sock")
    try:
        # Connected: it prints what the first daemon publishes (a fixed sleep here failed on a
        # loaded box, where the tail took longer than that to start).
        client = TelemetryClient(first.ingest, rank=0)
        try:
            _send_until(client, tail, lambda ls: any(" metrics step=" in l for l in ls), lambda s: {"train/loss": 1.0})
        finally:
            client.close()
        first.stop()
        tail.wait_for(lambda ls: any("daemon not reachable" in l for l in ls))
        make_daemon(extra_args=eps)
        tail.wait_for(lambda ls: any("daemon reachable again" in l for l in ls))
    finally:
        assert tail.detach() == 0
    news = [l.split(" ", 1)[1] for l in tail.lines if " daemon " in l and "reachable" in l]
    assert news == ["daemon not reachable (stopped or restarting); waiting for it", "daemon reachable again"], news


def test_live_view_shows_eval_per_dataset_and_the_end():
    from rich.console import Console

    st = TailState()
    st.consume("hello", {"rank": 0, "info": {"run_name": "r"}})
    st.consume("metrics", {"step": 10, "values": {"train/loss": 2.0, "eval/copy/loss": 1.25,
                                                  "eval/copy/accuracy": 0.5, "eval/sort/loss": 1.75}})
    for rank in (0, 1):
        st.consume("event", {"t": 0, "rank": rank, "name": "checkpoint_saved", "data": {"path": "/c", "step": 10}})
    st.consume("bye", {"rank": 0, "stats": {}})
    console = Console(width=140, record=True, file=open(os.devnull, "w"))
    console.print(render(st, "ipc:///x", width=140))
    text = console.export_text()
    for needle in ("eval copy", "1.2500", "accuracy 0.5", "eval sort", "1.7500", "at step 10",
                   "run ended: rank 0 closed", "checkpoint_saved ranks 0-1"):
        assert needle in text, (needle, text)
    assert text.count("checkpoint_saved") == 1


def test_the_live_view_shows_the_runs_own_metrics_grouped_with_their_units():
    """A script's own names (acc, my/thing) first, then the catalogue's not drawn elsewhere, by
    the catalogue's group with its unit; what the training panel draws is not repeated; past
    MAX_METRIC_ROWS the rest is counted, with the --filter that shows them; with a filter the
    filter's own panel lists what matches instead."""
    from rich.console import Console

    from telemetry.consumers.tail import MAX_METRIC_ROWS
    from telemetry.shared.catalogue import OWN_GROUP as YOURS

    values = {"train/loss": 2.0, "perf/tokens_per_second": 1e5, "eval/loss": 1.5, "acc": 0.75, "my/thing": 3,
              "perf/forward_time": 0.125, "memory/allocated_gb": 1.5, "perf/tokens": 4096, "flag": True,
              "note": "text"}
    only = TailState()
    only.consume("metrics", {"step": 3, "values": values})
    rows = only.metric_rows()
    assert [(g, k) for g, k, _, _ in rows] == [(YOURS, "acc"), (YOURS, "my/thing"), ("counts", "perf/tokens"),
                                              ("device memory", "memory/allocated_gb"),
                                              ("step timing", "perf/forward_time")], rows
    assert rows[4][3] == "s" and rows[3][3] == "GB" and rows[0][3] == ""
    st = TailState()
    st.consume("metrics", {"step": 3, "values": {**values, **{f"z{i}": float(i) for i in range(MAX_METRIC_ROWS)}}})
    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    console.print(render(st, "ipc:///x", width=120))
    text = console.export_text()
    for needle in ("metrics", "yours", "acc", "0.75", "my/thing", "+5 more", "--filter PREFIX: memory/, perf/, z8, ..."):
        assert needle in text, (needle, text)
    assert text.count("train/loss") == 0 and "z0" in text
    st.consume("metrics", {"step": 4, "values": {"a/new": 1.0, "acc": 0.5}})     # a new name; a new value
    rows = st.metric_rows()
    assert rows[0] == (YOURS, "a/new", 1.0, "") and (YOURS, "acc", 0.5, "") in rows
    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    console.print(render(st, "ipc:///x", filter_prefix="perf/", width=120))
    text = console.export_text()
    assert "+5 more" not in text and "metrics matching 'perf/'" in text


# -- a daemon that is not there, gone, or relaunched elsewhere -----------------------------------
def _socket_dir() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="ttail-", dir="/tmp"))


def _eps(sockets: Path) -> tuple[str, str, str]:
    """(ingest, pub, control) in `sockets` under the default names, as `telemetry run` makes them."""
    return tuple(f"ipc://{sockets}/{n}.sock" for n in ("ingest", "pub", "control"))


def _steps_in(lines: list[str]) -> list[int]:
    return [int(l.split("step=")[1].split()[0]) for l in lines if " metrics step=" in l]


def _log_steps(client: TelemetryClient, tail: Tail, first: int, until) -> int:
    """Log steps from `first` until the tail's lines satisfy `until`; the next step's number."""
    deadline = time.monotonic() + 120
    step = first
    while time.monotonic() < deadline:
        client.log(step, {"train/loss": 1.0 / step})
        step += 1
        time.sleep(0.05)
        if until(tail.lines):
            return step
    raise AssertionError("tail never printed what was expected:\n" + "\n".join(tail.lines[-30:])
                         + "\nstderr:\n" + "\n".join(tail.errors[-10:]))


def test_tail_follows_a_relaunched_run_to_its_new_socket_directory(make_daemon, tmp_path):
    """A relaunch (same run directory, a new daemon with its sockets in a new directory, as
    `telemetry run` does) is followed by a tail attached as `telemetry run` says to attach
    ($TELEMETRY_RUNTIME_DIR of the first launch): it learns the run directory from the first
    daemon's status and reaches the new daemon through the endpoints it wrote there."""
    import shutil

    log_dir = tmp_path / "run" / "telemetry"
    first_dir, second_dir = _socket_dir(), _socket_dir()
    try:
        first = make_daemon(log_dir=log_dir, endpoints=_eps(first_dir))
        tail = Tail(None, env={"TELEMETRY_RUNTIME_DIR": str(first_dir)})
        try:
            client = TelemetryClient(first.ingest, rank=0)
            try:
                nxt = _log_steps(client, tail, 1, lambda ls: max(_steps_in(ls), default=0) >= 49)
            finally:
                client.close()
            first.drain()
            shutil.rmtree(first_dir)          # `telemetry run` removes the directory it made
            tail.wait_for(lambda ls: any("daemon not reachable" in l for l in ls))
            # Only the second daemon publishes steps from `nxt` on.
            second = make_daemon(log_dir=log_dir, endpoints=_eps(second_dir), tmp_path=tmp_path / "d1")
            client = TelemetryClient(second.ingest, rank=0)
            try:
                _log_steps(client, tail, nxt, lambda ls: max(_steps_in(ls), default=0) >= max(80, nxt))
            finally:
                client.close()
        finally:
            assert tail.detach() == 0
    finally:
        shutil.rmtree(first_dir, ignore_errors=True)
        shutil.rmtree(second_dir, ignore_errors=True)
    assert any("new daemon" in e and str(second_dir) in e for e in tail.errors), tail.errors
    assert not any("Traceback" in e for e in tail.errors), tail.errors


def test_tail_run_dir_waits_for_the_runs_daemon_and_says_so(make_daemon, tmp_path):
    """--run-dir before the run has a daemon: one line on stderr that it waits, then the run."""
    import shutil

    log_dir = tmp_path / "run" / "telemetry"
    log_dir.mkdir(parents=True)
    sockets = _socket_dir()
    try:
        tail = Tail(None, "--run-dir", str(log_dir.parent))     # the run dir of launch/run.sh's layout
        try:
            tail.wait_for(lambda es: any("waiting for one" in e for e in es), timeout_s=60, stream="errors")
            d = make_daemon(log_dir=log_dir, endpoints=_eps(sockets))
            client = TelemetryClient(d.ingest, rank=0)
            try:
                _log_steps(client, tail, 1, lambda ls: _steps_in(ls))
            finally:
                client.close()
        finally:
            assert tail.detach() == 0
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    assert sum("waiting for one" in e for e in tail.errors) == 1, tail.errors


def test_plain_tail_with_no_daemon_says_it_waits(tmp_path):
    """Nothing serves the endpoint: said once on stderr (where it looked), not silence."""
    import shutil

    sockets = _socket_dir()
    try:
        tail = Tail(f"ipc://{sockets}/pub.sock")
        try:
            tail.wait_for(lambda es: any("nothing serves" in e for e in es), timeout_s=60, stream="errors")
        finally:
            assert tail.detach() == 0
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    said = [e for e in tail.errors if "nothing serves" in e]
    assert len(said) == 1 and f"ipc://{sockets}/pub.sock" in said[0] and "waiting" in said[0], tail.errors
    assert tail.lines == []


def test_tail_says_when_it_cannot_follow_a_daemon_whose_sockets_are_gone(make_daemon):
    """Only --pub (no run directory to look in): a daemon whose socket file is gone is said to be
    beyond this view, with what to do, instead of waiting on it for ever in silence."""
    import shutil

    sockets = _socket_dir()
    try:
        d = make_daemon(endpoints=_eps(sockets))
        tail = Tail(f"ipc://{sockets}/pub.sock")
        try:
            client = TelemetryClient(d.ingest, rank=0)
            try:
                _log_steps(client, tail, 1, lambda ls: _steps_in(ls))
            finally:
                client.close()
            d.drain()
            shutil.rmtree(sockets)
            tail.wait_for(lambda es: any("cannot follow" in e for e in es), timeout_s=60, stream="errors")
        finally:
            assert tail.detach() == 0
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    assert any("--run-dir" in e for e in tail.errors if "cannot follow" in e), tail.errors


def test_non_finite_values_show_as_nan_not_none(daemon):
    """A diverged loss (NaN, Inf, -Inf) reaches tail as null (the daemon writes every non-finite
    value so: JSON has no such numbers); tail printed it as Python's None. Now nan, in the plain
    lines and in the live view, as `report` counts it (NaN/Inf)."""
    from rich.console import Console

    bad = [float("nan"), float("inf"), float("-inf")]
    tail = Tail(daemon.pub)
    client = TelemetryClient(daemon.ingest, rank=0)
    try:
        _send_until(client, tail, lambda ls: sum("train/loss=" in l for l in ls) >= 3,
                    lambda s: {"train/loss": bad[s % 3], "train/ok": 1.5})
    finally:
        client.close()
    assert tail.detach() == 0
    losses = [l.split("train/loss=", 1)[1].split()[0] for l in tail.lines if "train/loss=" in l]
    assert losses and set(losses) == {"nan"}, tail.lines[-10:]
    assert not any("None" in l for l in tail.lines), tail.lines[-10:]

    state = TailState()
    state.consume("metrics", {"kind": "metrics", "t": 1.0, "step": 7, "values": {"train/loss": None, "my/acc": None}})
    console = Console(width=140, record=True, file=open(os.devnull, "w"))
    console.print(render(state, "ipc://x", "", 140))
    shown = console.export_text()
    assert "None" not in shown, shown
    assert re.search(r"\bloss\s+nan\b", shown) and re.search(r"\bmy/acc\s+nan\b", shown), shown
    # A float that is not finite (never on the wire, but a record handed in) shows as itself.
    assert format_line("metrics", {"t": 0, "step": 1, "values": {"a": float("inf"), "b": float("-inf")}}) \
        .endswith("step=1 a=inf b=-inf")


def test_a_reader_that_left_ends_tail_as_every_command(daemon):
    """`telemetry tail | head -1`: the reader left and tail exited 0, as if it had shown all it was
    asked; now quietly with 141, as every other command (telemetry.cli.EXIT_READER_LEFT)."""
    from telemetry.cli import EXIT_READER_LEFT

    r, w = os.pipe()
    os.close(r)          # the reader is gone before tail writes its first line
    try:
        proc = subprocess.Popen([sys.executable, "-m", "telemetry", "tail", "--pub", daemon.pub, "--plain"],
                                cwd=ROOT, stdout=w, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(w)
    client = TelemetryClient(daemon.ingest, rank=0)
    try:
        deadline = time.monotonic() + 120
        step = 0
        while proc.poll() is None and time.monotonic() < deadline:   # until tail writes a line
            step += 1
            client.log(step, {"train/loss": 1.0})
            time.sleep(0.05)
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert (proc.wait(10), err) == (EXIT_READER_LEFT, ""), err[-2000:]
