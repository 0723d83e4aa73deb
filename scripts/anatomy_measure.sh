#!/usr/bin/env bash
# Real anatomy (issue 47): train and measure Med-DDPM on IXI, one training run per GPU, all at once.
#
#   scripts/anatomy_measure.sh OUT IXI WORK RUN...
#
# OUT: results folder of this GPU (tables under OUT/anatomy/) · IXI: a `medddpm prepare-ixi` folder
# (dev/ and val/; test/ only for a run of MODE test) · WORK: checkpoints and samples (not results).
# RUN is RECIPE:SEED[:CONFIG[:MODE]]; run k goes to GPU FIRST_GPU + k (CUDA_VISIBLE_DEVICES; FIRST_GPU default 0). Each trains CONFIG (fast)
# on dev/ at 64³ with the val subjects held out (their loss every EVAL_EVERY steps; best.pt keeps the
# EMA weights of the lowest), lr LR, grad-accum 1, for TRAIN_S seconds from process start (compilation
# included; stopped checkpointed), then scripts/anatomy.py samples val's masks from best.pt with
# RUNS (the 12-step default under fast and DDPM 250 under bf16) over SEEDS and measures them. MODE test
# samples and measures test/'s masks instead (the external test set: once, for the chosen recipe); MODE
# gate trains for GATE_TRAIN_S (and measures for GATE_MEASURE_S) and samples GATE_RUNS over GATE_SEEDS instead (FP32 DDPM 250, the
# sampler gate's band, and the candidates: the book's gate reads them from the same tables). RECIPE
# names the knobs of the intensity question, each alone or together:
#   ref (the reference) · pct (--intensity percentile) · offset (--offset-noise 0.1) · v (--prediction v)
#   and any of them joined by '+' (pct+offset+v).
# UTILITY_STEPS > 0 adds the segmentation utility (scripts/anatomy.py --utility-steps: segmenters trained
# on the training masks' synthetic scans and on the real ones, Dice on the real held-out scans).
# STEPS caps the steps (default 200000: TRAIN_S decides). SIZE (default 64) must match IXI's volumes (prepare-ixi --size);
# a run at another size is named RECIPE-sSEED-CONFIG-SIZE.
# MEASURE_S=0 (GATE_MEASURE_S=0 for a gate run) trains only: best.pt stays under WORK/NAME for a later call.
# Tables: OUT/anatomy/anatomy_{samples,diversity,summary,utility}.csv (rows appended), OUT/anatomy/slices-*.parquet,
# and each run's log, held-out and timing CSVs under OUT/anatomy/train/NAME/. Logs: OUT/log.txt.
set -uo pipefail
OUT=${1:?usage: anatomy_measure.sh OUT IXI WORK RUN...}; IXI=${2:?}; WORK=${3:?}; shift 3
PY=${PYTHON:-python3}
TRAIN_S=${TRAIN_S:-330}; STEPS=${STEPS:-200000}; SIZE=${SIZE:-64}; LR=${LR:-1e-4}; EVAL_EVERY=${EVAL_EVERY:-2000}
RUNS=${RUNS:-dpm2m-sde12-logsnr:fast,ddpm250:bf16}; SEEDS=${SEEDS:-0,1,2}
GATE_RUNS=${GATE_RUNS:-ddpm250:baseline,dpm2m-sde12-logsnr:fast,dpm2m-sde12-logsnr:fast-fp8,dpm2m-sde10-logsnr:fast}
GATE_SEEDS=${GATE_SEEDS:-0,1,2,3}; GATE_TRAIN_S=${GATE_TRAIN_S:-220}; GATE_MEASURE_S=${GATE_MEASURE_S:-420}  # FP32 DDPM 250 × 4 seeds: minutes
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT/anatomy/parts" "$WORK"
RUN_TAIL=4; source "$(dirname "$0")/_run.sh"
VAL=$(ls "$IXI/val/images" | wc -l)

flags() {  # the train flags of a recipe
  local f="--mask-labels brain=nonzero" k
  for k in ${1//+/ }; do
    case $k in
      ref) ;;
      pct) f+=" --intensity percentile" ;;
      offset) f+=" --offset-noise ${OFFSET:-0.1}" ;;
      v) f+=" --prediction v" ;;
      *) echo "unknown recipe part $k" >&2; return 2 ;;
    esac
  done
  echo "$f"
}

one() {  # RECIPE SEED CONFIG GPU [gate]
  local recipe=$1 seed=$2 cfg=$3 name="$1-s$2-$3$([ "$SIZE" = 64 ] || echo "-$SIZE")" f train_s=$TRAIN_S runs=$RUNS seeds=$SEEDS measure_s=${MEASURE_S:-300} split=val
  local batch=4
  [ "${5:-}" = test ] && { split=test; measure_s=${TEST_MEASURE_S:-420}; }  # 51 masks, 3× val's
  [ "${5:-}" = gate ] && { train_s=$GATE_TRAIN_S; runs=$GATE_RUNS; seeds=$GATE_SEEDS; measure_s=$GATE_MEASURE_S; batch=8; }
  f=$(flags "$recipe") || return 2
  local run_dir=$WORK/$name
  export CUDA_VISIBLE_DEVICES=$4  # this run's GPU (the function runs in a background subshell)
  run $((train_s + 60)) $PY -m medddpm train --images "$IXI/dev/images" \
    --masks "$IXI/dev/masks" --held-out "$VAL" --eval-every "$EVAL_EVERY" --config "$cfg" --size "$SIZE" \
    --steps "$STEPS" --lr "$LR" --grad-accum 1 --log-every 500 --save-every 5000 --time-limit "$train_s" \
    --seed "$seed" --quiet --out "$run_dir" $f $([ -f "$run_dir/checkpoint.pt" ] && echo --resume)
  mkdir -p "$OUT/anatomy/train/$name"
  for t in log heldout timing; do cp "$run_dir/$t.csv" "$OUT/anatomy/train/$name/" 2>/dev/null; done
  [ "$measure_s" = 0 ] && return 0  # train only (MEASURE_S=0): the checkpoint stays in WORK for a later call
  run "$measure_s" $PY scripts/anatomy.py --data "$IXI" --split "$split" \
    --checkpoint "$run_dir/best.pt" --out "$OUT/anatomy/parts/$name" --name "$name" --runs "$runs" \
    --seeds "$seeds" --work "$WORK/samples" --device cuda --batch "$batch" --utility-steps "${UTILITY_STEPS:-0}"
}

gpu=${FIRST_GPU:-0}
for spec in "$@"; do
  IFS=: read -r recipe seed cfg gate <<<"$spec"
  one "$recipe" "${seed:-0}" "${cfg:-fast}" $gpu "${gate:-}" &
  gpu=$((gpu + 1))
done
wait
$PY - "$OUT/anatomy" <<'PYEOF'
import json, sys
from pathlib import Path
import pandas as pd
from medddpm.core.io import append_csv
root = Path(sys.argv[1])
for part in sorted((root / "parts").glob("*/anatomy")):
    for csv in sorted(part.glob("anatomy_*.csv")):
        env = json.loads(csv.with_suffix(".env.json").read_text())
        append_csv(root / csv.name, pd.read_csv(csv), env)
    for pq in part.glob("slices-*.parquet"):
        pq.rename(root / pq.name)
print("merged", len(list((root / "parts").glob("*/anatomy"))), "runs")
PYEOF
rm -rf "$OUT/anatomy/parts"
