#!/usr/bin/env bash
# A recipe A/B at 64³ on one GPU (issue 75): IXI 64³, one arm at a time on GPU 0, each arm the same judge (the 16 val
# subjects, evaluated every 1,000 volumes), the compile cache filled for every input shape first (recipe_ab.sh).
# Sets of arms (SET, the first argument):
#   batch — train's default recipe at --batch 1, 2 and 4, the rate scaled with the batch (data/results/h200/recipe/,
#           run batch-64; as scripts/probes/batch64.sh at 1dcab9c). At 64³ a step of one volume is bound by more than
#           its voxels (a 32³ step takes half a 64³ one), so a batch of 2 or 4 may cost far less than 2 or 4 steps.
#   muon  — train's default recipe with --optimizer muon (the hidden weight matrices by Muon at Adam's update RMS, so
#           at the same rate and schedule) at the default rate, 2.5× and 5× it, a shorter schedule, and Adam beside
#           them on the same GPU. Declared before any ran; seed 0 throughout, the default recipe's earlier seed-0 runs
#           (b1-12k, cosine-12k) the baseline.
#   muon2 — a second look at Muon, declared before it ran: the 6,000-step schedule (the record of set muon, added there
#           after reading) on seeds 1 and 2, and train's default (Adam, 12,000 steps) on seed 1 beside it; then every
#           arm's best.pt sampled by DDPM 250 under fast on the 16 val masks × seeds 0–2 and measured against the template
#           (scripts/anatomy.py, as chapter 14's runs); then the 128³ fast step, Adam and Muon, 300 steps each on the
#           64³ scans resized to 128³, to time Muon's step after its launch cut. `ab64.sh muon2 after` runs that part alone.
#   muon3 — muon2's two Muon arms again, the compile cache filled by a Muon run first (muon2's fill ran Adam, so each
#           Muon arm compiled its own step: the record's rule is a warm cache). Declared before it ran; one call, in
#           the foreground: `ab64.sh muon3 pipeline` with OUT the device's $OUT (each arm's files land as it ends).
# Run on the device machine from the repository root, with .carry/whl (nibabel) and .carry/d64 (IXI 64³, uint8):
#   ab64.sh SET start S   — the data copied, the pipeline started in its own session (setsid); waits S s
#   ab64.sh SET wait S    — waits up to S s for it to finish, prints where it is
#   ab64.sh SET collect   — $OUT/ab.tgz: every arm's heldout.csv, log.csv, timing.csv and output, finished or not
set -uo pipefail
W=/tmp/w64; R=$W/repo; A=$W/ab; O=$A/out  # recipe_ab.sh's work folder and its $OUT
SET=${1:?usage: ab64.sh batch|muon|muon2|muon3 start S|wait S|collect|pipeline}; shift
case $SET in
  batch) FILLS="|--batch 2|--batch 4"
    ARMS=("b2-6k --batch 2 --steps 6000 --lr 2.8e-4 --eval-every 500"
          "b4-3k --batch 4 --steps 3000 --lr 4e-4 --eval-every 250"
          "b1-12k --steps 12000"
          "b4-4k --batch 4 --steps 4000 --lr 4e-4 --eval-every 250"
          "b2-8k --batch 2 --steps 8000 --lr 2.8e-4 --eval-every 500") ;;
  muon) FILLS=""
    ARMS=("mu-12k --optimizer muon --steps 12000"
          "mu5e-4-12k --optimizer muon --lr 5e-4 --steps 12000"
          "mu-8k --optimizer muon --steps 8000"
          "mu1e-3-12k --optimizer muon --lr 1e-3 --steps 12000"
          "adam-12k --steps 12000") ;;
  muon2) FILLS=""
    ARMS=("mu-6k-s1 --optimizer muon --steps 6000 --seed 1"
          "mu-6k-s2 --optimizer muon --steps 6000 --seed 2"
          "adam-12k-s1 --steps 12000 --seed 1") ;;
  muon3) FILLS="--optimizer muon"
    ARMS=("mu-6k-s1w --optimizer muon --steps 6000 --seed 1"
          "mu-6k-s2w --optimizer muon --steps 6000 --seed 2") ;;
  *) echo "unknown set $SET: batch, muon, muon2 or muon3" >&2; exit 2 ;;
esac

after_muon2() {  # every arm's samples judged, then the 128³ step of each optimizer timed (set muon2)
  export PYTHONPATH=$PWD:/tmp/site PYTHONPYCACHEPREFIX=/tmp/w/pycache MEDDDPM_CACHE=$A/cache \
    TORCHINDUCTOR_CACHE_DIR=$A/cache/inductor TRITON_CACHE_DIR=$A/cache/triton; unset PYTHONDONTWRITEBYTECODE
  mkdir -p $O/anatomy $O/step128 /tmp/d64/val/images /tmp/d64/val/masks
  for id in $(awk -F, '$4 == "val" {print $2}' /tmp/d64/split.csv); do  # val/: the held-out subjects (the last 16 of dev/)
    for k in images masks; do ln -sf /tmp/d64/dev/$k/$id.nii.gz /tmp/d64/val/$k/; done; done
  for arm in "${ARMS[@]}"; do n=${arm%% *}
    CUDA_VISIBLE_DEVICES=0 timeout 400 python3 scripts/anatomy.py --data /tmp/d64 --split val --checkpoint $A/$n/best.pt \
      --out $O/anatomy/$n --name $n --runs ddpm250:fast --seeds 0,1,2 --work $A/samples --device cuda --batch 4 \
      > $O/anatomy/$n.txt 2>&1; echo "anatomy $n rc $? $(date +%s)" >> $W/times.txt
  done
  for opt in adam muon; do  # the 64³ scans resized to 128³ (train resizes): the step's shape is what is timed
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m medddpm train --images /tmp/d64/dev/images --masks /tmp/d64/dev/masks \
      --mask-labels brain=nonzero --config fast --size 128 --grad-accum 1 --steps 300 --log-every 50 --save-every 100000 --optimizer $opt --quiet \
      --out $A/step128-$opt > $O/step128/$opt.txt 2>&1; echo "step128 $opt rc $? $(date +%s)" >> $W/times.txt
    cp $A/step128-$opt/timing.csv $O/step128/$opt-timing.csv 2>/dev/null
  done
  tar -C $O -czf $O/after.tgz anatomy step128
}

where() {
  cat $W/times.txt 2>/dev/null
  for f in $A/*/heldout.csv; do [ -f $f ] && echo "$f: $(tail -1 $f)"; done
  for f in $O/ab/*.txt $O/ab/*/stdout.txt; do [ -f $f ] && echo "$f: $(tail -n 2 $f)"; done
}

case ${1:?usage: ab64.sh SET start S|wait S|collect|pipeline} in
  start)
    mkdir -p $W /tmp/d64 && cp -r .carry/d64/. /tmp/d64/
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry/whl/*.whl || exit 1
    rm -rf $R && mkdir -p $R && cp -r medddpm scripts pyproject.toml $R/ && rm -f $W/times.txt
    echo "64³: $(ls /tmp/d64/dev/images | wc -l) images, $(ls /tmp/d64/dev/masks | wc -l) masks"
    (cd $R && setsid nohup bash scripts/probes/ab64.sh $SET pipeline > $W/pipeline.txt 2>&1 < /dev/null &)
    sleep ${2:-500}; where ;;
  pipeline)
    echo "start $(date +%s)" >> $W/times.txt
    [ $SET = muon3 ] && { mkdir -p $W; W=$A IXI=$PWD/.carry/d64 VAL=16 FILL_FLAGS="$FILLS" ARM_S=200 \
                            bash scripts/probes/recipe_ab.sh 64 "${ARMS[@]}"; exit; }  # the caller's $OUT
    W=$A IXI=/tmp/d64 VAL=16 OUT=$O FILL_FLAGS="$FILLS" ARM_S=400 bash scripts/probes/recipe_ab.sh 64 "${ARMS[@]}"
    [ $SET = muon2 ] && after_muon2
    echo "DONE $(date +%s) rc $?" >> $W/times.txt ;;
  after) (setsid nohup bash -c "source scripts/probes/ab64.sh muon2 defs; after_muon2; echo DONE-after >> $W/times.txt" \
           > $W/after.txt 2>&1 < /dev/null &); sleep ${2:-300}; where; tail -3 $W/after.txt ;;
  defs) ;;  # sourced: the functions only
  wait)
    for i in $(seq 1 $((${2:-560} / 10))); do grep -q "^DONE " $W/times.txt 2>/dev/null && break; sleep 10; done
    where ;;
  collect)
    if [ -f $O/ab.tgz ]; then cp $O/ab.tgz $OUT/
    else  # unfinished: what the arms have written so far
      for d in $A/*/; do n=$(basename $d); [ -f $d/log.csv ] || continue; mkdir -p $O/ab/$n; cp $d/*.csv $O/ab/$n/ 2>/dev/null; done
      tar -C $O -czf $OUT/ab.tgz ab; fi
    cp $O/after.tgz $W/pipeline.txt $W/times.txt $OUT/ 2>/dev/null; ls -la $OUT; where ;;
esac
