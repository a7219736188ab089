"""The `telemetry` command line (also `python -m telemetry`).

Each subcommand lives in its own module, imported only when that subcommand runs, so
`telemetry status` never pays for importing the daemon's sinks (or wandb). A module provides
`add_arguments(parser)` and `run(args) -> int` (the exit code), and a module docstring whose
first line is the subcommand's one-line help.
"""
from __future__ import annotations

import argparse
import importlib
import io
import os
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

    def _print_message(self, message: str, file=None) -> None:
        # argparse drops a failed write (--help, --version, usage) and exits 0, so that
        # `telemetry --help > /dev/full` passed for a success: a failed write to stdout goes on
        # to main(), which says it as for every other command. Any other file: as argparse does.
        if not message:
            return
        try:
            (file or sys.stderr).write(message)
        except OSError as exc:
            if getattr(exc, _ON_STDOUT, False):
                raise
        except AttributeError:      # no stderr at all (pythonw, `2>&-`)
            pass


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


# The exit code when the reader of stdout left (`telemetry status | head -1`): a shell's for a
# process that SIGPIPE ended (128 + 13), as `cat` or `grep` give there, so that a `pipefail`
# script that lets 141 pass treats us as it treats them, and tells it from a failure (1).
EXIT_READER_LEFT = 141


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; its exit code. Its output is flushed here, where a failed write can
    still be said: a reader of stdout that left ends the command quietly (EXIT_READER_LEFT), a
    stdout that cannot be written (a full disk, /dev/full) is one line on stderr and exit 1;
    neither is a traceback, nor Python's "Exception ignored" at its own flush at exit."""
    argv = sys.argv[1:] if argv is None else argv
    restore = _mark_stdout_errors()
    try:
        try:
            args = build_parser(argv).parse_args(argv)
            rc = int(args._run(args) or 0)
        except KeyboardInterrupt:
            rc = 130
        except SystemExit:      # argparse's --help and refusals: their text is flushed here too
            _flush_stdout()
            raise
        _flush_stdout()
        return rc
    except OSError as exc:
        if not getattr(exc, _ON_STDOUT, False):
            raise
        # What is still buffered goes nowhere: the interpreter's flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        if isinstance(exc, BrokenPipeError):
            return EXIT_READER_LEFT
        command = next((a for a in argv if a in COMMANDS), None)
        try:
            print(f"telemetry{' ' + command if command else ''}: cannot write stdout: {exc.strerror or exc}",
                  file=sys.stderr)
        except OSError:     # stderr is gone as well: the exit code says it
            pass
        return 1
    finally:
        restore()


# The attribute an OSError raised by a write to stdout carries (see _mark_stdout_errors).
_ON_STDOUT = "telemetry_on_stdout"


def _flush_stdout() -> None:
    if sys.stdout is not None:      # None: started with stdout closed (`>&-`); print writes nothing
        sys.stdout.flush()


def _mark_stdout_errors():
    """Make a failed write to the process's stdout (fd 1) tell itself apart from any other
    file's error: the OSError raised carries the _ON_STDOUT attribute. Every write to stdout,
    print's, a Rich console's, the final flush's, ends in its raw file's write(), buffered or
    not (PYTHONUNBUFFERED), so that is where it is marked. Returns what undoes it. A stdout
    that is not the process's fd 1 (a test's StringIO) is left as it is."""
    raw = getattr(sys.stdout, "buffer", None)
    raw = getattr(raw, "raw", raw)
    try:
        ours = isinstance(raw, io.FileIO) and raw.fileno() == 1
    except (OSError, ValueError):
        ours = False
    if not ours:
        return lambda: None
    write = raw.write

    def marked_write(data):
        try:
            return write(data)
        except OSError as exc:
            setattr(exc, _ON_STDOUT, True)
            raise

    raw.write = marked_write

    def restore() -> None:
        if raw.__dict__.get("write") is marked_write:
            del raw.write
    return restore


if __name__ == "__main__":
    sys.exit(main())
