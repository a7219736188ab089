"""What a sink's runner costs per batch handed to it: the working tree's SinkRunner against the
one at another commit, side by side in one process.

The daemon hands every batch of output records to each sink's runner (`put`, on its thread);
the runner's thread takes it (`_take`) and gives it to the sink. This times that hand-off alone,
with a sink that does nothing: --batches batches of --size records put as fast as the runner's
thread takes them, then close. The two runners run alternately, --rounds each; reported per
version: µs per batch (wall time of put..close / batches), the median and the range, and the
ratio of the medians.

    .venv/bin/python -m benchmarks.sink_runner_cost [--baseline REV] [--batches 20000] [--size 64]

The default baseline, d439704, is the runner before its end was decided under the queue's lock
(benchmarks/RESULTS.md, "The final counters left in a sink's queue at the drain").
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "telemetry/daemon/sinks/base.py"
BASELINE = "d439704"


def load_at(rev: str | None, tmp: Path):
    """The module telemetry/daemon/sinks/base.py as it is at `rev` (None: the working tree)."""
    if rev is None:
        path = ROOT / SOURCE
    else:
        text = subprocess.run(["git", "show", f"{rev}:{SOURCE}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
        path = tmp / f"base_{rev}.py"
        path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"sink_base_{rev or 'tree'}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def one_round(mod, batches: int, size: int) -> float:
    class Null(mod.Sink):
        name = "null"

        def consume(self, batch):
            pass

    batch = [mod.Out("metrics", {}, b"{}")] * size
    runner = mod.SinkRunner(Null(), max_queued=batches * size + 1)
    runner.start()
    runner.wait_started(5)
    t0 = time.perf_counter()
    for _ in range(batches):
        runner.put(batch)
    if not runner.close(60):
        raise SystemExit("the runner did not finish")
    dt = time.perf_counter() - t0
    assert runner.num_written == batches * size and runner.num_dropped == 0
    return dt / batches * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=BASELINE, help=f"the commit to compare with (default {BASELINE})")
    ap.add_argument("--batches", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=64, help="records per batch")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            versions = {args.baseline: load_at(args.baseline, Path(tmp)), "tree": load_at(None, Path(tmp))}
        except subprocess.CalledProcessError as exc:
            print(f"sink_runner_cost: cannot read {SOURCE} at {args.baseline}: {exc.stderr.strip()}",
                  file=sys.stderr)
            return 2
        times: dict[str, list[float]] = {k: [] for k in versions}
        for _ in range(args.rounds):
            for name, mod in versions.items():
                times[name].append(one_round(mod, args.batches, args.size))
    print(f"{args.batches} batches of {args.size} records, {args.rounds} rounds alternated; µs per batch")
    for name, ts in times.items():
        print(f"  {name:>10}: median {statistics.median(ts):.2f}  range {min(ts):.2f}-{max(ts):.2f}")
    base, tree = (statistics.median(times[k]) for k in versions)
    print(f"  tree / {args.baseline}: {tree / base:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
