#!/usr/bin/env bash
# Run on the device machine from the repository root, with the nibabel wheel in .carry/whl (run carry=[".carry/whl"]).
# fast-eager with fused_residual (the default for a small job since 2026-11-28) against fast-eager-unfused (before):
# the default's 1-mask rows cold and warm, 8 and 100 masks warm, 100 masks unfused on the same machine, and which ops
# launch the denoiser's kernels under each (scripts/probes/eager_ops.py).
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$PWD; W=/tmp/w; O=$OUT; rm -rf $W; mkdir -p $W $O
source $R/scripts/probes/prepare128.sh
k=0
run() {  # run STATE VOLUMES ARGS...
  local state=$1 vols=$2; shift 2; k=$((k + 1))
  MEDDDPM_CACHE=$W/cache TORCHINDUCTOR_CACHE_DIR=$W/cache/inductor TRITON_CACHE_DIR=$W/cache/triton \
  python3 -m medddpm.profiling.waiting run --out $O/time_to_result.csv --cache $state --volumes $vols -- "$@" 2>&1 | tail -1
}
S="sample --checkpoint $W/ckpt/checkpoint.pt --quiet"
run cold 1 $S --masks $W/masks1 --out $W/o$k
for r in 1 2 3; do run warm 1 $S --masks $W/masks1 --out $W/o$k; done
run warm 8 $S --masks $W/masks8 --out $W/o$k
run warm 100 $S --masks $W/masks100 --out $W/o$k
run warm 1 $S --config fast-eager-unfused --masks $W/masks1 --out $W/o$k  # its chain compiles: not a warm row
run warm 100 $S --config fast-eager-unfused --masks $W/masks100 --out $W/o$k
run warm 100 $S --masks $W/masks100 --out $W/o$k
echo "rows at $SECONDS s"
for cfg in fast-eager fast-eager-unfused; do
  MEDDDPM_CACHE=$W/cache TORCHINDUCTOR_CACHE_DIR=$W/cache/inductor TRITON_CACHE_DIR=$W/cache/triton \
    python3 $R/scripts/probes/eager_ops.py $O/ops_$cfg.csv $cfg 2>&1 | head -1
done
echo "done at $SECONDS s"
