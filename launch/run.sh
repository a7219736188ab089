#!/usr/bin/env bash
# Train with the telemetry sidecar: check the arguments and the trainer config, set up (first use),
# then `telemetry run` our trainer: it starts the daemon, runs the trainer on N ranks, streams the
# daemon's log, drains the daemon and prints a summary. Exits with the trainer's exit code.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
    cat <<USAGE
usage: launch/run.sh [--config FILE] [--nproc N] [--steps N] [--run-dir DIR] [--attach tail|dashboard]
                     [--launcher torchrun|deepspeed] [--wandb disabled|offline|online]
                     [--daemon-config FILE] [-- key=value ...]

  --config FILE     trainer config (default launch/configs/tiny.yaml)
  --nproc N         ranks on this node, 1..1024 (default 1)
  --steps N         optimizer steps (default: the config's)
  --run-dir DIR     where everything goes (default runs/<run-name>; made and checked writable
                    before anything starts): DIR/telemetry/ holds
                    metrics.jsonl and the daemon log, DIR/checkpoints/ the checkpoints
  --attach tail     open the live view beside the training (a tmux pane inside tmux,
                    else DIR/telemetry/tail.log, followed with: tail -f)
  --attach dashboard  serve the live dashboard on http://127.0.0.1:\$TELEMETRY_DASHBOARD_PORT
                    (default 8765; its output in DIR/telemetry/dashboard.log); it stays up after
                    the training until Ctrl-C when stdin is a terminal
  --launcher L      torchrun (default) or deepspeed
  --wandb MODE      W&B mode for the daemon (default offline; no network is needed)
  --daemon-config F daemon YAML config (see docs/config.md)
  -- key=value ...  extra trainer overrides, e.g. -- optim.lr=1e-3 log_every=5
USAGE
}

# The most ranks one node may be asked for: beyond it, a typo (10^30 would allocate until the
# OOM killer fires), and bash arithmetic wraps past 19 digits.
MAX_NPROC=1024
MAX_STEPS=1000000000000
need_value() {   # $1 the option, $2 the number of arguments left, $3 the value: "--nproc" last is an error, not "unbound variable"
    [[ "$2" -ge 2 && -n "$3" ]] || { echo "run.sh: $1 needs a value" >&2; exit 2; }
}
CONFIG="$ROOT/launch/configs/tiny.yaml"; NPROC=1; STEPS=""; RUN_DIR=""; ATTACH=""; LAUNCHER=torchrun
WANDB_MODE_ARG="${TELEMETRY_WANDB:-offline}"; DAEMON_CONFIG=""; EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --config) need_value "$1" $# "${2:-}"; CONFIG="$2"; shift 2 ;;
        --nproc) need_value "$1" $# "${2:-}"; NPROC="$2"; shift 2 ;;
        --steps) need_value "$1" $# "${2:-}"; STEPS="$2"; shift 2 ;;
        --run-dir) need_value "$1" $# "${2:-}"; RUN_DIR="$2"; shift 2 ;;
        --attach) need_value "$1" $# "${2:-}"; ATTACH="$2"; shift 2 ;;
        --launcher) need_value "$1" $# "${2:-}"; LAUNCHER="$2"; shift 2 ;;
        --wandb) need_value "$1" $# "${2:-}"; WANDB_MODE_ARG="$2"; shift 2 ;;
        --daemon-config) need_value "$1" $# "${2:-}"; DAEMON_CONFIG="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) echo "run.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
[[ "$NPROC" =~ ^[1-9][0-9]{0,3}$ ]] && (( NPROC <= MAX_NPROC )) \
    || { echo "run.sh: --nproc must be an integer from 1 to $MAX_NPROC, got '${NPROC:0:40}'" >&2; exit 2; }
[[ -z "$STEPS" || ( "$STEPS" =~ ^[1-9][0-9]{0,12}$ && "$STEPS" -le "$MAX_STEPS" ) ]] \
    || { echo "run.sh: --steps must be an integer from 1 to $MAX_STEPS, got '${STEPS:0:40}'" >&2; exit 2; }
[[ -z "$ATTACH" || "$ATTACH" == tail || "$ATTACH" == dashboard ]] \
    || { echo "run.sh: --attach takes 'tail' or 'dashboard', got '$ATTACH'" >&2; exit 2; }
DASHBOARD_PORT="${TELEMETRY_DASHBOARD_PORT:-8765}"
[[ "$DASHBOARD_PORT" =~ ^[0-9]+$ ]] || { echo "run.sh: TELEMETRY_DASHBOARD_PORT must be a port number" >&2; exit 2; }
[[ "$LAUNCHER" == torchrun || "$LAUNCHER" == deepspeed ]] || { echo "run.sh: --launcher: torchrun or deepspeed" >&2; exit 2; }
[[ -f "$CONFIG" ]] || { echo "run.sh: config not found: $CONFIG" >&2; exit 2; }
[[ -z "$DAEMON_CONFIG" || -f "$DAEMON_CONFIG" ]] || { echo "run.sh: --daemon-config: not a file: $DAEMON_CONFIG" >&2; exit 2; }
[[ "$WANDB_MODE_ARG" == disabled || "$WANDB_MODE_ARG" == offline || "$WANDB_MODE_ARG" == online ]] \
    || { echo "run.sh: --wandb takes disabled, offline or online, got '$WANDB_MODE_ARG'" >&2; exit 2; }
# A run dir that cannot be made or written (/proc/x, a path under a file) would leave the daemon
# without its files and the training without checkpoints: refuse it now, before any set-up.
if [[ -n "$RUN_DIR" ]]; then
    probe=""
    mkdir -p "$RUN_DIR/telemetry" 2>/dev/null && probe="$(mktemp "$RUN_DIR/telemetry/.write-test.XXXXXX" 2>/dev/null)" \
        || { echo "run.sh: --run-dir $RUN_DIR: cannot create or write $RUN_DIR/telemetry" >&2; exit 2; }
    rm -f "$probe"
fi

"$ROOT/launch/setup.sh" || { echo "run.sh: set-up failed" >&2; exit 1; }
PY="$ROOT/.venv/bin/python"

# Check the trainer config here, before any daemon or launcher starts: torchrun would report a
# config error (exit 2) as a failed worker (exit 1), and after a traceback of its own.
config_overrides=()
[[ -n "$STEPS" ]] && config_overrides+=("steps=$STEPS")
config_overrides+=("${EXTRA[@]}")
"$PY" -m trainer.train --check-config --config "$CONFIG" "${config_overrides[@]}" || exit $?

RUN_NAME="$(basename "${RUN_DIR:-$(basename "$CONFIG" .yaml)-$(date +%Y%m%d-%H%M%S)}")"
RUN_DIR="${RUN_DIR:-$ROOT/runs/$RUN_NAME}"
mkdir -p "$RUN_DIR/telemetry"
# Private before anything is written there (daemon.out below); the daemon keeps it so (0700, or
# 0750 with its config's files.group_readable).
chmod go-rwx "$RUN_DIR/telemetry" 2>/dev/null
RUN_DIR="$(cd "$RUN_DIR" && pwd)"
TEL_DIR="$RUN_DIR/telemetry"
# The rest is `telemetry run` (one path for our trainer and any script): the daemon and its ready
# line, the ranks (trainer.launch: the first failed rank's exit code), the daemon's log streamed,
# the live view (--attach), the drain (drain.json), the summary, the trainer's exit code.
echo "[run.sh] run $RUN_NAME: telemetry in $TEL_DIR, checkpoints in $RUN_DIR/checkpoints"
run_args=(--nproc "$NPROC" --world-size "$NPROC" --run-dir "$TEL_DIR" --run-name "$RUN_NAME"
          --wandb "$WANDB_MODE_ARG" --launcher "$LAUNCHER")
[[ -n "$DAEMON_CONFIG" ]] && run_args+=(--daemon-config "$DAEMON_CONFIG")
[[ -n "$ATTACH" ]] && run_args+=(--attach "$ATTACH")
overrides=("run_dir=$RUN_DIR" "run_name=$RUN_NAME")
[[ -n "$STEPS" ]] && overrides+=("steps=$STEPS")
overrides+=("${EXTRA[@]}")
export TELEMETRY_DASHBOARD_PORT="$DASHBOARD_PORT"
exec "$PY" -m telemetry run "${run_args[@]}" -- -m trainer.train --config "$CONFIG" "${overrides[@]}"
