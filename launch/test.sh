#!/usr/bin/env bash
# Set up (a .venv with the project and its dev extras), then run the test suite.
#   launch/test.sh [pytest args...]     e.g. launch/test.sh -k daemon -x
# The suite runs on TELEMETRY_TEST_WORKERS pytest-xdist workers (default 2): about half of a
# test's time is a subprocess starting (torch, DeepSpeed) or a daemon waiting, so two workers
# keep a 2-core machine busy. `-n 0` (or any -n of your own) runs it as you say.
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
