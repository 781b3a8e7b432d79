#!/usr/bin/env bash
# The device check: Pagoda on a real GPU in one command, within one 10-minute call.
#
#   scripts/device-check.sh build            # here (Rust + the PyPI nvcc venv): the bundle
#   scripts/device-check.sh bundle           # the same
#   scripts/device-check.sh run --out DIR    # there (no Rust, no network): the check
#       [--device cuda|emu]                  # emu: the rehearsal on a CPU (reduced sizes)
#       [--deadline SECONDS]                 # one overall deadline (default 480)
#
# The bundle ($DEVICE_CHECK_DIR, default target/device-check) is self-contained: this
# script, bin/ (the stripped test, bench and tool binaries, built with --features cuda;
# gzip-compressed when the stripped total would not fit) and data/ (the small
# fixtures: the tiny model families with their transformers references, the dummy
# model configs). `build` prints every size and fails when the bundle exceeds 60 MiB or,
# with the repository's tracked files beside it (the device tool carries both), 64 MiB.
# Copy the bundle anywhere and run `./device-check.sh run --out DIR` inside it.
#
# `run` takes its steps in order, correctness first, then speed; each step is its own
# process with its own time limit, never past the overall deadline, and a failing or
# timed-out step never stops the next. After every step the results are in DIR (at most
# 3 files): summary.md (one table, rewritten after each step), results.jsonl (one line
# per step) and raw-logs.gz (every step's output, one gzip member per step: `zcat`).
# So a call cut off at any point still returns what ran. proptest runs at most
# $PROPTEST_CASES cases (default 32) with bounded shrinking.
#
# Steps (cuda; the emu rehearsal runs the same steps, the device ones skipping with
# their reason, the model ones on `--device emu` at reduced sizes):
#   kernels          cuda_device: naive, paged (split + merge), flash, write_kv vs f64
#                    references; the tensor cores' mma vs the emulator's fragment layout
#   model-kernels    cuda_model_device: model.cu on the GPU vs the emulator at model sizes
#   conformance-*    the conformance suite of cuda-naive, cuda-paged, cuda-flash on cuda:0
#   gemm             gemm_device: cuBLAS and CUTLASS vs the f64 reference
#   greedy           pagoda generate --device cuda:0 --dtype float32 on the tiny family
#                    fixtures the device forward runs (qwen2: QKV bias; mistral: sliding
#                    window), 3 prompts x 10 tokens: ids equal to the CPU path's (same
#                    binary), and reported against the transformers references
#   graphs           the same prompts with CUDA graphs and with --enforce-eager: equal ids
#   bench-attention  the attention ceilings and kernels (quick set)
#   bench-gemm       the GEMM ceilings and Llama-3-8B's linear shapes (quick set)
#   device-step      device_step at Llama-3-8B shape (dummy bf16): decode b1/b32/b128 at
#                    context 512 (graphs), prefill 8192
#   serve            pagoda serve (SmolLM2-shaped dummy) + pagoda bench serve at 1/32/256
#                    streams on loopback
# DEVICE_CHECK_ONLY=step1,step2 runs a subset.
set -uo pipefail # no -e: every step's status is handled, none stops the run

SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
HERE="$(dirname "$SELF")"
if [ -d "$HERE/bin" ] && [ -d "$HERE/data" ]; then
  # Inside a bundle.
  ROOT="$HERE"
  BUNDLE="$HERE"
else
  ROOT="$(cd "$HERE/.." && pwd)"
  BUNDLE="${DEVICE_CHECK_DIR:-$ROOT/target/device-check}"
fi
cd "$ROOT" || exit 1
BUNDLE_LIMIT_MIB=60
CARRY_LIMIT_MIB=64

# ---- build -------------------------------------------------------------------------

# "<name> <executable>" of the test and bench targets cargo built (JSON messages on stdin).
artifacts() {
  python3 -c 'import json,os,sys
for l in sys.stdin:
    try:
        m = json.loads(l)
    except ValueError:
        continue
    kinds = m.get("target", {}).get("kind", [])
    if m.get("reason") == "compiler-artifact" and m.get("executable") and \
            ("test" in kinds or "bench" in kinds):
        t = m["target"]["name"]
        pkg_dir = os.path.basename(os.path.dirname(m["manifest_path"]))
        name = {"conformance": "conformance-" + pkg_dir.replace("cuda-", ""),
                "cuda_attention": "bench-attention",
                "cuda_gemm": "bench-gemm"}.get(t, t)
        print(name, m["executable"])'
}

build() {
  set -e
  NVCC="${NVCC:-$(scripts/cuda-venv.sh)}"
  export NVCC
  local bin="$BUNDLE/bin" data="$BUNDLE/data" exes name e f
  rm -rf "$BUNDLE" && mkdir -p "$bin" "$data"
  exes=$( {
    cargo test -p pagoda-cuda-kernels --features cuda --test cuda_device --test cuda_model_device \
      --no-run --message-format=json
    cargo test -p pagoda-backend-cuda-naive -p pagoda-backend-cuda-paged \
      -p pagoda-backend-cuda-flash --features cuda --test conformance --no-run --message-format=json
    cargo test -p pagoda-cuda --features cuda --test gemm_device --no-run --message-format=json
    cargo bench -p pagoda-benches --features cuda --bench cuda_attention --bench cuda_gemm \
      --no-run --message-format=json
  } | artifacts)
  [ "$(echo "$exes" | grep -c .)" -ge 8 ] || { echo "device-check: expected 8 test/bench binaries, got: $exes" >&2; exit 1; }
  while read -r name e; do cp "$e" "$bin/$name"; done <<<"$exes"
  cargo build --release -p pagoda-server --features cuda --bin pagoda
  cargo build --release -p pagoda-benches --features cuda --bin device_step
  for f in pagoda device_step; do cp "${CARGO_TARGET_DIR:-target}/release/$f" "$bin/$f"; done
  strip "$bin"/*
  # The fixtures the run reads (the tracked tree may not be there).
  cp -r tests/data/families tests/data/tiny-dummy tests/data/smollm2-shape \
    tests/data/llama3-8b-shape "$data/"
  cp "$SELF" "$BUNDLE/device-check.sh"
  local kib
  kib=$(du -sk "$BUNDLE" | cut -f1)
  if [ "$kib" -gt $((BUNDLE_LIMIT_MIB * 1024 * 3 / 4)) ]; then
    # Stripped binaries compress ~3x; `run` unpacks them into a temporary folder.
    echo "device-check: $((kib / 1024)) MiB stripped: compressing the binaries (gzip -9)"
    for f in "$bin"/*; do gzip -9 "$f"; done
  fi
  set +e
  echo "device-check: bundle $BUNDLE"
  du -sh "$bin"/* "$data" | sed 's/^/device-check:   /'
  kib=$(du -sk "$BUNDLE" | cut -f1)
  local tree_kib
  tree_kib=$(git ls-files -z 2>/dev/null | du --files0-from=- -sck 2>/dev/null | tail -n 1 | cut -f1)
  tree_kib=${tree_kib:-0}
  echo "device-check: bundle size $((kib / 1024)).$(((kib % 1024) * 10 / 1024)) MiB (limit ${BUNDLE_LIMIT_MIB} MiB); with the tracked tree ($((tree_kib / 1024)) MiB) $(((kib + tree_kib) / 1024)) MiB (carry limit ${CARRY_LIMIT_MIB} MiB)"
  if [ "$kib" -gt $((BUNDLE_LIMIT_MIB * 1024)) ] || [ $((kib + tree_kib)) -gt $((CARRY_LIMIT_MIB * 1024)) ]; then
    echo "device-check: the bundle is too large" >&2
    exit 1
  fi
}

# ---- run: plumbing -----------------------------------------------------------------

json_str() {
  python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"
}

# Rewrites summary.md from the rows so far (the file is complete after every step).
write_summary() {
  {
    echo "# Device check ($DEVICE)"
    echo
    echo "Started $START_UTC, deadline ${DEADLINE_S} s; $(($(date +%s) - T0)) s elapsed."
    echo "$MACHINE"
    echo
    echo "| step | result | seconds | detail |"
    echo "| --- | --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
  } >"$OUT/summary.md.tmp" && mv "$OUT/summary.md.tmp" "$OUT/summary.md"
}

# One step: `step NAME LIMIT_S` runs `$SELF __step NAME` in its own process group under
# the smaller of its limit and what is left of the deadline, then records its result.
step() {
  local name=$1 limit=$2 left t rc result detail log start secs
  if [ -n "${DEVICE_CHECK_ONLY:-}" ] && [[ ",$DEVICE_CHECK_ONLY," != *",$name,"* ]]; then return 0; fi
  left=$((DEADLINE_S - ($(date +%s) - T0) - 5))
  log="$WORK/$name.log"
  : >"$log"
  : >"$WORK/$name.detail"
  start=$(date +%s)
  if [ "$left" -lt 5 ]; then
    rc=-1 result="not run" detail="the ${DEADLINE_S} s deadline was reached"
  else
    t=$((limit < left ? limit : left))
    timeout --kill-after=5 "$t" "$SELF" __step "$name" >"$log" 2>&1 </dev/null
    rc=$?
    detail=$(tail -n 1 "$WORK/$name.detail" 2>/dev/null)
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      result=TIMEOUT detail="after ${t} s${detail:+; $detail}"
    elif grep -q "skipped, no GPU here\|benches skipped: \|no CUDA driver\|no CUDA device" "$log" &&
      ! grep -q "^test result: FAILED" "$log"; then
      # A device step on a machine without one (the rehearsal): its reason, not a failure.
      result=no-device
      detail=$(grep -m1 -oE "(skipped, no GPU here: |benches skipped: )?no CUDA (driver|device)[^\"]{0,80}" "$log" || echo "no GPU")
    elif [ "$rc" = 0 ]; then
      result=ok
    else
      result=FAILED
      [ -n "$detail" ] || detail=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-200)
    fi
  fi
  secs=$(($(date +%s) - start))
  # no-device is the rehearsal's expected result; on a GPU machine it is a failure.
  [ "$result" = ok ] || { [ "$result" = no-device ] && [ "$DEVICE" = emu ]; } || STATUS=1
  ROWS+=("| $name | $result | $secs | ${detail//|/\\|} |")
  write_summary
  echo "{\"step\": $(json_str "$name"), \"device\": \"$DEVICE\", \"result\": \"$result\", \"rc\": $rc, \"seconds\": $secs, \"detail\": $(json_str "$detail")}" >>"$OUT/results.jsonl"
  { echo "===== $name: $result (rc $rc, $secs s) ====="; cat "$log"; } | gzip -c >>"$OUT/raw-logs.gz"
  echo "device-check: $name: $result ($secs s) $detail"
}

# A step's one-line detail (the last one written wins).
detail() { echo "$*" >>"$WORK/$STEP.detail"; }

# A test binary: `tbin NAME [FILTER]`; the detail sums its "test result" lines.
tbin() {
  local b="$BIN/$1" out rc
  shift
  [ -x "$b" ] || { detail "$b missing"; return 1; }
  out=$("$b" "$@" --test-threads="${TEST_THREADS:-8}" --nocapture 2>&1)
  rc=$?
  echo "$out"
  detail "$(echo "$out" | awk '/^test result:/ {p += $4; f += $6; i += $8} END {printf "%d passed, %d failed, %d ignored", p, f, i}')"
  return "$rc"
}

# `pagoda generate --json` ids: one JSON list per line, in prompt order.
gen_ids() {
  "$BIN/pagoda" generate --json --temperature 0 --ignore-eos "$@" |
    python3 -c 'import json,sys
for l in sys.stdin:
    if l.startswith("{"):
        print(json.dumps(json.loads(l)["token_ids"]))'
}

# The reference prompts of a family fixture as --prompt-ids arguments.
family_prompts() {
  python3 - "$DATA/families/$1/reference.json" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1]))["prompts"]:
    print("--prompt-ids"); print(",".join(map(str, p["ids"])))
PY
}

# ---- run: the steps ----------------------------------------------------------------

step_greedy() {
  local fam args cpu dev ref n=0 same=0 refok=0 fams
  # The families the device forward runs (qwen3's Q/K norms, gemma2's post-norms and
  # soft caps are CPU-only so far: models::device_unsupported).
  fams=${GREEDY_FAMILIES:-qwen2 mistral}
  for fam in $fams; do
    mapfile -t args < <(family_prompts "$fam")
    cpu=$(gen_ids --model "$DATA/families/$fam" --device cpu --dtype float32 --max-tokens 10 --max-num-seqs 4 "${args[@]}") || { detail "$fam: cpu run failed"; return 1; }
    dev=$(gen_ids --model "$DATA/families/$fam" --device "$DEV" --dtype float32 --max-tokens 10 --max-num-seqs 4 "${args[@]}") || { detail "$fam: $DEV run failed"; return 1; }
    ref=$(python3 -c 'import json,sys
for p in json.load(open(sys.argv[1]))["prompts"]: print(json.dumps(p["greedy"][:10]))' "$DATA/families/$fam/reference.json")
    echo "$fam cpu: $cpu"; echo "$fam $DEV: $dev"; echo "$fam transformers: $ref"
    n=$((n + 1))
    [ "$cpu" = "$dev" ] && same=$((same + 1))
    [ "$ref" = "$dev" ] && refok=$((refok + 1))
  done
  detail "$same/$n families: $DEV ids == cpu ids (f32, 10 tokens, 3 prompts each); $refok/$n == transformers"
  [ "$same" = "$n" ]
}

step_graphs() {
  local args g e
  mapfile -t args < <(family_prompts qwen2)
  g=$(gen_ids --model "$DATA/families/qwen2" --device "$DEV" --dtype bfloat16 --max-tokens 24 --max-num-seqs 4 "${args[@]}") || return 1
  e=$(gen_ids --model "$DATA/families/qwen2" --device "$DEV" --dtype bfloat16 --max-tokens 24 --max-num-seqs 4 --enforce-eager "${args[@]}") || return 1
  echo "graphs: $g"; echo "eager: $e"
  if [ "$g" = "$e" ]; then detail "graphs == eager (3 prompts x 24 tokens, bf16)"; else detail "graphs != eager"; return 1; fi
}

step_bench() {
  local b="$BIN/$1" out rc
  [ -x "$b" ] || { detail "$b missing"; return 1; }
  out=$(PAGODA_BENCH_QUICK=1 "$b" --bench 2>&1)
  rc=$?
  echo "$out" | grep -vE '^(Benchmarking|Gnuplot|Found [0-9]+ outliers|  [0-9]+ \()'
  detail "$(echo "$out" | grep -m1 -E '^ceilings|skipped' | cut -c1-160)"
  return "$rc"
}

step_device_step() {
  local out
  if [ "$DEVICE" = cuda ]; then
    out=$("$BIN/device_step" --model "$DATA/llama3-8b-shape" --load-format dummy --device cuda:0 \
      --batch-sizes 1,32,128 --context 512 --prefill-tokens 8192 --max-num-batched-tokens 8192 \
      --warmup 2 --steps 10 --prefill-reps 1 2>&1) || { echo "$out"; return 1; }
  else
    out=$("$BIN/device_step" --model "$DATA/tiny-dummy" --load-format dummy --device emu \
      --batch-sizes 1,4 --context 16 --prefill-tokens 32 --max-num-batched-tokens 32 \
      --warmup 1 --steps 2 --prefill-reps 1 2>&1) || { echo "$out"; return 1; }
  fi
  echo "$out"
  # The first decode row and the prefill row, columns squeezed.
  detail "$(echo "$out" | awk '/^(decode b1 |prefill )/ {$1 = $1; printf "%s%s", sep, $0; sep = "; "}' | cut -c1-200)"
}

http_ok() {
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1" 2>/dev/null
}

step_serve() {
  local port=18123 pid rc=0 conc lens model
  if [ "$DEVICE" = cuda ]; then
    model="$DATA/smollm2-shape" conc=1,32,256 lens=(--input-len 128 --output-len 64)
    set -- --max-num-seqs 256 --max-num-batched-tokens 8192 --kv-cache-memory-mib 8192
  else
    model="$DATA/tiny-dummy" conc=1,2 lens=(--input-len 8 --output-len 4)
    set -- --max-num-seqs 4 --max-num-batched-tokens 32 --num-kv-blocks 64 --block-size 16
  fi
  "$BIN/pagoda" serve --load-format dummy --model "$model" --device "$DEV" --host 127.0.0.1 \
    --port "$port" --disable-log-stats "$@" >"$WORK/serve.log" 2>&1 &
  pid=$!
  until http_ok "http://127.0.0.1:$port/health"; do
    if ! kill -0 "$pid" 2>/dev/null; then cat "$WORK/serve.log"; detail "the server exited"; return 1; fi
    sleep 1
  done
  "$BIN/pagoda" bench serve --base-url "http://127.0.0.1:$port" --concurrency "$conc" \
    "${lens[@]}" --token-id-range 10..200 --quiet || rc=1
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  cat "$WORK/serve.log"
  detail "$(grep -m1 -o 'CUDA graphs: .*' "$WORK/serve.log" | cut -c1-120) concurrency $conc"
  return "$rc"
}

# Runs inside the step's own process (`$SELF __step NAME`).
one_step() {
  STEP=$1
  case "$STEP" in
    env)
      uname -a; nproc; free -g 2>/dev/null
      if command -v nvidia-smi >/dev/null; then nvidia-smi; fi
      ls -la "$BIN"
      detail "$(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1 || echo "no nvidia-smi")" ;;
    kernels) tbin cuda_device ;;
    model-kernels) tbin cuda_model_device ;;
    conformance-naive | conformance-paged | conformance-flash) tbin "$STEP" "$CONF_FILTER" ;;
    gemm) tbin gemm_device ;;
    greedy) step_greedy ;;
    graphs) step_graphs ;;
    bench-attention | bench-gemm) step_bench "$STEP" ;;
    device-step) step_device_step ;;
    serve) step_serve ;;
    *) echo "no step $STEP"; return 2 ;;
  esac
}

# libcuda's folder on the GPU machine (its driver is mounted, not always in ld.so.conf).
find_driver() {
  local d
  for d in ${PAGODA_LIBCUDA_DIR:-} /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/compat; do
    if [ -e "$d/libcuda.so.1" ]; then echo "$d"; return 0; fi
  done
  ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1/ {print $NF; exit}' | xargs -r dirname
}

# cuBLAS for the benches and the GEMM comes from the machine's Python CUDA wheels.
find_python_cuda_libs() {
  python3 - 2>/dev/null <<'PY' || true
import glob, os, site
dirs = []
for s in site.getsitepackages():
    dirs += glob.glob(os.path.join(s, "nvidia", "*", "lib"))
print(":".join(dirs))
PY
}

run() {
  DEVICE=cuda OUT="" DEADLINE_S=${DEVICE_CHECK_DEADLINE_S:-480}
  while [ $# -gt 0 ]; do
    case "$1" in
      --device) DEVICE=$2; shift 2 ;;
      --out) OUT=$2; shift 2 ;;
      --deadline) DEADLINE_S=$2; shift 2 ;;
      *) echo "device-check run: unknown argument $1" >&2; exit 2 ;;
    esac
  done
  [ -n "$OUT" ] || { echo "device-check run: --out DIR is required" >&2; exit 2; }
  case "$DEVICE" in
    cuda) DEV=cuda:0 CONF_FILTER="cuda::"; export PAGODA_REQUIRE_DEVICE=1 ;;
    emu) DEV=emu CONF_FILTER="cuda::" ;;
    *) echo "device-check run: --device cuda or emu" >&2; exit 2 ;;
  esac
  [ -d "$BUNDLE/bin" ] || { echo "device-check: $BUNDLE/bin missing: run '$0 build' first" >&2; exit 1; }
  mkdir -p "$OUT" && rm -f "$OUT/summary.md" "$OUT/results.jsonl" "$OUT/raw-logs.gz"
  T0=$(date +%s) START_UTC=$(date -u +%FT%TZ) STATUS=0 ROWS=()
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  BIN="$BUNDLE/bin"
  if compgen -G "$BIN/*.gz" >/dev/null; then
    # A compressed bundle: unpack beside the work files.
    mkdir -p "$WORK/bin"
    for f in "$BIN"/*.gz; do gzip -dc "$f" >"$WORK/bin/$(basename "$f" .gz)"; done
    chmod +x "$WORK/bin"/*
    BIN="$WORK/bin"
  fi
  DATA="$BUNDLE/data"
  [ -d "$DATA" ] || DATA="$ROOT/tests/data"
  local drv pylibs
  drv=$(find_driver || true)
  pylibs=$(find_python_cuda_libs)
  LD_LIBRARY_PATH="${drv:+$drv:}${pylibs:+$pylibs:}${LD_LIBRARY_PATH:-}"
  MACHINE="Machine: $(nproc) cores; libcuda: ${drv:-none found}."
  export LD_LIBRARY_PATH DEVICE DEV DATA BIN WORK CONF_FILTER GREEDY_FAMILIES="${GREEDY_FAMILIES:-}"
  export PROPTEST_CASES="${PROPTEST_CASES:-32}" PROPTEST_MAX_SHRINK_ITERS="${PROPTEST_MAX_SHRINK_ITERS:-64}"
  export PROPTEST_MAX_SHRINK_TIME="${PROPTEST_MAX_SHRINK_TIME:-10000}" RUST_LOG="${RUST_LOG:-info}"
  write_summary
  # Correctness first, then speed. Limits are per step; the deadline bounds them all.
  local r=1
  [ "$DEVICE" = emu ] && r=2 # the rehearsal's model steps are emulated: shorter limits
  step env 20
  step kernels 90
  step model-kernels 60
  step conformance-naive 60
  step conformance-paged 60
  step conformance-flash 60
  step gemm 45
  step greedy $((120 / r))
  step graphs $((60 / r))
  step bench-attention 90
  step bench-gemm 60
  step device-step $((120 / r))
  step serve $((120 / r))
  echo "device-check: results in $OUT (summary.md, results.jsonl, raw-logs.gz)"
  cat "$OUT/summary.md"
  exit "$STATUS"
}

case "${1:-}" in
  build | bundle) build ;;
  run) shift; run "$@" ;;
  __step) one_step "$2" ;;
  *) echo "usage: $0 build|bundle | run --out DIR [--device cuda|emu] [--deadline S]" >&2; exit 2 ;;
esac
