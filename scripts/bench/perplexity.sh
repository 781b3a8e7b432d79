#!/usr/bin/env bash
# Quality of each weight dtype on the shipped text (tests/data/perplexity.txt, public domain):
# Pagoda's perplexity, mean KL divergence from its f32 path and top-1 agreement (the
# `perplexity` bench binary), then llama.cpp's `llama-perplexity` on the same GGUF, text and
# context (-c 512; both score the second half of each chunk): its perplexity on the Q4_1 file,
# and its KL divergence from its own F32 run (`--kl-divergence-base`).
#
# Needs scripts/bench/build-llama-server.sh run first for the llama.cpp half (skipped if absent).
# Env: PAGODA_CACHE, PAGODA_MODEL (the Q4_1 GGUF), CTX (512), THREADS (2), OUT (a temp dir).
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${PAGODA_CACHE:-$HOME/.cache/pagoda}"
MODEL="${PAGODA_MODEL:-$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
F32_MODEL="$CACHE/models/SmolLM2-135M-Instruct.F32.gguf"
TEXT="$PWD/tests/data/perplexity.txt"
CTX="${CTX:-512}"
THREADS="${THREADS:-2}"
OUT="${OUT:-$(mktemp -d)}"
BIN="$CACHE/llama.cpp/bin"

echo "== Pagoda (f32, bf16, auto = the GGUF's own blocks, q8_0)"
cargo run --release -q -p pagoda-benches --bin perplexity -- --model "$MODEL" --text "$TEXT" --ctx "$CTX" |
    tee "$OUT/pagoda.md"

if [ ! -x "$BIN/llama-perplexity" ]; then
    echo "llama-perplexity not found in $BIN: run scripts/bench/build-llama-server.sh" >&2
    exit 0
fi
echo "== llama-perplexity, F32 GGUF (the KL base)"
"$BIN/llama-perplexity" -m "$F32_MODEL" -f "$TEXT" -c "$CTX" -b "$CTX" -t "$THREADS" \
    --kl-divergence-base "$OUT/f32.kld" 2>"$OUT/llama-f32.log" >/dev/null || true
grep -E 'Final estimate' "$OUT/llama-f32.log" || tail -5 "$OUT/llama-f32.log"
echo "== llama-perplexity, Q4_1 GGUF, KL against the F32 run"
"$BIN/llama-perplexity" -m "$MODEL" -f "$TEXT" -c "$CTX" -b "$CTX" -t "$THREADS" \
    --kl-divergence-base "$OUT/f32.kld" --kl-divergence 2>"$OUT/llama-q4_1.log" >"$OUT/llama-q4_1.out" || true
grep -hE 'Mean +PPL\(Q\)|Mean +KLD|Same top|Final estimate' "$OUT/llama-q4_1.log" "$OUT/llama-q4_1.out" ||
    tail -20 "$OUT/llama-q4_1.log"
echo "logs in $OUT"
