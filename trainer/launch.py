"""torchrun that exits with the first failing rank's own exit code.

    python -m trainer.launch --standalone --nproc_per_node 2 -m trainer.train --config ...

torchrun turns any failed worker into its own exit 1, and writes the rank's code only into its
report. The trainer's codes mean something (2 a config error, 3 nonfinite_action=stop, 128+N
ended by signal N): this runs torchrun's own `run` and exits with the code of the failure
torchrun records first (ChildFailedError.get_first_failure: the earliest timestamp, in whole
seconds, the lowest rank on a tie), a rank killed by signal N as 128+N, as a shell reports it.
torchrun's report is printed as before.
"""
from __future__ import annotations

import sys


def shell_code(exitcode: int) -> int:
    """A worker's exit code as torchrun records it (minus N: killed by signal N) as a shell's."""
    return 128 - exitcode if exitcode < 0 else exitcode


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from torch.distributed.run import parse_args, run

    @record   # what torchrun's main does: its error handler, for the agent's own failures
    def launch() -> int:
        try:
            run(parse_args(argv))
        except ChildFailedError as exc:
            print(exc, file=sys.stderr)         # torchrun's report: each failed rank, its code
            rank, failure = exc.get_first_failure()
            code = shell_code(failure.exitcode) or 1
            print(f"[trainer.launch] rank {rank} failed first (exit code {failure.exitcode}): exiting {code}",
                  file=sys.stderr, flush=True)
            return code
        return 0

    return launch()


if __name__ == "__main__":
    sys.exit(main())
