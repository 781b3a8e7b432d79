#!/usr/bin/env bash
# Builds llama.cpp's `llama-server`, `llama-quantize` and `llama-perplexity` (CPU only) from the llama.cpp sources
# vendored in the PyPI sdist of llama-cpp-python, then makes the F32 GGUF of SmolLM2-135M from
# the shipped Q4_1 file (exactly the weights Pagoda dequantizes to f32), and the BF16 GGUF
# (the same weights rounded to bf16, for comparing `pagoda serve --dtype bf16`).
#
# Everything goes into a cache dir outside git: $PAGODA_CACHE/llama.cpp (default
# ~/.cache/pagoda/llama.cpp). Re-running skips the steps already done.
#
# Env: PAGODA_CACHE, PAGODA_MODEL (the Q4_1 GGUF), JOBS (default 2),
#      LLAMA_CPP_PYTHON_VERSION (default: latest on PyPI),
#      NO_AVX512=1: build for AVX2 only (no -march=native: AVX, AVX2, FMA, F16C, no
#      AVX-512), into bin-avx2/, the peer of `PAGODA_DISABLE_AVX512=1 pagoda serve`.
#      NO_AMX=1: AVX-512 (F, BW, VBMI, VNNI, BF16) without AMX, into bin-noamx/: on a Xeon
#      whose VM does not grant AMX tile state, the native build's AMX path crashes
#      llama-server at start on any quantized GGUF (SIGSEGV after "llama threadpool
#      init"; --no-repack avoids it but also turns off its x86 repacking). Pagoda uses
#      no AMX, so this is the like-for-like peer on such machines (BENCHMARKS.md).
set -euo pipefail

CACHE="${PAGODA_CACHE:-$HOME/.cache/pagoda}"
DIR="$CACHE/llama.cpp"
SRC_MODEL="${PAGODA_MODEL:-$HOME/.cache/pagoda/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
F32_MODEL="$CACHE/models/SmolLM2-135M-Instruct.F32.gguf"
BF16_MODEL="$CACHE/models/SmolLM2-135M-Instruct.BF16.gguf"
JOBS="${JOBS:-2}"
mkdir -p "$DIR" "$CACHE/models"

log() { echo "[build-llama-server] $*" >&2; }

# cmake: prefer the system one, else apt, else pip (the pip wheel ships a static binary).
if ! command -v cmake >/dev/null; then
    log "cmake missing: installing"
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        apt-get install -y -q cmake >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q cmake >/dev/null; } || true
    fi
    if ! command -v cmake >/dev/null; then
        python3 -m pip install -q cmake
        hash -r
    fi
fi
cmake --version | head -1 >&2

# The AVX2-only build sits beside the native one.
SUFFIX=""
ISA_FLAGS=(-DGGML_NATIVE=ON)
if [ "${NO_AVX512:-0}" = 1 ]; then
    SUFFIX="-avx2"
    ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF)
fi
if [ "${NO_AMX:-0}" = 1 ]; then
    # Its flags name AVX-512 (F, BW, VBMI, VNNI, BF16): on a CPU without them the binaries
    # die with SIGILL at their first vector op (seen on an AVX2-only EPYC), so refuse first.
    for f in avx512f avx512bw avx512vbmi avx512_vnni avx512_bf16; do
        grep -qw "$f" /proc/cpuinfo || { log "NO_AMX=1 builds for AVX-512 and this CPU lacks $f: use NO_AVX512=1"; exit 2; }
    done
    SUFFIX="-noamx"
    ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
fi
BIN="$DIR/bin$SUFFIX"
if [ ! -x "$BIN/llama-server" ] || [ ! -x "$BIN/llama-quantize" ] || [ ! -x "$BIN/llama-perplexity" ]; then
    # 1. The sdist (no binary wheels: we want the vendored C++ sources).
    SDIST_DIR="$DIR/sdist"
    mkdir -p "$SDIST_DIR"
    if ! ls "$SDIST_DIR"/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
        spec="llama-cpp-python${LLAMA_CPP_PYTHON_VERSION:+==$LLAMA_CPP_PYTHON_VERSION}"
        log "downloading the sdist of $spec"
        # Source only for llama-cpp-python itself; its build requirements (needed to
        # read the sdist's metadata) may come as wheels, which is much faster than
        # `--no-binary :all:` (that compiles ninja from source too), kept as fallback.
        python3 -m pip download -q --no-deps --no-binary llama-cpp-python -d "$SDIST_DIR" "$spec" ||
            python3 -m pip download -q --no-deps --no-binary :all: -d "$SDIST_DIR" "$spec"
    fi
    TARBALL="$(ls "$SDIST_DIR"/llama_cpp_python-*.tar.gz | sort -V | tail -1)"
    log "using $(basename "$TARBALL")"
    SRC="$DIR/src"
    if [ ! -d "$SRC/vendor/llama.cpp" ]; then
        rm -rf "$SRC" && mkdir -p "$SRC"
        tar -xzf "$TARBALL" -C "$SRC" --strip-components=1
    fi
    # 2. CPU-only Release build of the three targets (llama-perplexity: for
    #    scripts/bench/perplexity.sh).
    cmake -S "$SRC/vendor/llama.cpp" -B "$DIR/build$SUFFIX" -DCMAKE_BUILD_TYPE=Release \
        "${ISA_FLAGS[@]}" -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF >&2
    cmake --build "$DIR/build$SUFFIX" --config Release -j "$JOBS" --target llama-server llama-quantize llama-perplexity >&2
    mkdir -p "$BIN"
    for t in llama-server llama-quantize llama-perplexity; do
        cp "$(find "$DIR/build$SUFFIX" -type f -name "$t" -perm -u+x | head -1)" "$BIN/$t"
    done
fi
"$BIN/llama-server" --version >&2 2>&1 || true

# 3. The F32 GGUF (requantizing Q4_1 -> F32 dequantizes exactly).
if [ ! -s "$F32_MODEL" ]; then
    [ -s "$SRC_MODEL" ] || { log "source model $SRC_MODEL not found (set PAGODA_MODEL)"; exit 1; }
    log "making $F32_MODEL"
    "$BIN/llama-quantize" --allow-requantize "$SRC_MODEL" "$F32_MODEL.tmp" F32 >&2
    mv "$F32_MODEL.tmp" "$F32_MODEL"
fi
# 4. The BF16 GGUF (Q4_1 -> BF16 rounds each dequantized weight to nearest even).
if [ ! -s "$BF16_MODEL" ]; then
    log "making $BF16_MODEL"
    "$BIN/llama-quantize" --allow-requantize "$SRC_MODEL" "$BF16_MODEL.tmp" BF16 >&2
    mv "$BF16_MODEL.tmp" "$BF16_MODEL"
fi
echo "LLAMA_SERVER=$BIN/llama-server"
echo "F32_MODEL=$F32_MODEL"
echo "BF16_MODEL=$BF16_MODEL"
