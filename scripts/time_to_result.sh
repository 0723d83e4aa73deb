#!/usr/bin/env bash
# What a user waits for (issue 48), on one machine's GPUs: process start to files written.
#
#   scripts/time_to_result.sh OUT WORK [NPROC]
#
# OUT: results folder of this GPU (time_to_result.csv, same_files.csv) · WORK: scratch (phantom masks,
# a 128³ checkpoint, samples, a fresh compile cache) · NPROC: ranks of the sharded runs (default: every GPU).
# Rows: `sample` of 1, 8 and 100 masks by default (the configuration sample picks), under fast and under
# eager bf16, each with a cold compile cache (a fresh MEDDDPM_CACHE) and again warm; fast's sampler with
# cuDNN's heuristics (the -pinned rung) twice, and its bench-sample rows beside fast's; `--nproc NPROC` of
# 256 masks against one GPU; `train --config fast`'s first 100 steps, cold and warm. Files: fast twice,
# and fast on NPROC ranks against one process, compared bit for bit (same_files.csv).
set -uo pipefail
OUT=${1:?usage: time_to_result.sh OUT WORK [NPROC]}; WORK=${2:?}; NPROC=${3:-$(nvidia-smi -L | wc -l)}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
T="$PY -m medddpm.profiling.waiting"
CSV=$OUT/time_to_result.csv; SAME=$OUT/same_files.csv

fresh_cache() {  # a cold cache: nothing compiled by an earlier process
  export MEDDDPM_CACHE=$WORK/cache-$1 TORCHINDUCTOR_CACHE_DIR=$WORK/cache-$1/inductor TRITON_CACHE_DIR=$WORK/cache-$1/triton
  rm -rf "$MEDDDPM_CACHE"
}

[ -d "$WORK/ph" ] || $PY -m medddpm phantom --out "$WORK/ph" --n 4 --size 128 >/dev/null
[ -f "$WORK/ckpt/checkpoint.pt" ] || $PY -m medddpm train --images "$WORK/ph/images" --masks "$WORK/ph/masks" \
  --config bf16 --steps 2 --size 128 --quiet --out "$WORK/ckpt" >/dev/null
for n in 1 8 100 256; do  # mask folders: the phantoms' masks, copied under new names
  d=$WORK/masks$n; [ -d "$d" ] && continue; mkdir -p "$d"
  for i in $(seq 0 $((n - 1))); do cp "$WORK/ph/masks/phantom_00$((i % 4)).nii.gz" "$d/m$(printf %03d "$i").nii.gz"; done
done
S="sample --checkpoint $WORK/ckpt/checkpoint.pt --quiet"

for cfg in default fast bf16; do
  fresh_cache "$cfg"
  opt=$([ "$cfg" = default ] || echo "--config $cfg")
  for n in 1 8 100; do
    for state in cold warm; do
      [ "$state" = cold ] && fresh_cache "$cfg"
      out=$WORK/s-$cfg-$n-$state; rm -rf "$out"
      $T run --out "$CSV" --cache $state --volumes $n -- $S --masks "$WORK/masks$n" --out "$out" $opt
    done
  done
done
# the same files: fast twice (warm), fast on NPROC ranks against one process
$T compare "$WORK/s-fast-8-cold" "$WORK/s-fast-8-warm" --out "$SAME" --what "sample --config fast, 8 masks, twice"
$T compare "$WORK/s-bf16-8-cold" "$WORK/s-bf16-8-warm" --out "$SAME" --what "sample --config bf16, 8 masks, twice"
PINNED=fast-w16-tnorm-tconv-fold-up-update-chain-pinned  # fast's sampler, cuDNN's heuristics instead of its autotuner
for k in 1 2; do
  rm -rf "$WORK/s-pinned-$k"
  $T run --out "$CSV" --cache warm --volumes 8 -- $S --masks "$WORK/masks8" --out "$WORK/s-pinned-$k" --config $PINNED
done
$T compare "$WORK/s-pinned-1" "$WORK/s-pinned-2" --out "$SAME" --what "sample --config $PINNED, 8 masks, twice"
$PY -m medddpm bench-sample --config fast,$PINNED --sampler dpm2m-sde --steps 12 --repeats 5 --device cuda \
  --out "$OUT/sample_bench.csv"  # what pinning costs (issue 48: deterministic where it costs < 5 %)
fresh_cache nproc
for p in 1 "$NPROC"; do
  for state in cold warm; do
    out=$WORK/s-nproc$p-$state; rm -rf "$out"
    $T run --out "$CSV" --cache $state --volumes 256 -- $S --masks "$WORK/masks256" --out "$out" --config fast --nproc "$p"
  done
done
$T compare "$WORK/s-nproc1-warm" "$WORK/s-nproc$NPROC-warm" --out "$SAME" --what "sample --config fast, 256 masks, --nproc $NPROC vs 1"
fresh_cache train
for state in cold warm; do
  rm -rf "$WORK/t-$state"
  $T run --out "$CSV" --cache $state --volumes 100 -- train --images "$WORK/ph/images" --masks "$WORK/ph/masks" \
    --config fast --steps 100 --size 128 --quiet --out "$WORK/t-$state"
done
