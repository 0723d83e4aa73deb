#!/usr/bin/env bash
# Run on the device machine from the repository root, with the nibabel wheel in .carry/whl and the package before the
# change in .carry/oldpkg/medddpm (run carry=[".carry/whl", ".carry/oldpkg"]). The default's 100-mask job, warm, with
# the masks read as int8 and each volume read back on a stream of its own while the next samples (new: this tree)
# against the package before (old), alternated after one cold 1-mask run of each that fills its own cache; then
# whether the two codes wrote the same files (same_files.txt).
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$PWD; W=/tmp/w; O=$OUT; rm -rf $W; mkdir -p $W $O
source $R/scripts/probes/prepare128.sh
PYTHONPATH=$R/.carry/oldpkg:/tmp/site python3 -c "import medddpm.cli, medddpm.sample.sampler, medddpm.net.kernels"  # bytecode
k=0
run() {  # run CODE STATE VOLUMES ARGS...: CODE new (this tree) or old (.carry/oldpkg), each with its own cache
  local code=$1 state=$2 vols=$3; shift 3; k=$((k + 1))
  local path=$R; [ $code = old ] && path=$R/.carry/oldpkg
  PYTHONPATH=$path:/tmp/site MEDDDPM_CACHE=$W/cache-$code TORCHINDUCTOR_CACHE_DIR=$W/cache-$code/inductor \
  TRITON_CACHE_DIR=$W/cache-$code/triton python3 -m medddpm.profiling.waiting run --out $O/time_to_result.csv \
    --cache $state --volumes $vols -- "$@" 2>&1 | tail -1
  echo "$k,$code" >> $O/arms.csv
}
echo "row,arm" > $O/arms.csv
S="sample --checkpoint $W/ckpt/checkpoint.pt --quiet"
for code in new old; do run $code cold 1 $S --masks $W/masks1 --out $W/$code-o$k; done
for r in 1 2; do
  for code in new old; do run $code warm 100 $S --masks $W/masks100 --out $W/$code-h$r; done
done
for code in new old; do run $code warm 1 $S --masks $W/masks1 --out $W/$code-o$k; done
{ n=0; same=0; for f in $W/new-h1/*.nii.gz; do n=$((n + 1)); cmp -s $f $W/old-h1/$(basename $f) && same=$((same + 1)); done
  echo "new-h1 against old-h1: $same of $n files identical"
  n=0; same=0; for f in $W/new-h1/*.nii.gz; do n=$((n + 1)); cmp -s $f $W/new-h2/$(basename $f) && same=$((same + 1)); done
  echo "new-h1 against new-h2: $same of $n files identical"
  echo "distinct files in new-h1: $(md5sum $W/new-h1/*.nii.gz | cut -d' ' -f1 | sort -u | wc -l)"; } | tee $O/same_files.txt
echo "done at $SECONDS s"
