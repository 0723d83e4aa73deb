#!/usr/bin/env bash
# End-to-end measurements on the local GPU: environment, step timings (bench.csv) and
# torch.profiler kernel tables for every configuration, into OUT (default data/results/<gpu-slug>).
# Usage: scripts/measure_gpu.sh [OUT] [SIZE]
set -euo pipefail
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
SIZE=${2:-128}
CONFIGS=${CONFIGS:-baseline,opt1,opt2,opt12,pytorch-default}
slug=$($PY -c 'from medddpm.runtime import env_info; print(env_info()["gpu_slug"])')
OUT=${1:-data/results/$slug}
mkdir -p "$OUT"
$PY -m medddpm info --json > "$OUT/info.json"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,pcie.link.gen.max \
  --format=csv > "$OUT/nvidia-smi.csv" 2>/dev/null || true
$PY -m medddpm bench --model whole-head --size "$SIZE" --config "$CONFIGS" --steps 10 --warmup 3 \
  --out "$OUT/bench.csv"
$PY -m medddpm torch-kernels --model whole-head --size "$SIZE" --configs "$CONFIGS" --out "$OUT"
