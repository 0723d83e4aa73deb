#!/usr/bin/env bash
# Run on the device machine from the repository root, with the nibabel wheel in .carry/whl (run carry=[".carry/whl"]).
# Time to result on this machine (issue 64's rows): a v-prediction 128³ phantom checkpoint's default (the 12-call chain,
# fast-eager) for 1, 8 and 100 masks, cold and warm; DDPM 250 (the ε default) for 1 mask warm; `warmup` then `sample`;
# `train --config fast --steps 100` at 128³, cold and warm.
set -uo pipefail
export PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/w/pycache
R=$PWD; W=/tmp/w; O=$OUT; rm -rf $W; mkdir -p $W $O
END=${END:-570}
left() { [ $((END - SECONDS)) -gt "$1" ]; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=$R:/tmp/site
{ nvidia-smi -L; nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch,triton,sys;print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, sys.version.split()[0])"
  git -C $R log -1 --format=%h 2>/dev/null; } > $O/env.txt 2>&1
python3 -c "import medddpm.cli, medddpm.sample.sampler, medddpm.net.kernels, torch._dynamo, torch._inductor, triton"  # bytecode once
cd $W
P=$W/ph; python3 -m medddpm phantom --out $P --n 4 --size 128 >/dev/null
python3 -m medddpm train --images $P/images --masks $P/masks --config bf16 --steps 2 --size 128 --quiet --out $W/ckpt >/dev/null || exit 1
for n in 1 8 100; do d=$W/masks$n; mkdir -p $d; for i in $(seq 0 $((n - 1))); do cp $P/masks/phantom_00$((i % 4)).nii.gz $d/m$(printf %03d $i).nii.gz; done; done
echo "prepared at $SECONDS s"
k=0
run() {  # run CACHE-NAME STATE VOLUMES ARGS...
  local cname=$1 state=$2 vols=$3; shift 3; k=$((k + 1))
  MEDDDPM_CACHE=$W/cache-$cname TORCHINDUCTOR_CACHE_DIR=$W/cache-$cname/inductor TRITON_CACHE_DIR=$W/cache-$cname/triton \
  python3 -m medddpm.profiling.waiting run --out $O/time_to_result.csv --cache $state --volumes $vols -- "$@" 2>&1 | tail -2
}
S="sample --checkpoint $W/ckpt/checkpoint.pt --quiet"
run s cold 1 $S --masks $W/masks1 --out $W/o$k
for r in 1 2 3; do run s warm 1 $S --masks $W/masks1 --out $W/o$k; done
run s warm 8 $S --masks $W/masks8 --out $W/o$k
run s warm 100 $S --masks $W/masks100 --out $W/o$k
run s warm 1 $S --sampler ddpm --masks $W/masks1 --out $W/o$k
echo "warm rows at $SECONDS s"
left 200 && run c cold 100 $S --masks $W/masks100 --out $W/o$k
left 150 && { run w cold 0 warmup --checkpoint $W/ckpt/checkpoint.pt; run w warmup 1 $S --masks $W/masks1 --out $W/o$k
              run w warm 1 $S --masks $W/masks1 --out $W/o$k; }
echo "warmup rows at $SECONDS s"
for state in cold warm; do
  left 140 || break
  MEDDDPM_CACHE=$W/cache-t128 TORCHINDUCTOR_CACHE_DIR=$W/cache-t128/inductor TRITON_CACHE_DIR=$W/cache-t128/triton \
  python3 -m medddpm.profiling.waiting run --out $O/time_to_result.csv --cache $state --volumes 100 -- train \
    --images $P/images --masks $P/masks --config fast --steps 100 --size 128 --quiet --out $W/t128-$state 2>&1 | tail -2
  cp $W/t128-$state/timing.csv $O/timing128-$state.csv
done
echo "done at $SECONDS s"
