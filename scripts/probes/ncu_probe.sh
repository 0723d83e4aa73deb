#!/usr/bin/env bash
# Small real Nsight Compute captures of the tiny model (test fixtures for the ncu parser) and
# the ncu facts the wrapper relies on. Usage: scripts/probes/ncu_probe.sh OUT
set -uo pipefail
OUT=$1; mkdir -p "$OUT"; TMP=$(mktemp -d)
ncu --version > "$OUT/ncu_version.txt" 2>&1
ncu --list-sets > "$OUT/ncu_sets.txt" 2>&1
ncu --list-sections >> "$OUT/ncu_sets.txt" 2>&1
ncu --clock-control none --set full --metrics sass__inst_executed_per_opcode_category \
  --nvtx --nvtx-include "train_step/" --launch-count 8 --call-stack \
  --export "$TMP/tiny" --force-overwrite \
  python3 -m medddpm.profiling.workload --model tiny --size 16 --steps 3 --config baseline > "$OUT/ncu_probe.log" 2>&1
ncu --import "$TMP/tiny.ncu-rep" --csv --page raw --print-units base > "$OUT/tiny_raw.csv" 2>>"$OUT/ncu_probe.log"
ncu --import "$TMP/tiny.ncu-rep" --csv --page details --print-units base > "$OUT/tiny_details.csv" 2>>"$OUT/ncu_probe.log"
ncu --import "$TMP/tiny.ncu-rep" --csv --page raw --print-units base --print-metric-instances details \
  --metrics sass__inst_executed_per_opcode_category > "$OUT/tiny_instances.csv" 2>>"$OUT/ncu_probe.log"
# the same kernels in ncu's default (auto) units, for the parser's units test
ncu --import "$TMP/tiny.ncu-rep" --csv --page raw > "$OUT/tiny_raw_auto.csv" 2>>"$OUT/ncu_probe.log"
gzip -f "$OUT/tiny_raw.csv" "$OUT/tiny_details.csv" "$OUT/tiny_raw_auto.csv"
