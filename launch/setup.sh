#!/usr/bin/env bash
# Shared set-up for run.sh and test.sh: a .venv with this project installed.
#   launch/setup.sh [--dev]
# Idempotent: a second call with nothing changed costs one pip "already satisfied" pass.
# torch: a machine that already has one (a GPU box with a CUDA build) keeps it, through
# --system-site-packages; otherwise we pin the CPU build, because an unpinned torch pulls a
# multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TELEMETRY_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_CPU_PIN="torch==2.13.0"
extras=""
[[ "${1:-}" == "--dev" ]] && extras="[dev]"

log() { printf '[setup] %s\n' "$*" >&2; }

if [[ ! -x "$VENV/bin/python" ]]; then
    if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
        log "creating $VENV (reusing the system's torch $("$PYTHON" -c 'import torch; print(torch.__version__)'))"
        "$PYTHON" -m venv --system-site-packages "$VENV"
    else
        log "creating $VENV"
        "$PYTHON" -m venv "$VENV"
    fi
fi
# VictoriaMetrics with its OTLP receiver (1.92 and later) for the OTLP sink's end-to-end test, which
# skips, saying why, where it is absent. The system's own package when it is new enough (Debian 13);
# otherwise (Debian 12 has 1.79, without the receiver) Debian 13's package is fetched from Debian's
# archive through a private sources list (the system's apt configuration is left as it is) and only
# its binary is unpacked into /usr/local/bin: installing the package itself would pull Debian 13's
# libzstd1 into the system, which the binary does not need (it runs on Debian 12's). Each network
# step is bounded by a timeout; any failure is a warning, never fatal.
VM_MIN="1.92"
vm_has_otlp() { [[ "$(victoria-metrics -help 2>&1)" == *-opentelemetry.usePrometheusNaming* ]]; }
install_victoria_metrics() {
    command -v victoria-metrics >/dev/null 2>&1 && vm_has_otlp && return 0
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        log "warning: VictoriaMetrics >= $VM_MIN not installed (needs root and apt-get); its OTLP test will skip"
        return 0
    fi
    local cand
    cand="$(apt-cache policy victoria-metrics 2>/dev/null | awk '/Candidate:/ {print $2}')"
    if [[ -n "$cand" && "$cand" != "(none)" ]] && dpkg --compare-versions "$cand" ge "$VM_MIN"; then
        log "installing victoria-metrics $cand with apt-get (the OTLP sink's end-to-end test)"
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q victoria-metrics >/dev/null 2>&1 || true
    else
        log "fetching victoria-metrics from Debian 13's archive (the OTLP sink's end-to-end test)"
        local tmp apt_opts
        tmp="$(mktemp -d)"
        mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
        printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" "Suites: trixie" "Components: main" \
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" >"$tmp/trixie.sources"
        apt_opts=(-q -o "Dir::Etc::SourceList=$tmp/trixie.sources" -o Dir::Etc::SourceParts=/nonexistent
                  -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o Acquire::Retries=0
                  -o Acquire::http::Timeout=20 -o APT::Sandbox::User=root)
        if timeout 120 apt-get "${apt_opts[@]}" update >/dev/null 2>&1 \
           && (cd "$tmp" && timeout 300 apt-get "${apt_opts[@]}" download victoria-metrics >/dev/null 2>&1) \
           && dpkg-deb --fsys-tarfile "$tmp"/victoria-metrics_*.deb | tar -x -C "$tmp" ./usr/bin/victoria-metrics \
           && "$tmp/usr/bin/victoria-metrics" -help >/dev/null 2>&1; then
            install -m 755 "$tmp/usr/bin/victoria-metrics" /usr/local/bin/victoria-metrics
        fi
        rm -rf "$tmp"
    fi
    hash -r
    command -v victoria-metrics >/dev/null 2>&1 && vm_has_otlp \
        || log "warning: could not install VictoriaMetrics >= $VM_MIN; the OTLP sink's end-to-end test will skip"
}
# The dev set-up's system tools: Chromium for the dashboard's browser test, Prometheus for the
# exporter's test (both tests skip, saying why, where these are absent). Installed with apt when
# we are root on a Debian-like system; a failure here is a warning, never fatal.
if [[ -n "$extras" ]]; then
    missing=()
    command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
    command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
    if (( ${#missing[@]} )); then
        if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            log "installing ${missing[*]} with apt-get (the dashboard's browser test, the Prometheus test)"
            if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
                   || { apt-get update -q >/dev/null 2>&1 \
                        && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; }; }; then
                log "warning: apt-get could not install ${missing[*]}; the tests that need them will skip"
            fi
        else
            log "warning: ${missing[*]} not installed (needs root and apt-get);" \
                "the tests that need them will skip: apt-get install ${missing[*]}"
        fi
    fi
    install_victoria_metrics
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# Our packages compiled to bytecode, as pip compiles a package it installs (an editable install
# is not): a process started with PYTHONDONTWRITEBYTECODE set would otherwise compile every module
# of ours it imports, at every start (tens of milliseconds of a client's start-up). Only what
# changed since is compiled again.
"$VENV/bin/python" -m compileall -q "$ROOT/protocol" "$ROOT/telemetry" "$ROOT/trainer" "$ROOT/testkit" >/dev/null \
    || log "warning: not every module compiled to bytecode; those are compiled at each import"
stamp="$VENV/.installed$extras"
# Re-install only when the project's dependency list, its C part (built in place by the
# editable install) or this set-up changed since the last set-up (a set-up with the dev extras
# also serves one without).
for s in "$stamp" "$VENV/.installed[dev]"; do
    if [[ -f "$s" && "$s" -nt "$ROOT/pyproject.toml" && "$s" -nt "$ROOT/setup.py"
          && "$s" -nt "$ROOT/telemetry/daemon/_hotpath.c" && "$s" -nt "$ROOT/protocol/_pack.c"
          && "$s" -nt "$ROOT/launch/setup.sh" ]]; then
        exit 0
    fi
done
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    log "installing $TORCH_CPU_PIN (CPU build)"
    "${PIP[@]}" install "$TORCH_CPU_PIN"
fi
"${PIP[@]}" install "setuptools>=68" wheel
if ! "$VENV/bin/python" -c "import deepspeed" >/dev/null 2>&1; then
    # DeepSpeed ships only an sdist whose setup imports torch: build it against the torch above
    # (build isolation would fetch a second, CUDA torch). No ops are pre-built (JIT on use).
    log "installing deepspeed (sdist, built against the installed torch)"
    DS_BUILD_OPS=0 "${PIP[@]}" install --no-build-isolation "deepspeed>=0.15"
fi
log "installing the project${extras}"
# compat: the checkout's root goes on sys.path (a .pth line), not behind an import hook, so a
# directory named like one of our packages in a user's working directory (the default run
# directory ./telemetry/<id>, a trainer/ of theirs) is never imported in its place.
"${PIP[@]}" install -e "$ROOT$extras" --config-settings editable_mode=compat
loops="$(env -u TELEMETRY_PURE_PYTHON "$VENV/bin/python" -c 'from telemetry.daemon import hotpath; print(hotpath.name())')"
if [[ "$loops" != c ]]; then
    log "warning: the daemon's C inner loops were not built (no C compiler?);" \
        "it runs the pure-Python ones (same results, 60-70 % of the ingest rate)"
fi
if ! env -u TELEMETRY_PURE_PYTHON "$VENV/bin/python" -c 'import protocol._pack' >/dev/null 2>&1; then
    log "warning: the client's C encode was not built (no C compiler?); it encodes with msgpack" \
        "(the same bytes, more of the caller's time a record)"
fi
touch "$stamp"
log "ready: $VENV"
