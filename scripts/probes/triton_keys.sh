#!/usr/bin/env bash
# Run on the device machine from the repository root, with the nibabel wheel in .carry/whl and the package before the
# change in .carry/oldpkg/medddpm (run carry=[".carry/whl", ".carry/oldpkg"]). A cold 1-mask `sample` of the default
# (empty compile caches each), precompile's launches deduplicated by exact integer values (old) against what Triton
# specializes integers on (new, kernels._int_key), alternated after one discarded cold run that warms the OS's caches.
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$PWD; W=/tmp/w; O=$OUT; rm -rf $W; mkdir -p $W $O
source $R/scripts/probes/prepare128.sh
k=0
run() {  # run CODE ARM-CACHE ARGS...: CODE new (this tree) or old (.carry/oldpkg)
  local code=$1 cname=$2; shift 2; k=$((k + 1))
  local path=$R; [ $code = old ] && path=$R/.carry/oldpkg
  PYTHONPATH=$path:/tmp/site MEDDDPM_CACHE=$W/cache-$cname TORCHINDUCTOR_CACHE_DIR=$W/cache-$cname/inductor \
  TRITON_CACHE_DIR=$W/cache-$cname/triton python3 -m medddpm.profiling.waiting run --out $O/time_to_result.csv \
    --cache cold --volumes 1 -- "$@" 2>&1 | tail -1
  echo "$k,$code" >> $O/arms.csv
}
echo "row,code" > $O/arms.csv
S="sample --checkpoint $W/ckpt/checkpoint.pt --quiet --masks $W/masks1"
run new discard $S --out $W/o$k
for r in 1 2 3; do run old old$r $S --out $W/o$k; run new new$r $S --out $W/o$k; done
echo "done at $SECONDS s"
