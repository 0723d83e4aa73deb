#!/usr/bin/env bash
# Run on the device machine from the repository root, with the nibabel wheel in .carry/whl (run carry=[".carry/whl"]).
# Time to result on this machine (chapter 15's first table): a 128³ phantom checkpoint's `sample` by default (DDPM 250)
# for 1 mask, cold and warm; the 12-call chain (`--sampler dpm2m-sde --steps 12 --spacing logsnr --eta 1.3`, a v
# checkpoint's default until issue 75) for 1, 8 and 100 masks, cold and warm; `train --config fast --steps 100` at 128³
# with train's defaults (the recipe and volumes a step of this tree), cold and warm. Each cache its own folder.
# Declared next (issue 75: where Muon's first step goes; at 2026-11-29 its cold 100 steps took 147.5 s against Adam's
# 102.1 s the day before): END=570 ADAM=1 on a fresh H200, in one call. Read: each train row's first step (its
# `where`) under the default and under --optimizer adam, cold and warm, on one machine; no decision rides on it.
# Ran as time_to_result/default-rows-adam-2026-11-29.
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
C="$S --sampler dpm2m-sde --steps 12 --spacing logsnr --eta 1.3"  # the 12-call chain
run c cold 1 $C --masks $W/masks1 --out $W/o$k
for r in 1 2 3; do run c warm 1 $C --masks $W/masks1 --out $W/o$k; done
run c warm 8 $C --masks $W/masks8 --out $W/o$k
run c warm 100 $C --masks $W/masks100 --out $W/o$k
echo "chain rows at $SECONDS s"
run d cold 1 $S --masks $W/masks1 --out $W/o$k
for r in 1 2; do run d warm 1 $S --masks $W/masks1 --out $W/o$k; done
echo "default rows at $SECONDS s"
# train's defaults; with ADAM=1 then the same with --optimizer adam (its own cache), so the two first steps compare
for opt in default ${ADAM:+adam}; do
  [ $opt = adam ] && FLAGS="--optimizer adam" && c=t128-adam || { FLAGS=""; c=t128; }
  for state in cold warm; do
    left $([ $state = cold ] && echo 160 || echo 80) || break  # a cold 100 steps took 148 s, a warm one 58
    MEDDDPM_CACHE=$W/cache-$c TORCHINDUCTOR_CACHE_DIR=$W/cache-$c/inductor TRITON_CACHE_DIR=$W/cache-$c/triton \
    python3 -m medddpm.profiling.waiting run --out $O/time_to_result.csv --cache $state --volumes 100 -- train \
      --images $P/images --masks $P/masks --config fast --steps 100 --size 128 --quiet $FLAGS --out $W/$c-$state 2>&1 | tail -2
    cp $W/$c-$state/timing.csv $O/timing${c#t}-$state.csv
  done
done
echo "done at $SECONDS s"
