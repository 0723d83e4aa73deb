#!/usr/bin/env bash
# Quality parity of one GPU (issue 10), in stages that fit separate 10-minute commands.
#
#   scripts/quality_measure.sh OUT DATA WORK STAGE...
#
# OUT: results folder of this GPU (tables under OUT/quality/) · DATA: `medddpm demo-data` folder
# (64³, its last 2 subjects held out) · WORK: checkpoints and samples (not results).
# Stages: env · agree (ε of every CONFIGS vs an FP64 CPU forward, 64³) · agree-trained (the same
# from CKPT's trained weights on the held-out subjects, vs the GPU baseline → agreement_trained.csv) · parity:CFG:SEED[:keep]
# (STEPS optimizer steps, held-out loss every 100; keep = checkpoint kept under WORK/CFG-SEED) ·
# sample (WORK/baseline-0's checkpoint, DDIM 50, under every CONFIGS → WORK/samples) · bench64
# (bench-sample 64³ DDIM 50 of fast and baseline → OUT/sample_bench.csv) · long (`medddpm train
# --config fast` on the training subjects for up to LONG_STEPS steps or LONG_S seconds, whichever
# comes first (checkpoints every 1000 steps), then `medddpm sample --config fast` DDIM 50 of the
# held-out masks → WORK/samples/fast-long; log.csv → OUT/quality/long_log.csv) · converge
# (`medddpm train --config TRAIN_CONFIG (fast) --held-out 2` on DATA, the held-out loss every EVAL_EVERY steps,
# for TRAIN_S seconds a call, resumed by the next call until CONVERGE_STEPS; its log, heldout and
# timing CSVs → OUT/quality/converge_*.csv) · samplers (CKPT, by default the converge run's
# best.pt, its checkpoint of the lowest held-out loss, sampled by DDPM 250 and DDIM 250/50 at η 0 and 1 under SAMPLER_CONFIGS, each sample
# against the real image → OUT/quality/samplers.csv, sampler_slices.parquet; resumable) · gate (the samplers'
# quality gate of CKPT: FP32 DDPM 250 over GATE_SEEDS gives the band, GATE_RUNS × GATE_CONFIGS are judged inside
# it → OUT/quality/sampler_gate.csv, sampler_diversity.csv, sampler_verdicts.csv). Concurrent copies of this
# script must use different OUT folders (tables are appended). Logs: OUT/log.txt, OUT/commands.log.
set -uo pipefail
OUT=${1:?usage: quality_measure.sh OUT DATA WORK STAGE...}; DATA=${2:?}; WORK=${3:?}; shift 3
PY=${PYTHON:-python3}
CONFIGS=${CONFIGS:-baseline,opt1,opt2,opt12,pytorch-default,bf16,fast}
STEPS=${STEPS:-1000}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
RUN_TAIL=3; source "$(dirname "$0")/_run.sh"
Q="$PY scripts/quality.py"

for stage in "$@"; do
  case $stage in
    env)
      $PY -m medddpm info --json >"$OUT/info-quality.json"
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit \
        --format=csv >"$OUT/nvidia-smi-quality.csv" ;;
    agree) run 420 $Q agree --out "$OUT" --size 64 --configs "$CONFIGS" ;;
    agree-trained)  # ε of CONFIGS from CKPT's EMA weights on the held-out subjects, against the GPU baseline
      run "${LIMIT:-580}" $Q agree --out "$OUT" --data "$DATA" --configs "$CONFIGS" \
        --checkpoint "${CKPT:-$WORK/converge/best.pt}" ;;
    parity:*)
      IFS=: read -r _ cfg seed keep <<<"$stage"
      run "${LIMIT:-580}" $Q parity --out "$OUT" --data "$DATA" --size 64 --configs "$cfg" --seeds "$seed" \
        --steps "$STEPS" --work "$WORK" ${keep:+--keep "$cfg:$seed"} ;;
    sample) run 420 $Q sample --work "$WORK" --data "$DATA" --size 64 --steps 50 --configs "$CONFIGS" \
        --checkpoint "$WORK/baseline-0/checkpoint.pt" ;;
    bench64)
      for cfg in fast baseline; do
        run 240 $PY -m medddpm bench-sample --model whole-head --size 64 --config "$cfg" --sampler ddim --steps 50 \
          --repeats 3 --device cuda --out "$OUT/sample_bench.csv"
      done ;;
    long)
      mkdir -p "$OUT/quality"; tr=$WORK/train; held=$WORK/held_out_masks
      $Q split --data "$DATA" --work "$WORK"
      run "${LONG_S:-400}" $PY -m medddpm train --images "$tr/images" --masks "$tr/masks" --config fast --size 64 \
        --steps "${LONG_STEPS:-20000}" --lr 1e-4 --grad-accum 1 --log-every 500 --save-every 1000 --quiet --out "$WORK/long"
      cp "$WORK/long/log.csv" "$OUT/quality/long_log.csv"; cp "$WORK/long/timing.csv" "$OUT/quality/long_timing.csv"
      run 300 $PY -m medddpm sample --checkpoint "$WORK/long/checkpoint.pt" --masks "$held" --config fast \
        --sampler ddim --steps 50 --quiet --out "$WORK/samples/fast-long" ;;
    converge)  # issue 20: train until the held-out loss stops falling, TRAIN_S seconds a call
      mkdir -p "$OUT/quality"; c=$WORK/converge; train_s=${TRAIN_S:-480}
      run $((train_s + 90)) $PY -m medddpm train --images "$DATA/images" --masks "$DATA/masks" --held-out 2 \
        --eval-every "${EVAL_EVERY:-1000}" --config "${TRAIN_CONFIG:-fast}" --size 64 --steps "${CONVERGE_STEPS:-200000}" --lr 1e-4 \
        --grad-accum 1 --log-every 500 --save-every 5000 --time-limit "$train_s" --quiet --out "$c" \
        $([ -f "$c/checkpoint.pt" ] && echo --resume)
      for f in log heldout timing; do cp "$c/$f.csv" "$OUT/quality/converge_$f.csv"; done ;;
    samplers)  # issue 20: DDPM 250 and DDIM 250/50 at η 0 and 1 from one checkpoint → quality/samplers.csv
      run "${LIMIT:-580}" $Q samplers --out "$OUT" --data "$DATA" --work "$WORK" \
        --checkpoint "${CKPT:-$WORK/converge/best.pt}" --configs "${SAMPLER_CONFIGS:-fast-w16-p8}" \
        --seeds "${SAMPLER_SEEDS:-0}" ${SAMPLER_RUNS:+--runs "$SAMPLER_RUNS"} ;;
    gate)  # the samplers' quality gate: FP32 DDPM 250 over GATE_SEEDS is the band → quality/sampler_*.csv
      run "${LIMIT:-580}" $Q gate --out "$OUT" --data "$DATA" --work "$WORK" \
        --checkpoint "${CKPT:-$WORK/converge/best.pt}" --configs "${GATE_CONFIGS:-fast}" \
        --seeds "${GATE_SEEDS:-0,1,2,3}" --runs "${GATE_RUNS:?GATE_RUNS: comma-separated runs}" \
        ${GATE_SLICES:+--slices "$GATE_SLICES"} ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
