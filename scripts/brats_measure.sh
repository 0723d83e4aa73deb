#!/usr/bin/env bash
# The paper's second workload on one GPU: the brats preset (192 × 192 × 144, 4 modalities), into
# OUT/brats/. Usage: scripts/brats_measure.sh OUT WORK STAGE...  Stages: env · bench (bench.csv:
# fast, opt1, then the FP32 baseline, batch 1) · sample (sample_bench.csv: the recommended sampler
# under fast, per subject with all 4 modalities) · demo (MAPS, the MNI152 tissue maps saved by
# scripts/probes/brats_demo_maps.py, → N BraTS-shaped subjects in WORK/root) · train (`medddpm train
# --data WORK/root --model brats --size FIG_SIZE --config fast --held-out 2` for TRAIN_S seconds) ·
# (TRAIN_ARGS: more train options) · fig1 (the held-out subjects sampled by the recommended sampler, their slices → fig1_slices.parquet,
# the run's log and held-out CSVs beside it). Logs: OUT/brats/log.txt, commands.log.
set -uo pipefail
ROOT_OUT=${1:?usage: brats_measure.sh OUT WORK STAGE...}; WORK=${2:?}; shift 2
OUT=$ROOT_OUT/brats
PY=${PYTHON:-python3}
M="$PY -m medddpm"
FIG_SIZE=${FIG_SIZE:-96 96 72}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
RUN_TAIL=3; source "$(dirname "$0")/_run.sh"

for stage in "$@"; do
  case $stage in
    env)
      $M info --json >"$OUT/info.json"
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit \
        --format=csv >"$OUT/nvidia-smi.csv" ;;
    bench)
      run 300 $M bench --model brats --config fast,opt1 --steps 20 --warmup 5 --device cuda --out "$OUT/bench.csv"
      run "${BASELINE_S:-150}" $M bench --model brats --config baseline --steps 5 --warmup 2 --device cuda \
        --out "$OUT/bench.csv" ;;
    sample)
      run 240 $M bench-sample --model brats --config fast --sampler dpm2m-sde --steps 12 --spacing logsnr \
        --repeats 5 --device cuda --out "$OUT/sample_bench.csv" ;;
    demo) run 120 $PY scripts/probes/brats_demo_maps.py write "${MAPS:?}" "$WORK/root" "${N:-8}" ;;
    train)
      # shellcheck disable=SC2086
      run $((${TRAIN_S:-300} + 120)) $M train --data "$WORK/root" --model brats --size $FIG_SIZE --config fast \
        --held-out 2 --eval-every "${EVAL_EVERY:-1000}" --steps 100000 --time-limit "${TRAIN_S:-300}" --out "$WORK/run" \
        --quiet ${TRAIN_ARGS:-}
      for f in log heldout timing; do cp "$WORK/run/$f.csv" "$OUT/fig1_run_$f.csv" 2>/dev/null; done ;;
    fig1)
      mkdir -p "$WORK/held"
      for s in $(ls "$WORK/root" | sort | tail -2); do ln -sfn "$(cd "$WORK/root/$s" && pwd)" "$WORK/held/$s"; done
      ckpt=$WORK/run/best.pt; [ -f "$ckpt" ] || ckpt=$WORK/run/checkpoint.pt
      rm -rf "$WORK/samples"
      run 240 $M sample --checkpoint "$ckpt" --masks "$WORK/held" --out "$WORK/samples" --sampler dpm2m-sde --quiet --device cuda
      run 120 $PY -c "import sys; from medddpm.data.brats import find_cases; from medddpm.sample.quality import brats_fig1_slices
cases, why = find_cases(sys.argv[1]); print(why)
brats_fig1_slices(cases, sys.argv[2]).to_parquet(sys.argv[3], index=False)" "$WORK/held" "$WORK/samples" "$OUT/fig1_slices.parquet" ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
