#!/usr/bin/env bash
# The GPU benchmark of issue 10 in one command (benchmarks/gpu/bench.py says what it measures).
#
#   bash benchmarks/gpu/run.sh                 # GPU machine: all four parts, ~8 min on an H100
#   bash benchmarks/gpu/run.sh --cpu-smoke     # here: the same code paths, reduced, on CPU
#   bash benchmarks/gpu/run.sh --parts overhead,mfu     # a subset (each device command: <= 10 min)
#   bash benchmarks/gpu/run.sh --tests [pytest args]    # the gpu-marked tests, in the same environment
#
# Output: $OUT if set (the device tool brings it back), else benchmarks/out/gpu/: results.json,
# results.md (printed at the end, ready for RESULTS.md) and logs/.
#
# Python: .venv/bin/python where this repo's venv exists, else python3. Packages the GPU image
# lacks (deepspeed, pyzmq, msgspec, wandb and wandb's deps) come from .whl/ (fill it with
# benchmarks/gpu/fetch_wheels.sh where PyPI is reachable): installed with --no-deps into
# /tmp/site and put first on PYTHONPATH. If DeepSpeed will not import, its sdist is built there;
# if that fails too, the benchmark runs on plain torch and says so.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi

have() { "$PY" -c "import $1" >/dev/null 2>&1; }

if [ -d .whl ] && ! { have zmq && have msgspec && have wandb; }; then
  SITE=/tmp/site
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  if ! { have zmq && have msgspec && have wandb; }; then   # not installed there by an earlier call
    echo "gpu-bench: installing $(ls .whl/*.whl | wc -l) wheels from .whl/ into $SITE" >&2
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
  fi
  if ! have deepspeed && ls .whl/sdist/deepspeed-*.tar.gz >/dev/null 2>&1; then
    echo "gpu-bench: building DeepSpeed from its sdist (no ops compiled)" >&2
    DS_BUILD_OPS=0 timeout 300 "$PY" -m pip install -q --no-index --no-build-isolation --no-deps --no-compile \
      --target "$SITE" .whl/sdist/deepspeed-*.tar.gz || echo "gpu-bench: DeepSpeed build failed" >&2
  fi
fi
export PYTHONPATH="${PYTHONPATH:-$ROOT}"
have deepspeed || echo "gpu-bench: DeepSpeed does not import here: the plain torch engine runs" >&2
for m in zmq msgspec; do
  have "$m" || { echo "gpu-bench: python module $m is missing (run benchmarks/gpu/fetch_wheels.sh)" >&2; exit 2; }
done
have wandb || echo "gpu-bench: wandb does not import: the seed variant and the daemon's W&B sink will fail" >&2

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit \
  --format=csv,noheader >&2 || true
if [ "${1:-}" = "--tests" ]; then
  shift
  exec "$PY" -m pytest -m gpu -p no:cacheprovider -rA tests/test_gpu_nosync.py tests/test_gpu_nvml.py \
    tests/test_client.py tests/test_trainer_causal.py "$@"
fi
export GPU_BENCH_COMMAND="bash benchmarks/gpu/run.sh $*"
exec "$PY" -m benchmarks.gpu.bench "$@"
