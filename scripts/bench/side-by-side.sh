#!/usr/bin/env bash
# Side-by-side serving benchmark: `pagoda serve` vs llama.cpp's `llama-server` on the
# same F32 weights, same machine, same workload, run in turn (A B A B ...) for
# ROUNDS rounds; each server is restarted for every round. Per round and server:
#   pagoda bench serve --concurrency 1,8,32            (distinct 64-token prompts)
#   pagoda bench serve --concurrency 32 --shared-prefix-len 512
# then scripts/bench/summarize.py takes the median per metric and writes the
# markdown table with the ratios Pagoda / llama-server to $OUT/table.md.
#
# Env (defaults): ROUNDS=3 CONCURRENCY=1,8,32 PREFIX_CONCURRENCY=32 PREFIX_LEN=512
#   INPUT_LEN=64 OUTPUT_LEN=128 NUM_PROMPTS (default: max(2 x concurrency, 8) per level)
#   PORT=18100 THREADS=$(nproc) PAGODA_KV_MIB=1024 LLAMA_PARALLEL=32 LLAMA_CTX_PER_SLOT=768
#   PAGODA_SERVE_ARGS / LLAMA_SERVER_ARGS (extra flags) OUT (results dir, default
#   target/bench/side-by-side-<UTC time>) SKIP_BUILD=1 (use existing binaries)
#   NICE (default -10 as root, else 0): niceness of both servers and the load
#   generator, to shield the measurement from other work on a shared machine.
#   WEIGHTS=bf16: both servers load the BF16 GGUF instead (the same weights rounded to
#   bf16) and Pagoda runs with `--dtype bf16` (its bf16 GEMMs on vdpbf16ps).
#   WEIGHTS=q4_1: both load the shipped Q4_1 GGUF as it is, each at its default (Pagoda's
#   `--dtype auto` keeps the Q4_1/Q8_0 blocks: its int8 kernels).
#   WEIGHTS=fixture FIXTURE=llama-1b.Q4_K_M: both load a real-size random-weight GGUF
#   made by scripts/bench/make-fixture.sh ($PAGODA_CACHE/fixtures/$FIXTURE.gguf).
#   AVX2=1: the AVX2-only case: Pagoda under PAGODA_DISABLE_AVX512=1 against the
#   llama-server built by `NO_AVX512=1 build-llama-server.sh` (bin-avx2/).
#   PREFIX_CONCURRENCY=0 skips the shared-prefix runs.
#   LLAMA_SERVER=path (with SKIP_BUILD=1): another llama-server binary, e.g. the
#   `NO_AMX=1 build-llama-server.sh` one (bin-noamx/).
#   CLIENT=python: the load comes from scripts/bench/py_client.py instead (text prompts
#   of ~INPUT_LEN tokens, a Python asyncio streaming client as users run one), and
#   nothing is niced (NICE=0): the client competes with the server for the cores, as
#   it does on a user's machine. Shared-prefix runs are skipped in this mode.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
ROUNDS="${ROUNDS:-3}"
CONCURRENCY="${CONCURRENCY:-1,8,32}"
PREFIX_CONCURRENCY="${PREFIX_CONCURRENCY:-32}"
PREFIX_LEN="${PREFIX_LEN:-512}"
INPUT_LEN="${INPUT_LEN:-64}"
OUTPUT_LEN="${OUTPUT_LEN:-128}"
PORT="${PORT:-18100}"
THREADS="${THREADS:-$(nproc)}"
PAGODA_KV_MIB="${PAGODA_KV_MIB:-1024}"
LLAMA_PARALLEL="${LLAMA_PARALLEL:-32}"
LLAMA_CTX_PER_SLOT="${LLAMA_CTX_PER_SLOT:-768}"
OUT="${OUT:-$ROOT/target/bench/side-by-side-$(date -u +%Y%m%dT%H%M%SZ)}"
NAME=smollm2
CLIENT="${CLIENT:-pagoda}"
if [ "$CLIENT" = python ]; then
    NICE="${NICE:-0}"
elif [ "$(id -u)" = 0 ]; then NICE="${NICE:--10}"; else NICE="${NICE:-0}"; fi
mkdir -p "$OUT"

log() { echo "[side-by-side $(date -u +%H:%M:%S)] $*" >&2; }

# --- binaries and weights -------------------------------------------------------
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    if [ "${AVX2:-0}" = 1 ]; then
        eval "$(NO_AVX512=1 scripts/bench/build-llama-server.sh)"
    else
        eval "$(scripts/bench/build-llama-server.sh)"
    fi
    cargo build --release -p pagoda-server --bin pagoda >&2
else
    CACHE="${PAGODA_CACHE:-$HOME/.cache/pagoda}"
    if [ -z "${LLAMA_SERVER:-}" ]; then
        LLAMA_SERVER="$CACHE/llama.cpp/bin/llama-server"
        [ "${AVX2:-0}" = 1 ] && LLAMA_SERVER="$CACHE/llama.cpp/bin-avx2/llama-server"
    fi
    F32_MODEL="$CACHE/models/SmolLM2-135M-Instruct.F32.gguf"
    BF16_MODEL="$CACHE/models/SmolLM2-135M-Instruct.BF16.gguf"
fi
WEIGHTS="${WEIGHTS:-f32}"
case $WEIGHTS in
f32) MODEL="$F32_MODEL" ;;
bf16)
    MODEL="$BF16_MODEL"
    PAGODA_SERVE_ARGS="--dtype bf16 ${PAGODA_SERVE_ARGS:-}"
    ;;
q4_1)
    # The shipped GGUF as it is: llama-server runs its Q4_1/Q8_0 blocks, Pagoda too
    # (its default `--dtype auto`).
    MODEL="${PAGODA_MODEL:-${PAGODA_CACHE:-$HOME/.cache/pagoda}/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
    ;;
fixture)
    MODEL="${PAGODA_CACHE:-$HOME/.cache/pagoda}/fixtures/${FIXTURE:?WEIGHTS=fixture needs FIXTURE, e.g. llama-1b.Q4_K_M}.gguf"
    ;;
*) log "WEIGHTS must be f32, bf16, q4_1 or fixture"; exit 1 ;;
esac
# The AVX2-only case: every AVX-512 path of Pagoda off (kernels/src/isa.rs).
[ "${AVX2:-0}" = 1 ] && export PAGODA_DISABLE_AVX512=1
PAGODA="${CARGO_TARGET_DIR:-$ROOT/target}/release/pagoda"
for f in "$LLAMA_SERVER" "$MODEL" "$PAGODA"; do
    [ -e "$f" ] || { log "missing $f"; exit 1; }
done
# Snapshot the binary: a rebuild during the run must not change what is measured.
mkdir -p "$OUT/bin"
cp "$PAGODA" "$OUT/bin/pagoda"
PAGODA="$OUT/bin/pagoda"

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "nproc: $(nproc)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
    echo "flags: $(grep -o -w -E 'avx2|avx512f|avx512_bf16|avx512_vnni|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "mem: $(free -g | awk '/^Mem:/{print $2 " GiB"}')"
    echo "pagoda: $(git rev-parse --short HEAD) $(git status --porcelain | grep -q . && echo '(dirty tree)')"
    echo "llama-server: $("$LLAMA_SERVER" --version 2>&1 | grep -m1 version)"
    echo "model: $MODEL ($(stat -c %s "$MODEL") bytes)"
    echo "weights: $WEIGHTS ${FIXTURE:-}; avx2-only: ${AVX2:-0}; pagoda serve args: ${PAGODA_SERVE_ARGS:-}"
    echo "workload: input=$INPUT_LEN output=$OUTPUT_LEN concurrency=$CONCURRENCY prefix=$PREFIX_LEN@$PREFIX_CONCURRENCY rounds=$ROUNDS threads=$THREADS nice=$NICE client=$CLIENT"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

# --- one server at a time -------------------------------------------------------
SERVER_PID=""
start_server() { # name logfile
    local name=$1 logf=$2
    case $name in
    pagoda)
        # shellcheck disable=SC2086
        nice -n "$NICE" "$PAGODA" serve --model "$MODEL" --host 127.0.0.1 --port "$PORT" \
            --served-model-name "$NAME" --kv-cache-memory-mib "$PAGODA_KV_MIB" \
            ${PAGODA_SERVE_ARGS:-} >"$logf" 2>&1 &
        ;;
    llama)
        # shellcheck disable=SC2086
        nice -n "$NICE" "$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "$PORT" --alias "$NAME" \
            -np "$LLAMA_PARALLEL" -c $((LLAMA_PARALLEL * LLAMA_CTX_PER_SLOT)) --cont-batching \
            -t "$THREADS" --no-webui ${LLAMA_SERVER_ARGS:-} >"$logf" 2>&1 &
        ;;
    esac
    SERVER_PID=$!
    for _ in $(seq 1 600); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            log "$name exited during start-up; see $logf"
            tail -20 "$logf" >&2
            exit 1
        fi
        if curl -fsS "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.5
    done
    log "$name did not become ready"
    exit 1
}

stop_server() {
    [ -n "$SERVER_PID" ] || return 0
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.2
    done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}
trap stop_server EXIT

bench() { # name round variant args...
    local name=$1 round=$2 variant=$3
    shift 3
    local extra=()
    # llama-server closes streamed connections: dial afresh for each request.
    [ "$name" = llama ] && extra+=(--new-connection-per-request)
    [ -n "${NUM_PROMPTS:-}" ] && extra+=(--num-prompts "$NUM_PROMPTS")
    if [ "$CLIENT" = python ]; then
        [ "$variant" = main ] || return 0
        local a=("$@")
        python3 scripts/bench/py_client.py --base-url "http://127.0.0.1:$PORT" --model "$NAME" \
            --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --label "$name" \
            --json "$OUT/$name-$variant-r$round.json" ${NUM_PROMPTS:+--num-prompts "$NUM_PROMPTS"} \
            --concurrency "${a[1]}" --seed "$round" 2>&1 | tee "$OUT/$name-$variant-r$round.txt" >&2
        return 0
    fi
    nice -n "$NICE" "$PAGODA" bench serve --base-url "http://127.0.0.1:$PORT" --model "$NAME" \
        --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --label "$name" --quiet \
        --json "$OUT/$name-$variant-r$round.json" "${extra[@]}" "$@" \
        | tee "$OUT/$name-$variant-r$round.txt" >&2
}

for round in $(seq 1 "$ROUNDS"); do
    for name in pagoda llama; do
        log "round $round/$ROUNDS: $name"
        start_server "$name" "$OUT/$name-r$round.log"
        bench "$name" "$round" main --concurrency "$CONCURRENCY" --seed "$round" \
            --plot "$OUT/$name-main-r$round.png"
        if [ "$PREFIX_CONCURRENCY" != 0 ]; then
            bench "$name" "$round" prefix --concurrency "$PREFIX_CONCURRENCY" \
                --shared-prefix-len "$PREFIX_LEN" --seed $((round + 1000))
        fi
        # Peak resident set of the server over the whole round.
        grep -E '^Vm(HWM|RSS)' "/proc/$SERVER_PID/status" | tee "$OUT/$name-r$round.rss" >&2
        stop_server
    done
done

python3 scripts/bench/summarize.py "$OUT" | tee "$OUT/table.md"
log "results in $OUT"
