#!/usr/bin/env bash
# Set up (a .venv with the project and its dev extras), then run the test suite.
#   launch/test.sh [pytest args...]     e.g. launch/test.sh -k daemon -x
# Three pytest-xdist workers by default: much of a test's time is a daemon or a rank waiting, so
# fewer leave the cores idle, and more were no faster (benchmarks/RESULTS.md, "The test suite").
# TELEMETRY_TEST_WORKERS=0 runs them in this process, N on N workers; any -n of your own wins.
# Tests marked `alone` judge timings against a load they set (a CPU hog they start), which the
# other workers' trainer launches would change: they run after the rest, one at a time. With a
# -m, -k, a path or a -n of your own, everything runs in one go.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/launch/setup.sh" --dev
cd "$ROOT"
export WANDB_MODE="${WANDB_MODE:-offline}" WANDB_SILENT=true
# Compiled code is cached (__pycache__, git-ignored) even where the environment says not to
# (PYTHONDONTWRITEBYTECODE=1 on the development machine): otherwise each pytest worker rewrites
# every test module's asserts again and each daemon, rank and script
# process the tests start compiles the project's modules again.
unset PYTHONDONTWRITEBYTECODE
workers=(-n "${TELEMETRY_TEST_WORKERS:-3}")
split=1
for a in "$@"; do
    case "$a" in -n|-n[0-9]*|--numprocesses|--numprocesses=*|no:xdist) workers=(); split=0 ;; esac
done
for a in "$@"; do
    case "$a" in -m|-m*|-k|-k*|--deselect*) split=0 ;; -*) ;; *) [ ! -e "${a%%::*}" ] || split=0 ;; esac
done
if [ "$split" = 0 ]; then
    exec "$ROOT/.venv/bin/python" -m pytest "${workers[@]}" "$@"
fi
rc=0
"$ROOT/.venv/bin/python" -m pytest "${workers[@]}" -m "not alone" "$@" || rc=$?
echo "== the tests marked alone, one at a time =="
# Only the files that mark tests alone are collected again (collecting all of them: ~5 s).
mapfile -t alone < <(grep -l "mark\.alone" tests/test_*.py || true)
[ "${#alone[@]}" = 0 ] || "$ROOT/.venv/bin/python" -m pytest -p no:xdist -m alone "$@" "${alone[@]}" \
    || { r=$?; [ "$rc" != 0 ] || rc=$r; }
exit "$rc"
