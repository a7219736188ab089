#!/usr/bin/env bash
# Set up (a .venv with the project and its dev extras), then run the test suite.
#   launch/test.sh [pytest args...]     e.g. launch/test.sh -k daemon -x
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/launch/setup.sh" --dev
cd "$ROOT"
export WANDB_MODE="${WANDB_MODE:-offline}" WANDB_SILENT=true
exec "$ROOT/.venv/bin/python" -m pytest "$@"
