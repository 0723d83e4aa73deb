# Sourced by the measurement scripts: run SECONDS CMD... runs CMD logged to $OUT/commands.log and
# $OUT/log.txt, time-limited, printing its last lines and exit code; a failure never stops the caller.
run() {
  local limit=$1; shift
  echo "+ $*" >>"$OUT/commands.log"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/log.txt" | grep -v -e '^\s*$' | tail -${RUN_TAIL:-3}
  echo "  [rc=${PIPESTATUS[0]}, $((SECONDS - t0)) s] $*" | tee -a "$OUT/log.txt"
}
# clocks_on FILE … clocks_off: every GPU's clocks, power, temperature, utilisation and clock-event reasons
# four times a second into FILE (medddpm.profiling.clocks reads it) while the commands between them run. The logger
# is a background job of this shell: between the two, wait for your own jobs by PID, since a bare `wait` never returns.
clocks_on() {
  nvidia-smi --query-gpu="$(${PY:-python3} -c 'from medddpm.profiling.clocks import QUERY; print(QUERY)')" \
    --format=csv,nounits -lms 250 >"$1" 2>/dev/null &
  CLOCKS_PID=$!
}
clocks_off() {
  [ -n "${CLOCKS_PID:-}" ] || return 0
  kill "$CLOCKS_PID" 2>/dev/null; wait "$CLOCKS_PID" 2>/dev/null; CLOCKS_PID=
}
