#!/usr/bin/env bash
# Fetch the packages the GPU image lacks into .whl/ (git-ignored), for benchmarks/gpu/run.sh.
#
#   bash benchmarks/gpu/fetch_wheels.sh        # run here, where PyPI is reachable
#
# The GPU machine has python3 3.12, torch, transformers, nvidia-ml-py, psutil, pyyaml, rich,
# matplotlib, prometheus-client, click and protobuf, but no network: deepspeed, pyzmq, msgspec,
# wandb and wandb's own dependencies travel as wheels (pinned to what this repo's venv runs).
# DeepSpeed is published as an sdist only; it is pure Python when no ops are prebuilt
# (DS_BUILD_OPS=0), so it is built into a py3-none-any wheel here, and the sdist is kept in
# .whl/sdist/ for run.sh to build there if that wheel will not import.
# The device tool carries at most 64 MiB: the total is checked at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
DEST="$ROOT/.whl"
MAX_MIB=60
mkdir -p "$DEST/sdist"

# What the image lacks: our three, wandb's closure (Requires-Dist of wandb 0.31.0, pydantic,
# requests, opentelemetry-exporter-otlp-proto-http), deepspeed's small deps. Checked with
#   unzip -p .whl/wandb-*.whl '*/METADATA' | grep ^Requires-Dist
PINS=(
  pyzmq==27.3.0 msgspec==0.22.0 wandb==0.31.0
  pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0 platformdirs==4.14.7 xxhash==4.1.0 cwevals==0.0.1b1
  requests==2.34.2 urllib3==2.8.0 idna==3.20 certifi==2026.10.18 charset-normalizer==3.5.2
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2
  opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-proto==1.45.2 opentelemetry-exporter-http-transport==0.66b2
  opentelemetry-exporter-otlp-common==0.66b2 googleapis-common-protos==1.76.0
  httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 anyio==4.16.0 sniffio==1.3.1 distro==1.9.0
  hjson==3.1.0 ninja==1.13.2 einops==0.8.2 py-cpuinfo==9.0.0 msgpack==1.2.4
)
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
for pin in "${PINS[@]}"; do
  "$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$DEST" "$pin" 2>&1 | grep -v "^WARNING: Location" || true
  name="${pin%%==*}"
  ls "$DEST" | grep -qi "^$(echo "${name}" | tr '-' '_')-" || { echo "fetch_wheels: $pin not downloaded" >&2; exit 1; }
done

# DeepSpeed: the sdist, and a pure-Python wheel built from it without any op compiled.
DS=deepspeed==0.19.8
if ! ls "$DEST"/deepspeed-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$DEST/sdist" "$DS" 2>&1 | grep -v "^WARNING: Location" || true
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$DEST"/sdist/deepspeed-*.tar.gz \
    2>&1 | grep -v "^WARNING: Location" | tail -3 || true
fi
ls "$DEST"/deepspeed-*-py3-none-any.whl >/dev/null 2>&1 || echo "fetch_wheels: no deepspeed wheel built; run.sh will try the sdist" >&2

total_kib=$(du -sk "$DEST" | cut -f1)
echo "fetch_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $(ls "$DEST"/sdist | wc -l) sdist(s), $((total_kib / 1024)) MiB in $DEST"
if [ "$total_kib" -gt $((MAX_MIB * 1024)) ]; then
  echo "fetch_wheels: more than $MAX_MIB MiB: the device tool carries at most 64 MiB" >&2
  exit 1
fi
