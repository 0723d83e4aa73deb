# Sourced by the measurement scripts: run SECONDS CMD... runs CMD logged to $OUT/commands.log and
# $OUT/log.txt, time-limited, printing its last lines and exit code; a failure never stops the caller.
run() {
  local limit=$1; shift
  echo "+ $*" >>"$OUT/commands.log"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/log.txt" | grep -v -e '^\s*$' | tail -${RUN_TAIL:-3}
  echo "  [rc=${PIPESTATUS[0]}, $((SECONDS - t0)) s] $*" | tee -a "$OUT/log.txt"
}
