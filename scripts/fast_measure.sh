#!/usr/bin/env bash
# The fast-path measurements of one GPU (issue 9), in stages that fit separate 10-minute commands.
#
#   scripts/fast_measure.sh OUT STAGE...
#
# Stages: env (info.json, nvidia-smi.csv) · peaks (bf16 matmul + copy ceilings) · ladder (bench of
# every rung, 128³, batch 1; LADDER_CONFIGS=… to choose) · batches (fast at batch 1, 2 and 4; BATCHES=…) ·
# agree (ε of every rung vs FP32 baseline) · loss (50 steps: baseline seeds 0-2, rungs seed 0) ·
# train (medddpm train --config fast on 128³ phantom NIfTIs, timed) · kernels (torch.profiler
# tables; KERNEL_CONFIGS=…) · probe (ncu's FLOP counters on known matmuls → roofline_probe.csv) ·
# passes (counter passes of roofline mode per FLOP path → ncu_passes.csv; PASS_PATHS=…) · roofline (ncu
# roofline mode: one whole step per ROOF_CONFIGS=…, ROOF_LIMIT=… seconds each) · autotune
# (bench of config.AUTOTUNED; AUTOTUNE_CONFIGS=…, AUTOTUNE_SIZE=…) · fp8 (fast against fast-fp8fwd: bench,
# kernel tables, training parity of 3 seeds; FP8_DATA=…) · skipgrad (the same for fused_skip_grads and
# triton_upsample on fast and fast-fp8fwd; parity of fast-fp8fwd-skipgrad). Each step has a time limit and a failure does not stop
# the next; everything is logged to OUT/log.txt and the commands to OUT/commands.log.
set -uo pipefail
OUT=${1:?usage: fast_measure.sh OUT STAGE...}; shift
PY=${PYTHON:-python3}
SIZE=${SIZE:-128}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
ALL=$($PY -c "from medddpm.core.config import LADDER; print(' '.join(reversed(LADDER)))")
RUNGS=${LADDER_CONFIGS:-$ALL}

RUN_TAIL=4; source "$(dirname "$0")/_run.sh"

# levers CONFIGS KERNEL_CONFIGS PARITY_CONFIG FOLDER: the stretch levers' measurements (issue 40) —
# a bench of each of CONFIGS (space-separated) in one run, the torch.profiler tables of KERNEL_CONFIGS
# (comma-separated), and PARITY_CONFIG's training parity (3 seeds, 1,000 steps at 64³ on the demo set;
# FP8_DATA: a `medddpm demo-data --n 8 --size 64` folder, written here when not given) → OUT/fast_path/FOLDER/
levers() {
  for c in $1; do
    run "${BENCH_LIMIT:-200}" $PY -m medddpm bench --model whole-head --size "$SIZE" --config "$c" --steps 20 \
      --warmup 5 --device cuda --out "$OUT/bench.csv"
  done
  run 300 $PY -m medddpm torch-kernels --model whole-head --size "$SIZE" --configs "$2" --warmup 4 --out "$OUT"
  local data=${FP8_DATA:-$(mktemp -d)/demo64}
  [ -d "$data/images" ] || run 120 $PY -m medddpm demo-data --out "$data" --n 8 --size 64
  run 400 $PY scripts/quality.py parity --out "$OUT/fast_path/$4" --data "$data" --size 64 \
    --configs "$3" --seeds 0,1,2 --steps 1000 --work "$(mktemp -d)"
  mv "$OUT/fast_path/$4/quality/"* "$OUT/fast_path/$4/" 2>/dev/null
  rmdir "$OUT/fast_path/$4/quality" 2>/dev/null
}

for stage in "$@"; do
  case $stage in
    env)
      $PY -m medddpm info --json >"$OUT/info.json"
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit \
        --format=csv >"$OUT/nvidia-smi.csv" ;;
    peaks) run 120 $PY scripts/fast_path.py peaks --out "$OUT" ;;
    ladder)
      for c in $RUNGS; do
        run "${BENCH_LIMIT:-200}" $PY -m medddpm bench --model whole-head --size "$SIZE" --config "$c" --steps 10 \
          --warmup 5 --device cuda --out "$OUT/bench.csv"
      done ;;
    batches)
      for b in ${BATCHES:-1 2 4}; do
        run 200 $PY -m medddpm bench --model whole-head --size "$SIZE" --config fast --batch $b --steps 10 --warmup 5 \
          --device cuda --out "$OUT/bench.csv"
      done ;;
    agree) run 400 $PY scripts/fast_path.py agree --out "$OUT" --size "$SIZE" --configs "$(echo $ALL | tr ' ' ,)" ;;
    loss)
      run 300 $PY scripts/fast_path.py loss --out "$OUT" --size "$SIZE" --configs baseline --seeds 0,1,2
      run 400 $PY scripts/fast_path.py loss --out "$OUT" --size "$SIZE" --configs "${LOSS_CONFIGS:-opt1,bf16,bf16-ndhwc,fast}" --seeds 0 ;;
    train)
      data=$(mktemp -d)
      run 120 $PY -m medddpm phantom --out "$data" --n 8 --size "$SIZE"
      run 300 $PY -m medddpm train --images "$data/images" --masks "$data/masks" --model whole-head --config fast \
        --size "$SIZE" --steps "${TRAIN_STEPS:-300}" --grad-accum 1 --log-every 25 --save-every 100000 \
        --device cuda --out "$data/run" --quiet
      cp "$data/run/timing.csv" "$OUT/train_timing.csv" 2>/dev/null
      cp "$data/run/log.csv" "$OUT/train_log.csv" 2>/dev/null ;;
    kernels)
      run 300 $PY -m medddpm torch-kernels --model whole-head --size "$SIZE" --configs "${KERNEL_CONFIGS:-bf16-compile-tuned,fast}" \
        --warmup 4 --out "$OUT" ;;
    probe)
      metrics=$($PY -c "from medddpm.profiling.ncu import roofline_metrics; print(','.join(roofline_metrics(['bf16', 'tf32', 'fp32'])))")
      tmp=$(mktemp -d)
      run 120 ncu --clock-control none --profile-from-start off --metrics "$metrics" --export "$tmp/probe" \
        $PY scripts/probes/roofline_probe.py run
      ncu --import "$tmp/probe.ncu-rep" --csv --page raw --print-units base >"$tmp/raw.csv"
      run 60 $PY scripts/probes/roofline_probe.py check "$tmp/raw.csv" "$OUT/roofline_probe.csv" ;;
    passes)
      # counter passes ncu needs per kernel for roofline mode's metrics of each FLOP path (or a+b)
      echo "flop_paths,passes" >"$OUT/ncu_passes.csv"
      for what in ${PASS_PATHS:-bf16 tf32 fp32}; do
        m=$($PY -c "from medddpm.profiling.ncu import roofline_metrics as r; print(','.join(r('$what'.split('+'))))")
        echo "+ ncu --metrics $m roofline_probe.py run" >>"$OUT/commands.log"
        p=$(timeout 120 ncu --clock-control none --profile-from-start off --target-processes application-only --metrics "$m" \
          $PY scripts/probes/roofline_probe.py run 2>&1 | grep -o '[0-9]* pass' | awk '{print $1}' | sort -n | uniq | paste -sd/)
        echo "$what,$p" | tee -a "$OUT/ncu_passes.csv"
      done ;;
    roofline)
      roof_configs=${ROOF_CONFIGS:-fast opt1 baseline}  # the chapter's whole-step rooflines
      # compile the fast configuration once outside ncu, so that under ncu Inductor reads its caches
      [[ " $roof_configs " == *" fast "* ]] && \
        run 200 $PY -m medddpm bench --model whole-head --size "$SIZE" --config fast --steps 2 --warmup 4
      for c in $roof_configs; do
        run "${ROOF_LIMIT:-400}" $PY -m medddpm profile --mode roofline --warmup 4 --size "$SIZE" --configs "$c" \
          --gpu-label "$($PY -c "from medddpm.core.runtime import env_info; print(env_info()['gpu_slug'])")" --out "$OUT/ncu" \
          --timeout $(( ${ROOF_LIMIT:-400} - 20 ))
      done ;;
    autotune)
      for c in ${AUTOTUNE_CONFIGS:-$($PY -c "from medddpm.core.config import AUTOTUNED; print(' '.join(k.name for k in AUTOTUNED))")}; do
        run "${BENCH_LIMIT:-400}" $PY -m medddpm bench --model whole-head --size "${AUTOTUNE_SIZE:-$SIZE}" --config "$c" \
          --steps 10 --warmup 5 --out "$OUT/bench.csv"
      done ;;
    fp8)
      # issue 40, lever 1: fast against fast-fp8fwd → OUT/fast_path/fp8_forward/
      levers "fast fast-fp8fwd" fast,fast-fp8fwd fast-fp8fwd fp8_forward ;;
    skipgrad)
      # issue 40, lever 3 and the upsampling: fast and fast-fp8fwd without and with fused_skip_grads, and
      # with triton_upsample as well (SKIP_CONFIGS=…; kernel tables: SKIP_KERNELS=…) → OUT/fast_path/skip_grads/
      levers "${SKIP_CONFIGS:-fast fast-skipgrad fast-fp8fwd fast-fp8fwd-skipgrad fast-skipgrad-up fast-fp8fwd-skipgrad-up}" \
        "${SKIP_KERNELS:-fast,fast-skipgrad,fast-fp8fwd,fast-fp8fwd-skipgrad,fast-skipgrad-up}" fast-fp8fwd-skipgrad skip_grads ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
