#!/usr/bin/env bash
# Run on the device machine from the repository root, with the nibabel wheel in .carry/whl.
# Where a denoiser call's time goes under fast-eager (the default for up to FAST_FROM_CALLS calls) and fast: every
# kernel of 10 warm DDPM steps at 128³ (seeded weights, torch.profiler; sample_bench.denoise_kernels), per configuration.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/w/pycache
unset PYTHONDONTWRITEBYTECODE  # the image ships no .pyc: keep bytecode in the prefix
R=$PWD; O=$OUT; mkdir -p /tmp/w $O
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry/whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$R:/tmp/site MEDDDPM_CACHE=/tmp/w/cache TORCHINDUCTOR_CACHE_DIR=/tmp/w/cache/inductor TRITON_CACHE_DIR=/tmp/w/cache/triton
{ nvidia-smi -L; nproc; nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c "import torch,triton,sys;print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, sys.version.split()[0])"; } > $O/env.txt 2>&1
for cfg in fast-eager fast; do
python3 - <<P
import torch
from medddpm.core.config import model_preset, sampling_config
from medddpm.profiling.sample_bench import denoise_kernels
k = denoise_kernels(model_preset('whole-head'), sampling_config('$cfg'), (128,) * 3, torch.device('cuda'), steps=10, sampler='ddpm')
k.to_csv('$O/denoise_kernels_$cfg.csv', index=False)
print('$cfg', round(k['ms_per_step'].sum(), 2), 'ms a step of kernels;', round(k['idle_ms_before'].sum(), 2), 'ms idle')
print(k.groupby('category')['ms_per_step'].sum().round(3).sort_values(ascending=False).to_string())
P
echo "$cfg at $SECONDS s"
done
