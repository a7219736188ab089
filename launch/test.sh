#!/usr/bin/env bash
# Set up (a .venv with the project and its dev extras), then run the test suite.
#   launch/test.sh [pytest args...]     e.g. launch/test.sh -k daemon -x
# Three pytest-xdist workers by default: much of a test's time is a daemon or a rank waiting (a
# 60 s head outage, a silence limit, a hang detector), so fewer workers leave a 2-core machine
# partly idle (the whole suite in place, quiet, 2026-11-27: 763 s of tests on two workers, 675 s
# on three; ~1,100 s on one). Four keep both CPUs 97-100 % busy and were no faster where it
# counts (2026-11-28, 8117856): a fresh clone, quiet, 821 + 53 s of tests (three, the evening
# before: 783 + 58, 776 + 60), and beside a CPU hog 976 + 54 s (three: 831-897 + 44-50); one
# in-place run on four took 684 s, the next 812. The tests run in file order, which mixes the
# CPU-bound ones (a trainer launch) with the waiting ones; the slow ones first made it slower (a
# fresh clone, quiet: 893 s of tests), as the trainer launches then all ran at once.
# TELEMETRY_TEST_WORKERS=0 runs them in this process, N on N workers; any -n of your own wins.
# Tests marked `alone` (a balanced run beside a CPU hog it starts raises no alarm) judge timings
# against a load they set: beside the other workers' trainer launches coming and going, the run's
# throughput really drops (CI, stop 37), so they run after the rest, one at a time. With a -m, -k,
# a path or a -n of your own, everything runs in one go.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/launch/setup.sh" --dev
cd "$ROOT"
export WANDB_MODE="${WANDB_MODE:-offline}" WANDB_SILENT=true
# Compiled code is cached (__pycache__, git-ignored) even where the environment says not to
# (PYTHONDONTWRITEBYTECODE=1 on the development machine): otherwise each pytest worker rewrites
# every test module's asserts again (3-4 s of CPU each) and each daemon, rank and script
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
