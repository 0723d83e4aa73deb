#!/usr/bin/env bash
# Run on the device machine from the repository root, with the nibabel wheel in .carry/whl and IXI (prepare-ixi,
# uint8, test/ removed) in .carry/ixi$SIZE. The recipe A/B of issue 75: one `medddpm train` per arm, each on a GPU of
# its own (arm k on GPU k mod the GPUs; a round of as many arms as GPUs at a time), the same judge (the 16 val
# subjects held out, evaluated every EVAL_EVERY steps) and data; a 40-step run fills the compile cache first, so every
# arm starts warm.
#   scripts/probes/recipe_ab.sh SIZE "NAME FLAGS…" …
# Overrides: W (work folder, its compile cache), IXI and VAL (the data and its val subjects' count), FILL_FLAGS (the fill
# run's extra flags, e.g. a curriculum's patch shape; several fills, one per shape, separated by "|"), FILL_ONLY=1 (fill the cache and stop).
# Each arm's heldout.csv, log.csv, timing.csv, stdout and stderr come back under $OUT/NAME/, in one tarball.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/w/pycache
SIZE=${1:?usage: recipe_ab.sh SIZE ARM...}; shift
R=$PWD; W=${W:-/tmp/w}; O=$OUT/ab; mkdir -p $W $O
export PYTHONPATH=$R:/tmp/site
python3 -c "import nibabel" 2>/dev/null ||
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry/whl/*.whl || exit 1
{ nvidia-smi -L; nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch,triton,sys;print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__, sys.version.split()[0])"
  git -C $R log -1 --format=%H 2>/dev/null; git -C $R status --short 2>/dev/null | head; } > $O/env.txt 2>&1
NGPU=$(nvidia-smi -L | wc -l)
IXI=${IXI:-$R/.carry/ixi$SIZE}; VAL=${VAL:-$(ls $IXI/val/images | wc -l)}
export MEDDDPM_CACHE=$W/cache TORCHINDUCTOR_CACHE_DIR=$W/cache/inductor TRITON_CACHE_DIR=$W/cache/triton
T="python3 -m medddpm train --images $IXI/dev/images --masks $IXI/dev/masks --held-out $VAL --mask-labels brain=nonzero
   --config ${CONFIG:-fast} --size $SIZE --grad-accum 1 --eval-every ${EVAL_EVERY:-1000} --log-every ${LOG_EVERY:-250}
   --save-every 100000 --quiet"
IFS='|' read -ra fills <<< "${FILL_FLAGS:-}"; [ ${#fills[@]} = 0 ] && fills=("")
for i in "${!fills[@]}"; do  # one fill per shape ("|" between their flags); each once per work folder
  [ -f $W/filled-$i ] && continue
  CUDA_VISIBLE_DEVICES=0 timeout 400 $T --steps 40 ${fills[$i]} --out $W/fill$i > $O/fill$i.txt 2>&1 && touch $W/filled-$i
  tail -1 $O/fill$i.txt
done
[ "${FILL_ONLY:-0}" = 1 ] && exit 0
k=0; pids=()
for arm in "$@"; do
  name=${arm%% *}; flags=${arm#* }; [ "$flags" = "$name" ] && flags=
  mkdir -p $O/$name; rm -rf $W/$name
  ( t0=$(date +%s.%N)
    CUDA_VISIBLE_DEVICES=$((k % NGPU)) timeout ${ARM_S:-500} $T $flags --out $W/$name > $O/$name/stdout.txt 2> $O/$name/stderr.txt
    echo "rc $? wall $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s gpu $((k % NGPU)) flags $flags" >> $O/$name/stdout.txt
    for f in heldout log timing; do cp $W/$name/$f.csv $O/$name/ 2>/dev/null; done ) &
  pids+=($!); k=$((k + 1))
  if [ $((k % NGPU)) = 0 ]; then wait "${pids[@]}"; pids=(); fi
done
wait "${pids[@]}" 2>/dev/null
for d in $O/*/; do echo "== $(basename $d): $(tail -1 $d/stdout.txt)"; grep -h "held-out loss\|timing:" $d/stdout.txt; done
echo "done at $SECONDS s"
tar -C $OUT -czf /tmp/ab.tgz ab && rm -rf $O && mv /tmp/ab.tgz $OUT/
