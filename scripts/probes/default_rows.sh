#!/usr/bin/env bash
# Run on the device machine from the repository root, with the nibabel wheel in .carry/whl (run carry=[".carry/whl"]).
# Time to result on this machine (issue 64's rows): a v-prediction 128³ phantom checkpoint's default (the 12-call chain,
# fast-eager) for 1, 8 and 100 masks, cold and warm; DDPM 250 (the ε default) for 1 mask warm; `warmup` then `sample`;
# `train --config fast --steps 100` at 128³, cold and warm.
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$PWD; W=/tmp/w; O=$OUT; rm -rf $W; mkdir -p $W $O
END=${END:-570}
left() { [ $((END - SECONDS)) -gt "$1" ]; }
source $R/scripts/probes/prepare128.sh
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
