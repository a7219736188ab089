#!/usr/bin/env bash
# Every GPU check in one device command (the device tool allows 10 minutes a command and 15 minutes
# a session): the gpu-marked tests, then the benchmark's parts in the order that matters most
# when time runs out (nosync, nvml, overhead, mfu; GPU_PARTS to choose), cut to fit GPU_BUDGET_S
# (default 560 s). Arguments go to the benchmark (e.g. --variants off,ours --rounds 2).
#
#   bash benchmarks/gpu/all.sh          # on the GPU machine, with .whl/ carried (fetch_wheels.sh)
#
# Writes to $OUT (the device tool brings back at most 8 files): device.txt, build.log, tests.log,
# bench.log, results.json, results.md, logs.tar.gz (each process's log, the daemons' JSONL).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export PYTHONUNBUFFERED=1
OUT="${OUT:-$ROOT/benchmarks/out/gpu}"
BUDGET_S="${GPU_BUDGET_S:-560}"
mkdir -p "$OUT"
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
PY="${PYTHON:-python3}"
{ nvidia-smi; "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__, torch.cuda.get_device_name())"; nproc; } > "$OUT/device.txt" 2>&1
# The C inner loops for this Python (optional: the daemon runs their Python twins without them).
"$PY" setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || echo "C loops not built (Python twins run)" >> "$OUT/build.log"
echo "[all $(elapsed)s] gpu tests" >&2
timeout $(( BUDGET_S / 3 )) bash benchmarks/gpu/run.sh --tests -n 4 --timeout 170 > "$OUT/tests.log" 2>&1
rc=$?   # taken at once: $(elapsed) below would reset $?
echo "[all $(elapsed)s] gpu tests rc=$rc" | tee -a "$OUT/tests.log" >&2
tail -25 "$OUT/tests.log" >&2
left=$(( BUDGET_S - $(elapsed) - 40 ))
BENCH_OUT=/tmp/gpu-bench-out
echo "[all $(elapsed)s] benchmark, $left s left" >&2
timeout "$left" bash benchmarks/gpu/run.sh --parts "${GPU_PARTS:-nosync,nvml,overhead,mfu}" --out "$BENCH_OUT" \
  --deadline-s $(( left - 90 )) "$@" > "$OUT/bench.log" 2>&1
rc=$?
echo "[all $(elapsed)s] benchmark rc=$rc" | tee -a "$OUT/bench.log" >&2
cp "$BENCH_OUT"/results.json "$BENCH_OUT"/results.md "$OUT"/ 2>/dev/null
tar -czf "$OUT/logs.tar.gz" -C "$BENCH_OUT" logs 2>/dev/null
cat "$OUT/results.md" >&2 2>/dev/null || tail -40 "$OUT/bench.log" >&2
