#!/usr/bin/env bash
# A/B of `pagoda serve` configurations on one machine, in turn (A B A B ...): each
# configuration is a line "label|ENV=V ...|serve flags[|binary]" read from stdin (the
# optional binary serves that configuration instead of $PAGODA: an A/B of two
# builds; the load generator is always $PAGODA); every round
# restarts the server for each, warms it up, and runs `pagoda bench serve` at each
# concurrency. Prints one line per (round, configuration, concurrency), then per
# (round, configuration) the server's peak resident memory (VmHWM, the "Maximum
# resident set size" of `/usr/bin/time -v`) and its start log's held weight sizes.
#
#   printf '%s\n' 'spin|PAGODA_STEP_SPIN=1|' 'no-spin|PAGODA_STEP_SPIN=0|' \
#       | ROUNDS=2 CONCURRENCY=1,32 scripts/bench/serve-ab.sh
#
# Env (defaults): ROUNDS=2 CONCURRENCY=1,32 NUM_PROMPTS (max(2 x concurrency, 8))
#   INPUT_LEN=64 OUTPUT_LEN=128 PORT=18120 MODEL (the shipped Q4_1 GGUF)
#   PAGODA (default target/release/pagoda) BENCH_EXTRA (more `pagoda bench serve`
#   flags for the timed runs, e.g. "--temperature 1.0": a sampled workload).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${PAGODA_CACHE:-$HOME/.cache/pagoda}"
MODEL="${MODEL:-$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
PAGODA="${PAGODA:-$ROOT/target/release/pagoda}"
ROUNDS="${ROUNDS:-2}"
CONCURRENCY="${CONCURRENCY:-1,32}"
PORT="${PORT:-18120}"
mapfile -t CONFIGS
[ "${#CONFIGS[@]}" -gt 0 ] || { echo "serve-ab: no configurations on stdin" >&2; exit 2; }
SERVER=""
trap '[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null || true' EXIT

printf '%-6s %-20s %5s %10s %9s %9s %9s\n' round config conc "out tok/s" "TTFT p99" "ITL p50" "ITL p99"
for round in $(seq 1 "$ROUNDS"); do
    for line in "${CONFIGS[@]}"; do
        IFS='|' read -r label envs flags bin <<<"$line"
        # shellcheck disable=SC2086
        env $envs "${bin:-$PAGODA}" serve --model "$MODEL" --host 127.0.0.1 --port "$PORT" \
            --served-model-name m $flags >"/tmp/serve-ab-$PORT.log" 2>&1 &
        SERVER=$!
        for _ in $(seq 1 300); do
            curl -fsS "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break
            sleep 0.5
        done
        "$PAGODA" bench serve --base-url "http://127.0.0.1:$PORT" --model m --quiet \
            --concurrency 4 --num-prompts 4 --output-len 16 --seed 99 >/dev/null 2>&1
        for c in ${CONCURRENCY//,/ }; do
            n="${NUM_PROMPTS:-$((2 * c > 8 ? 2 * c : 8))}"
            json="$(mktemp)"
            # shellcheck disable=SC2086
            "$PAGODA" bench serve --base-url "http://127.0.0.1:$PORT" --model m --quiet \
                --concurrency "$c" --num-prompts "$n" --input-len "${INPUT_LEN:-64}" \
                --output-len "${OUTPUT_LEN:-128}" --json "$json" ${BENCH_EXTRA:-} >/dev/null 2>&1
            python3 - "$json" "$round" "$label" "$c" <<'PY'
import json, sys
path, rnd, label, c = sys.argv[1:]
m = json.load(open(path))["levels"][0]["summary"]
print(f"{rnd:<6} {label:<20} {c:>5} {m['output_throughput']:>10.1f} "
      f"{m['ttft_ms']['p99']:>9.1f} {m['itl_ms']['p50']:>9.2f} {m['itl_ms']['p99']:>9.2f}")
PY
            rm -f "$json"
        done
        hwm="$(awk '/^VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$SERVER/status" 2>/dev/null || true)"
        held="$(grep -o 'linear-layer weights: [^,]*, [0-9.]* MiB' "/tmp/serve-ab-$PORT.log" |
            sed 's/linear-layer weights: //' | paste -sd ';' - || true)"
        echo "#      $label: peak RSS ${hwm:-?} MiB; held: ${held:-?}"
        kill "$SERVER" 2>/dev/null || true
        wait "$SERVER" 2>/dev/null || true
        SERVER=""
    done
done
