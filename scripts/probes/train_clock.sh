#!/usr/bin/env bash
# Run on the device machine from the repository root, with the nibabel wheel in .carry/whl and IXI 64³ (prepare-ixi, uint8) in .carry/ixi64.
# Training's clock: `train --time-limit 300` at 64³ on IXI (the README's command, v, --held-out 16), warm: a first
# run of 40 steps fills the compile cache (its output is kept: its first step is a cold compile), then the timed run.
set -uo pipefail
export PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/w/pycache
R=$PWD; W=/tmp/w; O=$OUT; mkdir -p $W $O
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=$R:/tmp/site
{ nvidia-smi -L; nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch,triton,sys;print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, sys.version.split()[0])"; } > $O/env.txt 2>&1
python3 -c "import medddpm.cli, torch._dynamo, torch._inductor, triton"
cd $W
IXI=$R/.carry/ixi64; VAL=$(ls $IXI/val/images | wc -l)
export MEDDDPM_CACHE=$W/cache-t64 TORCHINDUCTOR_CACHE_DIR=$W/cache-t64/inductor TRITON_CACHE_DIR=$W/cache-t64/triton
T="python3 -m medddpm train --images $IXI/dev/images --masks $IXI/dev/masks --held-out $VAL --mask-labels brain=nonzero --config fast --size 64 --quiet"
for state in ${STATES:-fill warm}; do
  rm -rf $W/r64-$state
  if [ $state = fill ]; then args="--steps 40"; else args="--steps 100000 --time-limit ${LIMIT:-300}"; fi
  t0=$(date +%s.%N)
  $T $args --out $W/r64-$state > $O/train64-stdout-$state.txt 2> $O/train64-stderr-$state.txt
  echo "rc $? wall $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s" >> $O/train64-stdout-$state.txt
  tail -2 $O/train64-stdout-$state.txt
  cp $W/r64-$state/heldout.csv $O/heldout64-$state.csv; cp $W/r64-$state/timing.csv $O/timing64-$state.csv
  ls -li $W/r64-$state >> $O/files64-$state.txt
done
echo "done at $SECONDS s"
tar -C $O -czf /tmp/train64.tgz . && rm -rf $O/* && mv /tmp/train64.tgz $O/
