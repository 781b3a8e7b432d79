#!/usr/bin/env bash
# Cargo's target runner for `scripts/test.sh` (CARGO_TARGET_<triple>_RUNNER): runs one
# test binary with a wall-clock bound, so that a hung test costs minutes, not the
# whole CI budget, and says where it hung.
#
# Why: one CI run (stop 34) spent its 90 minutes inside tests/tests/spec_decode.rs,
# a binary that takes 9 s here: a deadlock of the step pool with several engines in
# one process (fixed in engine/src/step_pool.rs, with a test), seen once in ~100 local
# runs. So that the next such bug costs minutes and leaves its evidence: a binary
# still running after PAGODA_TEST_BINARY_TIMEOUT seconds (default 480; the slowest
# takes ~200 s on 2 cores) gets every thread's backtrace printed (gdb, when
# installed), is killed, and is run once more; a second hang, or any failure, fails
# as before. The first hang is printed loudly ("test-runner: HUNG"), never hidden.
set -uo pipefail
limit="${PAGODA_TEST_BINARY_TIMEOUT:-480}"

run_once() {
  "$@" &
  local pid=$!
  # The watchdog: after the limit, the backtraces, then the kill (exit 137 below).
  (
    # A TERM (the test ended) ends the sleep too: no sleeper outlives the test.
    trap 'kill "$s" 2>/dev/null; exit 0' TERM
    sleep "$limit" </dev/null >/dev/null 2>&1 &
    s=$!
    wait "$s"
    kill -0 "$pid" 2>/dev/null || exit 0
    echo "test-runner: HUNG: $* still running after ${limit} s (pid $pid); its threads:" >&2
    if command -v gdb >/dev/null 2>&1; then
      timeout 120 gdb -p "$pid" -batch -ex "thread apply all bt 40" 2>&1 | grep -E '^(Thread|#)' >&2 || true
    fi
    touch "$flag"
    kill -9 "$pid" 2>/dev/null
  ) &
  local dog=$!
  wait "$pid"
  local rc=$?
  kill "$dog" 2>/dev/null
  wait "$dog" 2>/dev/null
  return "$rc"
}

flag="$(mktemp -u "${TMPDIR:-/tmp}/pagoda-test-hung.XXXXXX")"
start=$SECONDS
run_once "$@"
rc=$?
if [ -e "$flag" ]; then
  rm -f "$flag"
  echo "test-runner: HUNG once: running $1 again" >&2
  run_once "$@"
  rc=$?
fi
# Each binary's wall time, so that a CI log shows where its budget went.
echo "test-runner: $(basename "$1") rc=$rc in $((SECONDS - start)) s" >&2
exit "$rc"
