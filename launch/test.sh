#!/usr/bin/env bash
# Set up (a .venv with the project and its dev extras), then run the test suite.
#   launch/test.sh [pytest args...]     e.g. launch/test.sh -k daemon -x
# Two pytest-xdist workers by default: about half of a test's time is a subprocess starting
# (torch, DeepSpeed) or a daemon waiting, so one worker keeps a 2-core machine half idle (689 s
# of tests on two against ~1,100 s on one, 2026-11-26). TELEMETRY_TEST_WORKERS=0 runs them in
# this process, N on N workers; any -n of your own wins.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/launch/setup.sh" --dev
cd "$ROOT"
export WANDB_MODE="${WANDB_MODE:-offline}" WANDB_SILENT=true
workers=(-n "${TELEMETRY_TEST_WORKERS:-2}")
for a in "$@"; do
    case "$a" in -n|-n[0-9]*|--numprocesses|--numprocesses=*|no:xdist) workers=() ;; esac
done
exec "$ROOT/.venv/bin/python" -m pytest "${workers[@]}" "$@"
