#!/usr/bin/env bash
# Profiles `pagoda serve` under load: samples the server with `perf record`
# (cpu-clock, so it works in VMs without hardware counters) while
# `pagoda bench serve` drives it, then prints where the time goes by thread,
# by symbol and by category (GEMM, attention, elementwise, sampling, HTTP, idle).
#
# Env (defaults): CONCURRENCY=32 NUM_PROMPTS (2 x concurrency, min 8) INPUT_LEN=64
#   OUTPUT_LEN=128 SHARED_PREFIX_LEN=0 PORT=18101 FREQ=499 MODEL (the F32 GGUF)
#   PAGODA_SERVE_ARGS OUT (default target/bench/profile-<UTC time>)
#   SERVER_KIND=llama profiles llama-server instead (same flags as side-by-side.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
CACHE="${PAGODA_CACHE:-$HOME/.cache/pagoda}"
MODEL="${MODEL:-$CACHE/models/SmolLM2-135M-Instruct.F32.gguf}"
CONCURRENCY="${CONCURRENCY:-32}"
PORT="${PORT:-18101}"
FREQ="${FREQ:-499}"
OUT="${OUT:-$ROOT/target/bench/profile-$(date -u +%Y%m%dT%H%M%SZ)}"
PAGODA="$ROOT/target/release/pagoda"
mkdir -p "$OUT"
command -v perf >/dev/null || { echo "perf not found (Debian: apt-get install linux-perf)" >&2; exit 1; }

if [ "${SERVER_KIND:-pagoda}" = llama ]; then
    # The peer, started as side-by-side.sh starts it (for CPU-use comparison).
    LLAMA_SERVER="${LLAMA_SERVER:-$CACHE/llama.cpp/bin/llama-server}"
    "$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "$PORT" --alias m -np 32 -c 24576 \
        --cont-batching -t "$(nproc)" --no-webui >"$OUT/serve.log" 2>&1 &
    NEW_CONN=(--new-connection-per-request)
else
    # shellcheck disable=SC2086
    "$PAGODA" serve --model "$MODEL" --host 127.0.0.1 --port "$PORT" --served-model-name m \
        ${PAGODA_SERVE_ARGS:-} >"$OUT/serve.log" 2>&1 &
    NEW_CONN=()
fi
SERVER=$!
PERF=""
cleanup() {
    [ -n "$PERF" ] && kill -INT "$PERF" 2>/dev/null || true
    kill -TERM "$SERVER" 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 1 300); do
    curl -fsS "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break
    sleep 0.5
done

run_bench() {
    local extra=("${NEW_CONN[@]}")
    [ -n "${NUM_PROMPTS:-}" ] && extra+=(--num-prompts "$NUM_PROMPTS")
    "$PAGODA" bench serve --base-url "http://127.0.0.1:$PORT" --model m --quiet \
        --concurrency "$CONCURRENCY" --input-len "${INPUT_LEN:-64}" --output-len "${OUTPUT_LEN:-128}" \
        --shared-prefix-len "${SHARED_PREFIX_LEN:-0}" --json "$OUT/bench.json" "${extra[@]}"
}
# Warm up (first-touch of weights and KV pages) outside the profile.
"$PAGODA" bench serve --base-url "http://127.0.0.1:$PORT" --model m --quiet --concurrency 4 \
    "${NEW_CONN[@]}" --num-prompts 4 --output-len 16 --seed 99 >/dev/null

perf record -e cpu-clock -F "$FREQ" -p "$SERVER" -o "$OUT/perf.data" 2>"$OUT/perf-record.log" &
PERF=$!
sleep 1
# CPU time of the server (utime + stime, clock ticks) around the run: how many
# cores it kept busy.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }
t0=$(cpu_ticks); w0=$(date +%s.%N)
run_bench | tee "$OUT/bench.txt"
t1=$(cpu_ticks); w1=$(date +%s.%N)
python3 -c "import os,sys; hz=os.sysconf('SC_CLK_TCK'); c=($t1-$t0)/hz; w=$w1-$w0; print(f'server CPU {c:.1f} s over {w:.1f} s wall = {c/w:.2f} cores busy')" | tee "$OUT/cpu.txt"
kill -INT "$PERF"
wait "$PERF" 2>/dev/null || true
PERF=""
grep -E '^Vm(HWM|RSS)' "/proc/$SERVER/status" | tee "$OUT/rss.txt"

perf report -i "$OUT/perf.data" --stdio --no-children --sort comm --percent-limit 0.5 2>/dev/null \
    | grep -v '^#' | sed '/^$/d' > "$OUT/by-thread.txt"
perf report -i "$OUT/perf.data" --stdio --no-children --sort dso,symbol --percent-limit 0.05 2>/dev/null \
    | grep -v '^#' | sed '/^$/d' > "$OUT/by-symbol.txt"
echo "--- by thread"; head -20 "$OUT/by-thread.txt"
echo "--- top symbols"; head -40 "$OUT/by-symbol.txt"
echo "--- by category"
python3 "$ROOT/scripts/bench/categorize-profile.py" "$OUT/by-symbol.txt" | tee "$OUT/by-category.txt"
echo "results in $OUT"
