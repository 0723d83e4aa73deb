#!/usr/bin/env bash
# The post-hoc EMA under `fast` on a GPU (CUDA-graph step, channels-last weights): a tiny 32³ phantom run keeps two
# widths' snapshots, `posthoc-ema` rebuilds and judges two others on cuda and writes one, and `sample` reads it.
# Run on the device machine from the repository root with .carry/whl (nibabel). On one H200 (torch 2.11.0+cu130,
# 2026-11-29): train rc 0, snapshots at steps 10 and 20, held-out 0.51204 (σ_rel 0.07) and 0.51229 (0.12), 4 samples.
set -u
export PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi -L; python3 -c "import torch;print(torch.__version__, torch.version.cuda)"
python3 -m medddpm phantom --out /tmp/ph --n 4 --size 32 >/dev/null || exit 1
t0=$(date +%s)
timeout 150 python3 -m medddpm train --images /tmp/ph/images --masks /tmp/ph/masks --model tiny --size 32 --config fast \
  --steps 20 --grad-accum 1 --held-out 1 --posthoc-ema 0.05 0.1 --posthoc-every 10 --quiet --out /tmp/r 2>&1 | tail -4
echo "train rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 )) s"; ls /tmp/r/posthoc
python3 -m medddpm posthoc-ema --run /tmp/r --sigma-rel 0.07 0.12 --images /tmp/ph/images --masks /tmp/ph/masks --out /tmp/r/ph.pt 2>&1 | tail -4
python3 -c "import torch;c=torch.load('/tmp/r/ph.pt',weights_only=False);print(c['posthoc_ema'], len(c['ema']))"
timeout 60 python3 -m medddpm sample --checkpoint /tmp/r/ph.pt --masks /tmp/ph/masks --out /tmp/s --sampler ddim --steps 3 --config opt1 --quiet 2>&1 | tail -2
echo "total $(( $(date +%s) - t0 )) s"
