"""The metric catalogue: every built-in metric's unit, kind, rules and meaning, and your own.

    telemetry metrics                          the built-in metrics, a plain table
    telemetry metrics --config daemon.yaml     ... with the metrics that config declares (`metrics:`)
    telemetry metrics --markdown               as docs/metrics.md's table

How a metric combines across the ranks of a step and over a sink's downsampling window comes
from here (telemetry/shared/catalogue.py); a name in neither is the mean in both.
"""
from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    from telemetry.shared.config import nonempty_arg

    p.add_argument("--config", type=nonempty_arg, metavar="FILE",
                   help="a daemon YAML config: its `metrics:` declarations are listed too")
    p.add_argument("--markdown", action="store_true", help="a Markdown table (docs/metrics.md's)")


def run(args: argparse.Namespace) -> int:
    from telemetry.shared import catalogue

    metrics = catalogue.CATALOGUE
    if args.config is not None:
        from telemetry.daemon.config import ConfigError, load

        try:
            metrics = metrics + load(args.config, {}).declared_metrics()
        except ConfigError as exc:
            print(f"telemetry metrics: {exc}", file=sys.stderr)
            return 2
    if args.markdown:
        sys.stdout.write(catalogue.markdown_table(metrics))
        return 0
    width = max(len(m.name) for m in metrics)
    print(f"{'name':<{width}}  {'unit':<9}  {'kind':<7}  {'across ranks':<20}  {'over a window':<13}  what it is")
    for m in metrics:
        reduced = m.source in catalogue.REDUCED      # polled series and the daemon's counters: not reduced
        print(f"{m.name:<{width}}  {m.unit or '-':<9}  {m.kind:<7}  {m.across_ranks if reduced else '-':<20}  "
              f"{m.over_window if reduced else '-':<13}  {m.doc}{'' if m.group != 'custom' else '  (declared)'}")
    return 0
