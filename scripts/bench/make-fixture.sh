#!/usr/bin/env bash
# Makes a random-weight GGUF at a named Llama shape with SmolLM2's tokenizer, quantized by
# llama.cpp's `llama-quantize` (built by build-llama-server.sh), for benchmarks at real
# model sizes. Fixtures live in $PAGODA_CACHE/fixtures (default ~/.cache/pagoda/fixtures),
# never in git.
#
# Usage: make-fixture.sh SHAPE [TYPE...]
#   SHAPE: llama-1b (16 layers, hidden 2048, 32/8 heads, FFN 8192), llama-3b (28, 3072,
#          24/8, 8192) or llama-8b (32, 4096, 32/8, 14336)
#   TYPE:  llama-quantize's type names, default Q4_K_M Q4_0 Q8_0
# Prints the path of each fixture. Re-running skips what exists.
# Env: PAGODA_CACHE, PAGODA_MODEL (the GGUF whose tokenizer is copied),
#      LLAMA_QUANTIZE (a llama-quantize binary; default: the one build-llama-server.sh builds).
set -euo pipefail

SHAPE="${1:?usage: make-fixture.sh SHAPE [TYPE...]}"
shift
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(Q4_K_M Q4_0 Q8_0)
CACHE="${PAGODA_CACHE:-$HOME/.cache/pagoda}"
OUT="$CACHE/fixtures"
TOK="${PAGODA_MODEL:-$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUT"
log() { echo "[make-fixture] $*" >&2; }

[ -s "$TOK" ] || { log "tokenizer source $TOK not found (scripts/fetch-model.sh, or set PAGODA_MODEL)"; exit 1; }
python3 -c 'import gguf' 2>/dev/null || python3 -m pip install -q gguf
QUANTIZE="${LLAMA_QUANTIZE:-$CACHE/llama.cpp/bin/llama-quantize}"
if [ ! -x "$QUANTIZE" ]; then
    log "llama-quantize missing: running build-llama-server.sh"
    "$HERE/build-llama-server.sh" >/dev/null
fi

F16="$OUT/$SHAPE.F16.gguf"
if [ ! -s "$F16" ]; then
    log "writing $F16 (random weights)"
    nice -n 19 python3 "$HERE/make_fixture.py" "$SHAPE" "$F16.tmp" --tokenizer-from "$TOK"
    mv "$F16.tmp" "$F16"
fi
for t in "${TYPES[@]}"; do
    q="$OUT/$SHAPE.$t.gguf"
    if [ ! -s "$q" ]; then
        log "quantizing to $t"
        nice -n 19 "$QUANTIZE" "$F16" "$q.tmp" "$t" >&2
        mv "$q.tmp" "$q"
    fi
    echo "$q"
done
