#!/usr/bin/env bash
# The Triton GroupNorm kernels of medddpm/net/kernels.py on one GPU (issue 21, and issue 20's sampler).
#
#   scripts/norm_measure.sh OUT kernels     # GPU tests of the kernels, every large norm shape timed in both
#                                           # implementations (OUT/norms.csv), the training step (OUT/bench.csv)
#   scripts/norm_measure.sh OUT sampling    # the sampler with the kernels, its kernels per step, ε agreement
#   scripts/norm_measure.sh OUT layers      # per-layer accounting of fast's convolutions (OUT/layers.csv)
#   scripts/norm_measure.sh OUT thin        # the Triton thin convolutions: each pass against cuDNN
#                                           # (OUT/thin_convs.csv), the step and the sampler with them
#   scripts/norm_measure.sh OUT thin-check  # their GPU tests, loss parity and per-layer table of fast-tnorm-tconv
#
# Commands go to OUT/commands.log, their output to OUT/log.txt.
set -uo pipefail
OUT=${1:?usage: norm_measure.sh OUT STAGE...}; shift
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
RUN_TAIL=${RUN_TAIL:-4}; source "$(dirname "$0")/_run.sh"
$PY -m medddpm info --json >"$OUT/info-norms.json"
B="$PY -m medddpm bench-sample --model whole-head --size 128 --device cuda --out $OUT/sample_bench.csv"
for stage in "$@"; do
  case $stage in
    kernels)
      run 240 $PY -m pytest tests/test_kernels.py -q -p no:cacheprovider
      run 300 $PY -m medddpm bench --model whole-head --size 128 --config fast,fast-tnorm --steps 10 --warmup 5 \
        --device cuda --out "$OUT/bench.csv"
      run 400 $PY -m medddpm.profiling.layers --norms --size 128 --out "$OUT/norms.csv" ;;
    sampling)
      run 200 $B --config fast-w16-p8-tnorm --sampler ddim --steps 50 --repeats 3
      run 200 $B --config fast-w16-p8-tnorm --sampler ddpm --repeats 2
      run 150 $PY -c "import torch; from medddpm.core.config import model_preset, run_config
from medddpm.profiling.sample_bench import denoise_kernels
k = denoise_kernels(model_preset('whole-head'), run_config('fast-w16-p8-tnorm'), (128,) * 3, torch.device('cuda'))
k.to_csv('$OUT/denoise_kernels_fast-w16-p8-tnorm.csv', index=False)
print(k.groupby('category')['ms_per_step'].sum().round(2).sort_values().to_string())"
      run 200 $PY scripts/quality.py agree --out "$OUT" --size 64 --configs fast-tnorm,fast-w16-p8-tnorm ;;
    layers)
      run 300 $PY -m medddpm.profiling.layers --profile --config fast --size 128 --out "$OUT/layers.csv" ;;
    thin)
      run 120 $PY scripts/probes/thin_conv_probe.py --out "$OUT/thin_convs.csv"
      run 300 $PY -m medddpm bench --model whole-head --size 128 --config ${THIN_CONFIGS:-fast-tconv,fast-tnorm-tconv} --steps 10 \
        --warmup 5 --device cuda --out "$OUT/bench.csv"
      run 150 $B --config fast-w16-tnorm-tconv --sampler ddim --steps 50 --repeats 3
      run 150 $B --config fast-w16-tnorm-tconv --sampler ddpm --repeats 2 ;;
    thin-check)
      run 150 $PY -m pytest tests/test_kernels.py -q -p no:cacheprovider -x -k "matches_conv3d or bf16_accumulates or triton_convolutions"
      run 200 $PY scripts/fast_path.py loss --out "$OUT" --size 64 --configs fast-tnorm-tconv --seeds 0 --steps 50
      run 200 $PY -m medddpm.profiling.layers --profile --config fast-tnorm-tconv --size 128 --out "$OUT/layers.csv" ;;
    *) echo "unknown stage $stage (kernels, sampling, layers, thin, thin-check)" >&2; exit 2 ;;
  esac
done
