"""A base commit against the working tree, side by side in one run: what benchmarks/log_cost_ab.py
and benchmarks/forward_ledger_ab.py share. The base is a `git worktree` of the commit in a
temporary directory; one receiving process drains a PULL socket (as the daemon or the head
would); each round runs one short child process per version, alternately (the order flips every
round), with PYTHONPATH at that version's tree, and takes the JSON object its last output line
prints. Both trees run as an install leaves them: the base's C parts built in its worktree, and
every version's modules compiled to bytecode (compile_bytecode).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SINK = r"""
import sys, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.PULL); s.setsockopt(zmq.RCVHWM, 0); s.bind(sys.argv[1])
print("ready", flush=True)
while True:
    s.recv()
"""


def _build_extensions(tree: Path) -> None:
    """The base's C parts, built in its worktree as the install builds them in a checkout (they
    are build products, not in git): without them the base would run its Python twins and the
    comparison would measure that. A base whose build fails runs without them, said."""
    if not (tree / "setup.py").exists():
        return
    out = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree, capture_output=True,
                         text=True)
    if out.returncode != 0:
        print(f"warning: the base's C extensions did not build (it runs without them): {out.stderr[-500:]}",
              file=sys.stderr)


def compile_bytecode(tree: Path) -> None:
    """The tree's packages compiled to bytecode before anything is timed, as an install leaves
    them (pip compiles a package it installs; launch/setup.sh compiles the checkout's): where
    PYTHONDONTWRITEBYTECODE is set, every child process would otherwise compile each of our
    modules it imports, tens of milliseconds of a client's start-up that no installed client pays."""
    packages = [str(tree / p) for p in ("protocol", "telemetry", "trainer") if (tree / p).is_dir()]
    out = subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"warning: {tree} was not all compiled to bytecode: {out.stdout[-500:]}", file=sys.stderr)


@contextmanager
def base_and_sink(base: str, endpoint: Callable[[Path], str],
                  daemon: bool | None = None) -> Iterator[tuple[dict[str, Path], str]]:
    """({"base <rev>": its worktree, "working tree": ROOT}, the sink's endpoint), for the with
    block; the worktree and the sink are gone after it. endpoint(tmp dir) names the sink's. With
    `daemon` (True or False) the tuple has the sink's pid too, and with True the sink is a real
    daemon of the working tree (W&B off, its log directory in the temporary one)."""
    tmp = Path(tempfile.mkdtemp(prefix="ab-"))
    base_tree = tmp / "base"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base_tree), base], cwd=ROOT, check=True)
    _build_extensions(base_tree)
    for tree in (base_tree, ROOT):
        compile_bytecode(tree)
    ep = endpoint(tmp)
    if daemon:
        cmd = [sys.executable, "-m", "telemetry", "daemon", "--log-dir", str(tmp / "log"), "--wandb", "disabled",
               "--ingest", ep, "--pub", f"ipc://{tmp}/pub.sock", "--control", f"ipc://{tmp}/control.sock"]
        out = open(tmp / "daemon.out", "w")          # a file: a pipe nobody reads would fill and stop it
        sink = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        out.close()
    else:
        sink = subprocess.Popen([sys.executable, "-c", SINK, ep], stdout=subprocess.PIPE, text=True)
    try:
        if daemon:
            deadline = time.monotonic() + 120
            while "telemetry daemon ready" not in (tmp / "daemon.out").read_text():
                if sink.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the daemon never said ready:\n" + (tmp / "daemon.out").read_text()[-2000:])
                time.sleep(0.05)
        else:
            assert sink.stdout.readline().strip() == "ready"
        trees = {f"base {base}": base_tree, "working tree": ROOT}
        yield (trees, ep) if daemon is None else (trees, ep, sink.pid)
    finally:
        sink.kill()
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False)


def alternate(trees: dict[str, Path], rounds: int, child: str, args: list[str],
              show: Callable[[dict], str]) -> dict[str, list[dict]] | None:
    """Each version's results over the rounds, printing show(result) as each comes; None (its
    stderr printed) when a child fails."""
    out: dict[str, list[dict]] = {k: [] for k in trees}
    for r in range(rounds):
        for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
            env = {**os.environ, "PYTHONPATH": str(trees[name])}
            p = subprocess.run([sys.executable, "-c", child, *args], env=env, cwd=trees[name],
                               capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                print(p.stderr, file=sys.stderr)
                return None
            res = json.loads(p.stdout.strip().splitlines()[-1])
            out[name].append(res)
            print(f"round {r} {name:>16}: {show(res)}", flush=True)
    return out
