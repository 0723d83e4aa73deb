#!/usr/bin/env bash
# What a user waits for (issue 48), on one machine's GPUs: process start to files written.
#
#   scripts/time_to_result.sh OUT WORK [NPROC]
#
# OUT: results folder of this GPU (time_to_result.csv, same_files.csv) · WORK: scratch (phantom masks,
# a 128³ checkpoint, samples, a fresh compile cache) · NPROC: ranks of the sharded runs (default: every GPU).
# Rows (below, in the order of the issue's targets): `sample` by default (the configuration sample picks by
# the number of masks) and under fast, with a cold compile cache (a fresh MEDDDPM_CACHE) and again warm; fast's
# sampler with cuDNN's heuristics (the -pinned rung) twice, and its bench-sample rows beside fast's;
# `--nproc NPROC` of 256 masks against one GPU; `train --config fast`'s first 100 steps, cold and warm. Files
# written twice, and on NPROC ranks against one process, compared bit for bit (same_files.csv). END=SECONDS
# stops starting stages that would not finish in time. STAGES picks and orders them (default: all but profile):
#   profile   cProfile of the 1-mask default, cold and warm: the costliest calls (OUT/profile-sample-1-*.txt),
#             and -X importtime of it (OUT/importtime-sample-1.txt)
#   profilefast  cProfile of --config fast on 8 masks, warm (after fast8): OUT/profile-sample-fast-8-warm.txt
#   one       1 mask by default, cold and warm        fast8   --config fast, 8 masks, cold and warm, compared
#   default100  100 masks by default (fast), warm     default8  8 masks by default, twice, compared
#   eager8    --config fast-eager (the small-job pick), 8 masks, twice, compared
#   benchddpm bench-sample of fast against fast-eager: DDPM 250 and the 12-step chain (OUT/sample_bench.csv)
#   nproc     256 masks under fast on each of NPROCS ranks (default: NPROC, then 1: one process), compared
#   warm      `medddpm warmup` of fast and fast-eager (the caches nprocddpm and nprocchain read)
#   afterwarmup  `medddpm warmup` without --config into a fresh cache, then 1 mask by default twice (cache warmup, warm)
#   hundred   100 masks by default into a fresh cache, then warm
#   nprocddpm 32 masks by default (DDPM 250, fast) on NPROCS ranks, compared
#   nprocchain 256 masks of the 12-step chain by default (fast-eager) on NPROCS ranks, compared
#   pinned    the -pinned rung twice, compared        train   train --config fast's first 100 steps, cold and warm
#   bench     bench-sample of fast against -pinned
set -uo pipefail
OUT=${1:?usage: time_to_result.sh OUT WORK [NPROC]}; WORK=${2:?}; NPROC=${3:-$(nvidia-smi -L | wc -l)}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
# bytecode kept across the timed processes, as an installed environment keeps it next to its files: the first process
# writes it. An image that sets PYTHONDONTWRITEBYTECODE and ships no .pyc (the device's, 2026-11) otherwise compiles
# torch's sources in every process: 5.5 s of a 1-mask sample and 12 s of fast's start-up there (cProfile, builtins.compile)
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$WORK/pycache}
$PY -c "import sys; print(f'bytecode: written {not sys.dont_write_bytecode}, prefix {sys.pycache_prefix}')" >"$OUT/bytecode.txt"
T="$PY -m medddpm.profiling.waiting"
CSV=$OUT/time_to_result.csv; SAME=$OUT/same_files.csv

use_cache() {  # the compile caches of WORK/cache-NAME from here on
  export MEDDDPM_CACHE=$WORK/cache-$1 TORCHINDUCTOR_CACHE_DIR=$WORK/cache-$1/inductor TRITON_CACHE_DIR=$WORK/cache-$1/triton
}
fresh_cache() {  # a cold cache: nothing compiled by an earlier process
  use_cache "$1"
  rm -rf "$MEDDDPM_CACHE"
}

[ -d "$WORK/ph" ] || $PY -m medddpm phantom --out "$WORK/ph" --n 4 --size 128 >/dev/null
[ -f "$WORK/ckpt/checkpoint.pt" ] || $PY -m medddpm train --images "$WORK/ph/images" --masks "$WORK/ph/masks" \
  --config bf16 --steps 2 --size 128 --quiet --out "$WORK/ckpt" >/dev/null
for n in 1 8 32 100 256; do  # mask folders: the phantoms' masks, copied under new names
  d=$WORK/masks$n; [ -d "$d" ] && continue; mkdir -p "$d"
  for i in $(seq 0 $((n - 1))); do cp "$WORK/ph/masks/phantom_00$((i % 4)).nii.gz" "$d/m$(printf %03d "$i").nii.gz"; done
done
S="sample --checkpoint $WORK/ckpt/checkpoint.pt --quiet"

left() { [ $((${END:-100000} - SECONDS)) -gt "$1" ]; }  # END: seconds this script may take (a device call's limit)
row() {  # row NAME CACHE VOLUMES MASKS [sample options...]: one timed `sample` into WORK/s-NAME
  local name=$1 state=$2 n=$3 masks=$4; shift 4
  rm -rf "$WORK/s-$name"
  $T run --out "$CSV" --cache "$state" --volumes "$n" -- $S --masks "$masks" --out "$WORK/s-$name" "$@"
}
# In the order of the issue's targets (STAGES), each stage only while END leaves it time.
PINNED=fast-w16-tnorm-tconv-fold-up-update-chain-pinned  # fast's sampler, cuDNN's heuristics instead of its autotuner
profile() {  # profile NAME MASKS [sample options...]: cProfile of one `sample` (OUT/profile-NAME.txt)
  local name=$1 masks=$2; shift 2
  rm -rf "$WORK/s-profile-$name"
  $PY -m cProfile -o "$WORK/profile-$name.pstats" -m medddpm $S --masks "$masks" --out "$WORK/s-profile-$name" "$@" &&
    $PY -c "import pstats, sys; s = pstats.Stats(sys.argv[1], stream=sys.stdout); s.sort_stats('cumulative').print_stats(60); s.sort_stats('tottime').print_stats(25); s.sort_stats('cumulative').print_stats('triton/compiler', 8); s.print_callers('_register_to_dispatcher')" \
      "$WORK/profile-$name.pstats" >"$OUT/profile-$name.txt"
}
stage_profile() {
  fresh_cache profile
  local state
  for state in cold warm; do
    left 40 && profile "sample-1-$state" "$WORK/masks1"
  done
  # which modules the start-up imports, and what each costs (cumulative µs, the 60 dearest)
  left 30 && rm -rf "$WORK/s-importtime" && $PY -X importtime -m medddpm $S --masks "$WORK/masks1" \
    --out "$WORK/s-importtime" 2>&1 >/dev/null | grep "^import time:" | sort -t'|' -k2 -n | tail -60 \
    >"$OUT/importtime-sample-1.txt"
}
stage_profilefast() {  # where fast's warm start-up goes: its cache is warm after stage fast8
  use_cache fast
  left 60 && profile sample-fast-8-warm "$WORK/masks8" --config fast
}
stage_one() {
  fresh_cache default
  left 60 && row default-1-cold cold 1 "$WORK/masks1" && row default-1-warm warm 1 "$WORK/masks1"
}
stage_fast8() {
  fresh_cache fast
  left 120 && row fast-8-cold cold 8 "$WORK/masks8" --config fast && row fast-8-warm warm 8 "$WORK/masks8" --config fast &&
    $T compare "$WORK/s-fast-8-cold" "$WORK/s-fast-8-warm" --out "$SAME" --what "sample --config fast, 8 masks, twice"
}
stage_default100() {  # fast from FAST_FROM_CALLS denoiser calls (100 masks of DDPM 250 hold them): cache warm after fast8
  use_cache fast
  left 80 && row default-100-warm warm 100 "$WORK/masks100"
}
stage_default8() {
  use_cache default
  left 60 && row default-8-cold cold 8 "$WORK/masks8" && row default-8-warm warm 8 "$WORK/masks8" &&
    $T compare "$WORK/s-default-8-cold" "$WORK/s-default-8-warm" --out "$SAME" --what "sample, 8 masks, twice"
}
stage_eager8() {  # the small-job configuration on 8 masks: its Triton kernels cached by stage one
  use_cache default
  left 90 && row eager-8-1 warm 8 "$WORK/masks8" --config fast-eager && row eager-8-2 warm 8 "$WORK/masks8" --config fast-eager &&
    $T compare "$WORK/s-eager-8-1" "$WORK/s-eager-8-2" --out "$SAME" --what "sample --config fast-eager, 8 masks, twice"
}
stage_benchddpm() {  # the steady state of both: seconds a volume (fast's compile cache warm after stage fast8)
  use_cache fast
  left 120 && $PY -m medddpm bench-sample --config fast-eager,fast --sampler ddpm --repeats 3 --device cuda \
    --out "$OUT/sample_bench.csv"
  left 60 && $PY -m medddpm bench-sample --config fast-eager,fast --sampler dpm2m-sde --steps 12 --repeats 5 --device cuda \
    --out "$OUT/sample_bench.csv"
}
sharded() {  # sharded NAME VOLUMES [sample options...]: VOLUMES masks on each of NPROCS ranks (1: one process, no
  # torchrun; default: NPROC, then 1), each into WORK/s-NAME<ranks>-VOLUMES-warm; each sharded run's files against the
  # one process's, wherever both exist (an earlier call on this machine may have written one of them)
  local name=$1 n=$2; shift 2
  local k sampler
  sampler=$(echo "$*" | grep -o -- "--sampler [^ ]*" | cut -d' ' -f2)
  for k in ${NPROCS:-$NPROC 1}; do
    if [ "$k" = 1 ]; then
      left 120 && row $name$k-$n-warm warm "$n" "$WORK/masks$n" "$@"
    else
      left 90 && row $name$k-$n-warm warm "$n" "$WORK/masks$n" --nproc "$k" "$@"
    fi
  done
  for k in 2 3 4 5 6 7 8; do
    [ -d "$WORK/s-${name}1-$n-warm" ] && [ -d "$WORK/s-$name$k-$n-warm" ] && left 40 &&
      $T compare "$WORK/s-${name}1-$n-warm" "$WORK/s-$name$k-$n-warm" --out "$SAME" ${sampler:+--sampler $sampler} \
        --what "sample${*:+ $*}, $n masks, --nproc $k vs 1"
  done
  return 0
}
stage_nproc() {  # 256 masks under fast (its cache warm after fast8)
  use_cache fast
  sharded nproc 256 --config fast
}
stage_hundred() {  # 100 masks by default into a fresh cache, then again warm (what the rule picks for them)
  fresh_cache hundred
  left 120 && row default-100-cold cold 100 "$WORK/masks100" && left 60 && row default-100-again warm 100 "$WORK/masks100"
}
stage_afterwarmup() {  # `medddpm warmup` (every configuration sample may pick) into a fresh cache, then 1 mask by
  # default (fast-eager) twice: the first right after warmup, the second warm
  fresh_cache afterwarmup
  left 150 && $T run --out "$CSV" --cache cold --volumes 0 -- warmup --checkpoint "$WORK/ckpt/checkpoint.pt" &&
    left 40 && row default-1-afterwarmup warmup 1 "$WORK/masks1" && left 30 && row default-1-afterwarmup-again warm 1 "$WORK/masks1"
}
stage_warm() {  # `medddpm warmup` of fast and of fast-eager into the caches the sharded stages below read
  use_cache fast
  left 150 && $PY -m medddpm warmup --checkpoint "$WORK/ckpt/checkpoint.pt" --config fast >"$OUT/warmup-fast.txt" 2>&1
  use_cache default
  left 60 && $PY -m medddpm warmup --checkpoint "$WORK/ckpt/checkpoint.pt" --config fast-eager >"$OUT/warmup-fast-eager.txt" 2>&1
}
stage_nprocddpm() {  # 32 masks by default (DDPM 250: fast by the rule), sharded and on one process
  use_cache fast
  sharded ddpm 32
}
stage_nprocchain() {  # 256 masks of the 12-step chain by default (fast-eager by the rule), sharded and on one process
  use_cache default
  sharded chain 256 --sampler dpm2m-sde --steps 12
}
stage_pinned() {
  left 80 && row pinned-8-1 warm 8 "$WORK/masks8" --config $PINNED && row pinned-8-2 warm 8 "$WORK/masks8" --config $PINNED &&
    $T compare "$WORK/s-pinned-8-1" "$WORK/s-pinned-8-2" --out "$SAME" --what "sample --config $PINNED, 8 masks, twice"
}
stage_train() {
  fresh_cache train
  local state
  for state in cold warm; do
    left 100 || break
    rm -rf "$WORK/t-$state"
    $T run --out "$CSV" --cache $state --volumes 100 -- train --images "$WORK/ph/images" --masks "$WORK/ph/masks" \
      --config fast --steps 100 --size 128 --quiet --out "$WORK/t-$state"
  done
}
stage_bench() {  # what pinning costs (issue 48: deterministic where it costs < 5 %)
  left 60 && $PY -m medddpm bench-sample --config fast,$PINNED --sampler dpm2m-sde --steps 12 --repeats 5 --device cuda \
    --out "$OUT/sample_bench.csv"
}
for stage in ${STAGES:-one fast8 default100 default8 eager8 nproc warm nprocddpm nprocchain pinned train bench benchddpm}; do
  echo "stage $stage at ${SECONDS} s"
  "stage_$stage"
done
echo "done at ${SECONDS} s"
