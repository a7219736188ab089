"""Whether a run has ended, and how, from the records a consumer sees.

A run has ended when every rank that said hello has said bye (its client closed), or when a
`train_end` event came and no step after it. A rank saying hello again (a resumed run, into the
same daemon or a new one) is running again. The daemon's drain is not in the records: the
dashboard reads run.sh's drain.json, tail sees the PUB socket disconnect.

How it ended (`how_ended`, the report's and the summary's `ended` line): the run's own end when
it says failure (a rank's `train_end`, what its W&B run records), with the launcher's exit code
beside it; else the launcher's.
"""
from __future__ import annotations

import signal

from telemetry.shared.numbers import is_int


class RunEnd:
    def __init__(self) -> None:
        self.hello_ranks: set[int] = set()
        self.bye_ranks: set[int] = set()
        self.train_end_step: int | None = None
        self.last_step: int | None = None

    def consume(self, kind: str, rec: dict) -> None:
        rank = rec.get("rank")
        rank = rank if is_int(rank) else None
        if kind == "metrics":
            step = rec.get("step")
            if isinstance(step, int) and "rank" not in rec:
                self.last_step = step if self.last_step is None else max(self.last_step, step)
                if self.train_end_step is not None and step > self.train_end_step:
                    self.train_end_step = None   # resumed: the run goes on
        elif kind == "hello" and rank is not None:
            self.hello_ranks.add(rank)
            self.bye_ranks.discard(rank)
            self.train_end_step = None
        elif kind == "bye" and rank is not None:
            self.bye_ranks.add(rank)
        elif kind == "event" and rec.get("name") == "train_end":
            data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
            step = data.get("step")
            self.train_end_step = step if isinstance(step, int) else (self.last_step or 0)

    def how(self) -> str:
        """'' while the run goes on, else why it is over ('all 8 ranks closed; train_end at step 300')."""
        out = []
        if self.hello_ranks and self.hello_ranks <= self.bye_ranks:
            n = len(self.hello_ranks)
            out.append(f"all {n} ranks closed" if n > 1 else f"rank {next(iter(self.hello_ranks))} closed")
        if self.train_end_step is not None:
            out.append(f"train_end at step {self.train_end_step}")
        return "; ".join(out)


# -- how it ended ---------------------------------------------------------------------------------
FINISH_EVENT = "train_end"           # {"exit_code": N}: a rank finished its run (telemetry.wandb's finish)
SCRIPT_EXIT_EVENT = "script_exit"    # {"exit_code": N}: the script's, as its launcher saw it


def run_failure(events: list[dict]) -> tuple[int | None, int] | None:
    """(rank, exit code) of the lowest rank whose run finished with a failure (its last
    `train_end`: a resumed rank's later finish supersedes an earlier one), as the W&B run records
    it; None when no rank's run said it failed."""
    last: dict[int | None, int] = {}
    for ev in events:
        code = _data(ev).get("exit_code")
        if ev.get("name") == FINISH_EVENT and type(code) is int:
            rank = ev.get("rank")
            last[rank if is_int(rank) else None] = code
    failed = sorted(((r, c) for r, c in last.items() if c), key=lambda rc: (rc[0] is None, rc[0] or 0))
    return failed[0] if failed else None


def how_ended(events: list[dict]) -> str:
    """How the run ended, in words: FAILED when the run's own end says so (a rank's `train_end`
    with a failure: a driver that exits 0 after a trial raised does not make the run a success),
    with the launcher's exit code (`script_exit`: `telemetry run`'s drain request, or the exit
    status of the process a daemon watched) beside it; else the launcher's word; "" when no
    record says."""
    codes = [c for c in (_data(ev).get("exit_code") for ev in events if ev.get("name") == SCRIPT_EXIT_EVENT)
             if type(c) is int]
    script = f"the script's exit code {_code(codes[-1])}" if codes else ""
    failure = run_failure(events)
    if failure is not None:
        rank, code = failure
        whose = f"rank {rank}'s run" if rank is not None else "a rank's run"
        return f"FAILED ({whose} finished with exit code {_code(code)}{'; ' + script if script else ''})"
    if not codes:
        return ""
    return f"{'successfully' if codes[-1] == 0 else 'FAILED'} ({script})"


def _code(code: int) -> str:
    """An exit code, with the signal it stands for when it is 128+N ('137: SIGKILL')."""
    if code > 128:
        try:
            return f"{code}: {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return str(code)


def _data(ev: dict) -> dict:
    data = ev.get("data")
    return data if isinstance(data, dict) else {}
