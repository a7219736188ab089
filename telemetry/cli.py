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


class CommandParser(Parser):
    """A subcommand's parser: what it does not know is its own error, naming its own --help.

    argparse hands a subcommand's leftovers back to the top-level parser, which says
    "unrecognized arguments" and points to `telemetry --help`; and a misspelt flag's value is
    taken meanwhile as the next positional (`dashboard --prot 9000 runs/` reads RUN_DIR 9000).
    So a leftover here is refused at once, the unknown flag named (with the nearest real one).
    """

    _args: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self._args = list(args or [])
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self._unknown(extras))
        return namespace, extras

    def error(self, message: str):
        # A misspelt flag comes before what argparse misses because of it ("--dri" leaves
        # "--dir" missing): the misspelling is the error to fix.
        if "arguments are required" in message:
            flags = self._unknown_flags(self._args)
            if flags:
                message = self._unknown(flags)
        super().error(message)

    def _unknown_flags(self, args: list[str]) -> list[str]:
        """The flags in `args` that name no option of this parser (nor start one, as argparse
        takes an abbreviation), up to a "--" (what follows it is a script's own)."""
        known = [o for a in self._actions for o in a.option_strings]
        out = []
        for a in args:
            if a == "--":
                break
            name = a.split("=", 1)[0]
            if name.startswith("-") and name != "-" and not name.lstrip("-").replace(".", "").isdigit() \
                    and not any(k.startswith(name) for k in known):
                out.append(name)
        return out

    def _unknown(self, extras: list[str]) -> str:
        import difflib

        flags = [a for a in extras if a.startswith("-") and a != "-"]
        if not flags:
            return "unexpected argument(s): " + " ".join(extras)
        name = flags[0].split("=", 1)[0]
        known = [o for a in self._actions for o in a.option_strings]
        near = difflib.get_close_matches(name, known, n=1)
        return f"unknown option {name}" + (f" (did you mean {near[0]}?)" if near else "")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = Parser(
        prog="telemetry",
        description="Asynchronous telemetry sidecar for LLM training.",
        epilog="Run 'telemetry COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
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


def version() -> str:
    """The installed package's version; from a source tree that is not installed, its own."""
    from importlib import metadata

    from telemetry import DIST_NAME, __version__

    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return __version__


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
