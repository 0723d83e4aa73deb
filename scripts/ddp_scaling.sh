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
for cfg in $CONFIGS; do
  for accum in ${ACCUMS:-1}; do
    steps=${STEPS:-60}; every=10
    case $cfg in fast*) steps=${FAST_STEPS:-200}; every=20 ;; esac
    steps=$((steps / accum)); every=$((every / accum))
    for n in ${NPROCS:-1 $N}; do
      name=$cfg-$n; [ "$accum" = 1 ] || name=$cfg-$n-a$accum
      rm -rf "$DATA/run-$name"
      run "${TRAIN_LIMIT:-240}" $PY -m medddpm train --images "$DATA/data/images" --masks "$DATA/data/masks" \
        --model whole-head --config "$cfg" --size "$SIZE" --steps "$steps" --grad-accum "$accum" --log-every $every \
        --save-every 100000 --device cuda --nproc "$n" --out "$DATA/run-$name" --quiet
      cp "$DATA/run-$name/timing.csv" "$OUT/timing-$name.csv" 2>/dev/null
      cp "$DATA/run-$name/log.csv" "$OUT/log-$name.csv" 2>/dev/null
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
