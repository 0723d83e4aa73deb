#!/usr/bin/env bash
# Scaling of the real training loop from 1 to N GPUs (issue 11), on 128³ phantom NIfTIs:
#
#   scripts/ddp_scaling.sh OUT GPU_LABEL [CONFIG...]      (default configs: opt1 fast)
#
# Per config and grad-accum (ACCUMS, default 1): `medddpm train --nproc n` for n in NPROCS (default 1
# and N = every GPU here), micro-batch 1, timed by the loop's own read-backs; then (unless NO_PROFILE
# is set) a torch.profiler run of n ranks for n in PROFILE_NPROCS (default N): the all-reduce time,
# how much of it the backward pass hides, and every rank's step and kernel time. Writes OUT/scaling.csv,
# OUT/profile-<config>-<N>.json, the runs' timing/log CSVs, OUT/commands.log and OUT/log.txt.
# PER_GPU=1 first runs each config's 1-GPU run on every GPU at once (OUT/per_gpu.csv, with gpu_index): a
# step of N ranks waits for the slowest GPU, and the efficiency's 1-GPU row comes from GPU 0 alone.
# NOCOMM=1 adds, after each run of n > 1 ranks, the same run with every gradient all-reduce a no-op
# (scripts/train_without_allreduce.py; OUT/timing-<config>-<n>-nocomm.csv): the loss split into the
# communication and the rest. Every run's GPU clocks go to OUT/clocks-<run>.csv, summed up in OUT/clocks.csv.
# NVLink multicast stays off in every process.
set -uo pipefail
OUT=${1:?usage: ddp_scaling.sh OUT GPU_LABEL [CONFIG...]}; GPU=${2:?GPU label}; shift 2
CONFIGS=${*:-opt1 fast}
PY=${PYTHON:-python3}
SIZE=${SIZE:-128}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
N=$(nvidia-smi -L | wc -l)
DATA=${DATA:-$(mktemp -d)}  # DATA=… reuses the phantoms and runs of an earlier call
mkdir -p "$OUT" "$DATA"
RUN_TAIL=3; source "$(dirname "$0")/_run.sh"
$PY -m medddpm info --json >"$OUT/info.json"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit \
  --format=csv >"$OUT/nvidia-smi.csv"
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
[ -d "$DATA/data/masks" ] || run 120 $PY -m medddpm phantom --out "$DATA/data" --n 8 --size "$SIZE"
train() {  # train OUT NPROC STEPS ACCUM EVERY [nocomm]: one timed training run of $cfg on the phantoms
  rm -rf "$1"
  local args=(train --images "$DATA/data/images" --masks "$DATA/data/masks" --model whole-head --config "$cfg"
    --size "$SIZE" --steps "$3" --grad-accum "$4" --log-every "$5" --save-every 100000 --device cuda --out "$1" --quiet)
  clocks_on "$OUT/clocks-$(basename "$1").csv"
  if [ "${6:-}" = nocomm ]; then
    run "${TRAIN_LIMIT:-240}" $PY -m torch.distributed.run --standalone --nproc-per-node "$2" \
      "$(dirname "$0")/train_without_allreduce.py" "${args[@]}"
  else
    run "${TRAIN_LIMIT:-240}" $PY -m medddpm "${args[@]}" --nproc "$2"
  fi
  clocks_off
}
for cfg in $CONFIGS; do
  if [ -n "${PER_GPU:-}" ]; then  # the same 1-GPU run on every GPU at once
    steps=${STEPS:-60}; case $cfg in fast*) steps=${FAST_STEPS:-200} ;; esac
    for i in $(seq 0 $((N - 1))); do
      CUDA_VISIBLE_DEVICES=$i train "$DATA/gpu$i-$cfg" 1 "$steps" 1 20 &
    done
    wait
    $PY - "$OUT/per_gpu.csv" "$GPU" "$DATA"/gpu*-"$cfg" <<'PYEOF'
import sys
from pathlib import Path
import pandas as pd
from medddpm.core.io import append_csv
from medddpm.core.runtime import env_info
from medddpm.profiling.scaling import table
out, gpu, runs = sys.argv[1], sys.argv[2], [Path(r) for r in sys.argv[3:] if (Path(r) / "timing.csv").is_file()]
if runs:
    rows = pd.concat([table([r], gpu).assign(gpu_index=int(r.name[3:].split("-")[0])) for r in runs], ignore_index=True)
    append_csv(Path(out), rows, env_info())
    print(rows[["gpu_index", "config", "step_ms_median"]].to_string(index=False))
PYEOF
  fi
  for accum in ${ACCUMS:-1}; do
    steps=${STEPS:-60}; every=10
    case $cfg in fast*) steps=${FAST_STEPS:-200}; every=20 ;; esac
    steps=$((steps / accum)); every=$((every / accum))
    for n in ${NPROCS:-1 $N}; do
      name=$cfg-$n; [ "$accum" = 1 ] || name=$cfg-$n-a$accum
      train "$DATA/run-$name" "$n" "$steps" "$accum" "$every"
      cp "$DATA/run-$name/timing.csv" "$OUT/timing-$name.csv" 2>/dev/null
      cp "$DATA/run-$name/log.csv" "$OUT/log-$name.csv" 2>/dev/null
      if [ -n "${NOCOMM:-}" ] && [ "$n" -gt 1 ]; then
        train "$DATA/nocomm-$name" "$n" "$steps" "$accum" "$every" nocomm
        cp "$DATA/nocomm-$name/timing.csv" "$OUT/timing-$name-nocomm.csv" 2>/dev/null
      fi
    done
  done
  [ -n "${NO_PROFILE:-}" ] || for n in ${PROFILE_NPROCS:-$N}; do
    run "${PROFILE_LIMIT:-200}" $PY -m torch.distributed.run --standalone --nproc-per-node "$n" \
      -m medddpm.profiling.scaling profile --images "$DATA/data/images" --masks "$DATA/data/masks" --config "$cfg" \
      --size "$SIZE" --steps 5 --warmup 10 --out "$OUT/profile-$cfg-$n.json"
  done
done
shopt -s nullglob  # no profiles (NO_PROFILE, or none finished): the table without their column
profiles=("$OUT"/profile-*.json)
run 60 $PY -m medddpm.profiling.scaling table "$DATA"/run-* --gpu "$GPU" --profiles "${profiles[@]}" --out "$OUT/scaling.csv"
cat "$OUT/scaling.csv"
clocks=("$OUT"/clocks-*.csv)
[ ${#clocks[@]} = 0 ] || run 60 $PY -m medddpm.profiling.clocks "${clocks[@]}" --out "$OUT/clocks.csv"
