#!/usr/bin/env bash
# Sampling speed of one GPU (issue 10): whole-head 128³, seconds per volume, per configuration.
#
#   scripts/sample_measure.sh OUT [CONFIG...]      (default: fast opt1 baseline)
#
# DDPM (all 250 steps) and DDIM 50 per configuration and batch (BATCHES, default "1"; seconds per
# volume); repeats fall with the configuration's cost.
# Rows append to OUT/sample_bench.csv; commands to OUT/commands.log, output to OUT/log.txt.
set -uo pipefail
OUT=${1:?usage: sample_measure.sh OUT [CONFIG...]}; shift
CONFIGS=${*:-fast opt1 baseline}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
RUN_TAIL=2; source "$(dirname "$0")/_run.sh"
$PY -m medddpm info --json >"$OUT/info-sample.json"
for cfg in $CONFIGS; do
  reps=3; [ "$cfg" = opt1 ] && reps=2; [ "$cfg" = baseline ] && reps=1
  for batch in ${BATCHES:-1}; do
    run "${LIMIT:-240}" $PY -m medddpm bench-sample --model whole-head --size 128 --config "$cfg" --sampler ddim \
      --steps 50 --repeats "$reps" --batch "$batch" --device cuda --out "$OUT/sample_bench.csv"
    run "${LIMIT:-240}" $PY -m medddpm bench-sample --model whole-head --size 128 --config "$cfg" --sampler ddpm \
      --repeats "$(( reps > 1 ? reps - 1 : 1 ))" --batch "$batch" --device cuda --out "$OUT/sample_bench.csv"
  done
done
# where one denoising step's time goes (kernels of 5 warm DDIM steps), for KERNEL_CONFIGS
for cfg in ${KERNEL_CONFIGS:-}; do
  run "${LIMIT:-240}" $PY -c "import sys, torch; from medddpm.core.config import model_preset, run_config
from medddpm.profiling.sample_bench import denoise_kernels
k = denoise_kernels(model_preset('whole-head'), run_config('$cfg'), (128,) * 3, torch.device('cuda'))
k.to_csv('$OUT/denoise_kernels_$cfg.csv', index=False)
print(k.groupby('category')['ms_per_step'].sum().round(2).sort_values().to_string())"
done
