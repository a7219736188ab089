"""The `telemetry` command line (also `python -m telemetry`).

Each subcommand lives in its own module, imported only when that subcommand runs, so
`telemetry status` never pays for importing the daemon's sinks (or wandb). A module provides
`add_arguments(parser)` and `run(args) -> int` (the exit code), and a module docstring whose
first line is the subcommand's one-line help.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module. Order is the order shown in --help.
COMMANDS: dict[str, str] = {
    "daemon": "telemetry.daemon.cli",
    "run": "telemetry.tools.run",
    "status": "telemetry.consumers.status",
    "drain": "telemetry.consumers.drain",
    "tail": "telemetry.consumers.tail",
    "report": "telemetry.consumers.report",
    "goodput": "telemetry.consumers.goodput",
    "dashboard": "telemetry.consumers.dashboard",
    "export-prometheus": "telemetry.consumers.prometheus",
    "replay": "telemetry.consumers.replay",
    "mfu-check": "telemetry.tools.mfu_check",
    "metrics": "telemetry.tools.metrics",
    "keygen": "telemetry.tools.keygen",
}

# One-line help per subcommand, kept here so `telemetry --help` imports nothing heavy.
SUMMARIES: dict[str, str] = {
    "daemon": "run the telemetry daemon (ingest, aggregate, write JSONL, W&B, PUB)",
    "run": "run a training script under the sidecar: daemon, ranks, drain, summary, its exit code",
    "status": "ask a running daemon for its counters",
    "drain": "ask a running daemon to drain, flush and exit",
    "tail": "live view of a running job from the daemon's PUB socket",
    "report": "plots, an HTML page and a text summary from a run's metrics.jsonl",
    "goodput": "where the run's wall-clock time went: productive steps and each cause of loss",
    "dashboard": "a live dashboard in the browser (history from metrics.jsonl, live from PUB)",
    "export-prometheus": "serve the latest values as Prometheus gauges",
    "replay": "replay a run's metrics.jsonl into Weights & Biases",
    "mfu-check": "compare the analytic FLOPs formula with FlopCounterMode for a model",
    "metrics": "the metric catalogue: each metric's unit, kind, rules and meaning",
    "keygen": "make CURVE key pairs for non-loopback endpoints",
}


class Parser(argparse.ArgumentParser):
    """argparse, with bad input said in one line (argparse prints the whole usage first, ten
    lines for some commands) and exit code 2, as for every other bad input."""

    def error(self, message: str):
        from telemetry.consumers.terminal import printable

        self.exit(2, f"{self.prog}: error: {printable(message)} (see: {self.prog} --help)\n")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = Parser(
        prog="telemetry",
        description="Asynchronous telemetry sidecar for LLM training.",
        epilog="Run 'telemetry COMMAND --help' for a command's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    # Only the chosen subcommand's module is imported; the others show their summary.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, module_name in COMMANDS.items():
        p = sub.add_parser(name, help=SUMMARIES[name], description=SUMMARIES[name])
        if name == chosen:
            module = importlib.import_module(module_name)
            if module.__doc__:
                p.description = module.__doc__.strip()
                p.formatter_class = argparse.RawDescriptionHelpFormatter
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
