#!/usr/bin/env bash
# The real training loop against its benchmark (issue 19), on 128³ phantom NIfTI files:
#
#   scripts/loop_measure.sh OUT [CONFIG...]        (default configs: baseline opt1 fast)
#
# Per configuration and grad-accum (ACCUMS, default "1 2"): `medddpm train` (the loop as a user runs
# it, default input pipeline, timed by its own read-backs) and `medddpm bench --grad-accum` of the
# same configuration in the same device run; then OUT/loop_vs_bench.csv (python -m medddpm.train.loop).
# Runs' timing CSVs, the bench rows (OUT/bench.csv), OUT/commands.log and OUT/log.txt beside it. DATA=… reuses the
# phantoms of an earlier call; rerunning appends nothing: the table is rebuilt from OUT's runs.
set -uo pipefail
OUT=${1:?usage: loop_measure.sh OUT [CONFIG...]}; shift
CONFIGS=${*:-baseline opt1 fast}
PY=${PYTHON:-python3}
SIZE=${SIZE:-128}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
DATA=${DATA:-$(mktemp -d)}
mkdir -p "$OUT" "$DATA"
RUN_TAIL=2; source "$(dirname "$0")/_run.sh"
[ -f "$OUT/info.json" ] || $PY -m medddpm info --json >"$OUT/info.json"
[ -d "$DATA/data/masks" ] || run 300 $PY -m medddpm phantom --out "$DATA/data" --n 8 --size "$SIZE"
for cfg in $CONFIGS; do
  for accum in ${ACCUMS:-1 2}; do
    # steps and read-back period per configuration: about 15 s of steady state after the first interval
    case $cfg in
      baseline*) steps=$((16 / accum)); every=$((4 / accum)) ;;
      opt*) steps=$((80 / accum)); every=$((16 / accum)) ;;
      *) steps=$((360 / accum)); every=$((60 / accum)) ;;
    esac
    name=$cfg-a$accum
    rm -rf "$DATA/run-$name"
    run "${TRAIN_LIMIT:-300}" $PY -m medddpm train --images "$DATA/data/images" --masks "$DATA/data/masks" \
      --model whole-head --config "$cfg" --size "$SIZE" --steps "$steps" --grad-accum "$accum" --log-every "$every" \
      --save-every 100000 --device cuda --out "$DATA/run-$name" --quiet
    cp "$DATA/run-$name/timing.csv" "$OUT/timing-$name.csv" 2>/dev/null
    warm=3; [ "$cfg" = baseline ] || warm=6
    run "${BENCH_LIMIT:-300}" $PY -m medddpm bench --model whole-head --config "$cfg" --size "$SIZE" \
      --grad-accum "$accum" --steps $((12 / accum > 4 ? 12 / accum : 4)) --warmup "$warm" --device cuda \
      --out "$OUT/bench.csv"
  done
done
runs=$(ls -d "$DATA"/run-* 2>/dev/null | while read -r r; do [ -f "$r/timing.csv" ] && echo "$r"; done)
run 120 $PY -m medddpm.train.loop table $runs --bench "$OUT/bench.csv" --out "$OUT/loop_vs_bench.csv"
cat "$OUT/loop_vs_bench.csv"
