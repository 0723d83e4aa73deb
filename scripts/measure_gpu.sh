#!/usr/bin/env bash
# End-to-end measurements on the local GPU: environment, step timings (bench.csv) and
# torch.profiler kernel tables for every configuration, into OUT (default data/results/<gpu-slug>).
# Usage: scripts/measure_gpu.sh [OUT] [SIZE]   (CONFIGS=… to choose configurations)
set -euo pipefail
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
args=(--size "${2:-128}")
[ -n "${CONFIGS:-}" ] && args+=(--configs "$CONFIGS")   # default: every configuration
[ -n "${1:-}" ] && args+=(--out "$1")
exec "$PY" -m medddpm.report.measure "${args[@]}"
