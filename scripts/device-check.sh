#!/usr/bin/env bash
# The device check: Pagoda's CUDA kernels on a real GPU, in one command.
#
#   scripts/device-check.sh build   # here (Rust, nvcc venv): build + strip the test
#                                   # binaries into $DEVICE_CHECK_DIR (default
#                                   # target/device-check, well under 64 MiB)
#   scripts/device-check.sh run     # on the GPU machine (no Rust, no network): run
#                                   # them and print one table
#   scripts/device-check.sh         # both (a dry run on a machine without a GPU: the
#                                   # run stops cleanly at "no CUDA driver"/"no CUDA device")
#
# The GPU machine gets the folder as a carried path, e.g. through the device tool:
#   run(command="scripts/device-check.sh run", carry=["target/device-check"], timeout_s=480)
# What runs: kernels/cuda/tests/cuda_device.rs (naive, paged split-KV + merge, flash,
# write_kv against f64 references with the emulator tests' tolerances; the tensor cores'
# mma against the emulator's fragment-layout fallback on the same inputs), then the
# conformance suite of cuda-naive, cuda-paged and cuda-flash on `cuda:0` through the
# backends' own plan/run/write_kv (their tests' `cuda::` modules, PAGODA_REQUIRE_DEVICE
# set so that nothing skips), the linear layers' GEMM (cuda/tests/gemm_device.rs: cuBLAS
# and CUTLASS against the f64 reference), then the CUDA attention benches
# (benches/cuda_attention.rs, quick set: the ceilings, the issue's two target cases) and
# the GEMM benches (benches/cuda_gemm.rs, quick set: Llama-3-8B's linear shapes at m = 1
# and 8192, cuBLAS against CUTLASS). Then the model steps (issue 13), each with its own
# timeout and never past the overall budget:
#   greedy  (90 s)  the real SmolLM2 on --device cuda against tests/data/smollm2-greedy.json
#                   (ids equal up to each case's first reference gap under 0.5 nats); needs
#                   $DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf, which at 94 MB does not fit the
#                   64 MiB carry: the step then says so and is skipped
#   serve   (150 s) pagoda serve --device cuda (the real SmolLM2 if carried, else
#                   --load-format dummy with tests/data/smollm2-shape) + pagoda bench serve
#                   at 1, 32 and 256 streams on loopback
#   graphs  (60 s)  device_step on the SmolLM2-shaped dummy config at batch 1 (a
#                   launch-bound model: the >= 1000 tok/s target), decode steps replayed
#                   from CUDA graphs, then with --enforce-eager
#   step    (180 s) device_step on the Llama-3-8B-shaped dummy config: decode b1/b32/b128
#                   at context 512 (from CUDA graphs), prefill 8192
# DEVICE_CHECK_ONLY=greedy,serve,graphs,step (or kernels) runs a subset. At most 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${DEVICE_CHECK_DIR:-target/device-check}"
BUDGET_S="${DEVICE_CHECK_BUDGET_S:-420}"
ONLY="${DEVICE_CHECK_ONLY:-kernels,greedy,serve,graphs,step}"
SMOLLM2=SmolLM2-135M-Instruct.Q4_1.gguf
CARRY_LIMIT_MIB=64

wants() { [[ ",$ONLY," == *",$1,"* ]]; }

# The release tools of the model steps: `pagoda` (server crate) and `device_step`
# (pagoda-benches), both with --features cuda, stripped into $DIR/bin.
build_tools() {
  cargo build --release -p pagoda-server --features cuda --bin pagoda
  cargo build --release -p pagoda-benches --features cuda --bin device_step
  local target="${CARGO_TARGET_DIR:-target}/release" t
  for t in pagoda device_step; do
    cp "$target/$t" "$DIR/bin/$t"
    strip "$DIR/bin/$t"
  done
  # The SmolLM2 weights only when they fit the carry beside the binaries.
  local model="${PAGODA_CACHE:-$HOME/.cache/pagoda}/models/$SMOLLM2" used_kib model_kib
  rm -rf "$DIR/models"
  used_kib=$(du -sk "$DIR" | cut -f1)
  if [ -f "$model" ]; then
    model_kib=$(du -k "$model" | cut -f1)
    if [ $((used_kib + model_kib)) -le $((CARRY_LIMIT_MIB * 1024)) ]; then
      mkdir -p "$DIR/models" && cp "$model" "$DIR/models/"
    else
      echo "device-check: $SMOLLM2 ($((model_kib / 1024)) MiB) does not fit the ${CARRY_LIMIT_MIB} MiB carry beside $((used_kib / 1024)) MiB of binaries: the greedy step will be skipped, serve uses --load-format dummy"
    fi
  fi
}

build() {
  NVCC="${NVCC:-$(scripts/cuda-venv.sh)}"
  export NVCC
  mkdir -p "$DIR/bin"
  # "<name> <executable>" lines: the kernels' device tests, the conformance suites of
  # the three CUDA backends (their `cuda` modules), the GEMM's device tests and the CUDA
  # attention and GEMM benches.
  local exes
  exes=$( { cargo test -p pagoda-cuda-kernels --features cuda --test cuda_device --no-run \
              --message-format=json 2>/dev/null
            cargo test -p pagoda-backend-cuda-naive -p pagoda-backend-cuda-paged \
              -p pagoda-backend-cuda-flash --features cuda --test conformance --no-run \
              --message-format=json 2>/dev/null
            cargo test -p pagoda-cuda --features cuda --test gemm_device --no-run \
              --message-format=json 2>/dev/null
            cargo bench -p pagoda-benches --features cuda --bench cuda_attention \
              --bench cuda_gemm --no-run --message-format=json 2>/dev/null; } |
         python3 -c 'import json,os,sys
for l in sys.stdin:
    m = json.loads(l)
    kinds = m.get("target", {}).get("kind", [])
    # Test and bench targets only (the package binaries are built with its benches).
    if m.get("reason") == "compiler-artifact" and m.get("executable") and \
            ("test" in kinds or "bench" in kinds):
        t = m["target"]["name"]
        pkg_dir = os.path.basename(os.path.dirname(m["manifest_path"]))
        name = {"conformance": "conformance-" + pkg_dir,
                "cuda_attention": "bench-cuda_attention",
                "cuda_gemm": "bench-cuda_gemm"}.get(t, t)
        print(name, m["executable"])')
  [ "$(echo "$exes" | grep -c .)" -ge 7 ] || { echo "device-check: the build did not produce the 7 binaries" >&2; exit 1; }
  local name e
  while read -r name e; do
    cp "$e" "$DIR/bin/$name"
    strip "$DIR/bin/$name"
  done <<<"$exes"
  build_tools
  du -sh "$DIR" | sed 's/^/device-check: carry /'
  du -sh "$DIR"/bin/* | sed 's/^/device-check:   /'
}

# libcuda's folder on the GPU machine (its driver is mounted, not always in ld.so.conf);
# PAGODA_LIBCUDA_DIR names another one.
find_driver() {
  local d
  for d in ${PAGODA_LIBCUDA_DIR:-} /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/compat; do
    if [ -e "$d/libcuda.so.1" ]; then echo "$d"; return 0; fi
  done
  ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1/ {print $NF; exit}' | xargs -r dirname
}

# cuBLAS for the benches comes from the machine's own Python CUDA wheels.
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
  [ -d "$DIR/bin" ] || { echo "device-check: $DIR/bin missing: run '$0 build' first" >&2; exit 1; }
  local drv pylibs
  drv=$(find_driver || true)
  if [ -z "$drv" ]; then
    echo "device-check: no CUDA driver (libcuda.so.1 not found): nothing runs on this machine"
    # A dry run still walks the model steps, each stopping at its reason.
    if [ "${DEVICE_CHECK_DRY_RUN:-0}" = 1 ]; then T0=$(date +%s); model_steps; fi
    exit 0
  fi
  pylibs=$(find_python_cuda_libs)
  export LD_LIBRARY_PATH="$drv${pylibs:+:$pylibs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  fi
  local log status=0 start end
  log=$(mktemp)
  printf '%-58s %s\n' "check" "result" >"$log.table"
  # The conformance suites must not skip on this machine: a skip there is a failure.
  export PAGODA_REQUIRE_DEVICE=1
  # The kernels' device tests first: they stop the check cleanly where there is no GPU.
  local bin filter
  T0=$(date +%s)
  if wants kernels; then
  for bin in "$DIR"/bin/cuda_device "$DIR"/bin/conformance-* "$DIR"/bin/gemm_device; do
    [ -e "$bin" ] || continue
    start=$(date +%s)
    # The backends' binaries also hold their emulator suites: only the `cuda` modules.
    case $(basename "$bin") in conformance-*) filter="cuda::" ;; *) filter="" ;; esac
    # --nocapture: the tests print "skipped, no GPU here: ..." when there is none.
    if ! timeout "$BUDGET_S" "$bin" $filter --test-threads=1 --nocapture >"$log" 2>&1; then status=1; fi
    end=$(date +%s)
    if grep -q "skipped, no GPU here" "$log"; then
      grep -m1 "skipped, no GPU here" "$log" | sed 's/.*skipped, no GPU here: /device-check: /'
      rm -f "$log" "$log.table"
      exit 0
    fi
    grep -E '^test .* \.\.\. ' "$log" | sed -E 's/^test (.*) \.\.\. (.*)$/\1 \2/' |
      awk -v b="$(basename "$bin")" '{printf "%-58s %s\n", b "::" $1, $2}' >>"$log.table"
    [ "$status" = 0 ] || { echo "--- $(basename "$bin") output ---"; tail -n 60 "$log"; }
    echo "$(basename "$bin"): $((end - start)) s"
  done
  cat "$log.table"
  fi
  # The benches last (criterion, then their own table with the ceilings); the quick
  # set keeps the whole check within its budget.
  # Attention first, then the GEMM (the glob's order is not the run order).
  for bin in "$DIR"/bin/bench-cuda_attention "$DIR"/bin/bench-cuda_gemm; do
    [ -e "$bin" ] || continue
    wants kernels || continue
    start=$(date +%s)
    if ! PAGODA_BENCH_QUICK=1 timeout "$BUDGET_S" "$bin" --bench >"$log" 2>&1; then status=1; fi
    end=$(date +%s)
    grep -vE '^(Benchmarking|Gnuplot|Found [0-9]+ outliers|  [0-9]+ \()' "$log" | tail -n 40
    echo "$(basename "$bin"): $((end - start)) s"
  done
  rm -f "$log" "$log.table"
  model_steps || status=1
  exit "$status"
}

# Seconds a step may take: its own limit, never past the overall budget.
step_timeout() {
  local left=$((BUDGET_TOTAL_S - ($(date +%s) - T0)))
  [ "$left" -lt "$1" ] && echo "$((left > 0 ? left : 1))" || echo "$1"
}

# One row of the final table.
row() { printf '%-22s %-8s %s\n' "$1" "$2" "$3" >>"$MODEL_TABLE"; }

# A failed step's row: "no-device" (not a failure) when the reason is a missing
# driver or device, as on a machine without a GPU; otherwise FAILED with its output.
fail_row() {
  local reason
  reason=$(echo "$2" | grep -m1 -oE "no CUDA (driver|device)[^\"]*|not compiled with CUDA[^\"]*" || true)
  if [ -n "$reason" ]; then row "$1" no-device "$reason"; return 0; fi
  row "$1" FAILED "$(echo "$2" | tail -n 1)"
  echo "--- $1 output ---"; echo "$2" | tail -n 30
  return 1
}

# The tok/s column of device_step's first decode row.
tok_s() { echo "$1" | awk '/^decode b/ {for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) v = $i} END {print v}'; }

# Loopback HTTP GET that succeeds on a 2xx (the GPU machine has Python, maybe no curl).
http_ok() {
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1" 2>/dev/null
}

# The model steps (issue 13): greedy vs reference, serve + bench, device_step.
model_steps() {
  BUDGET_TOTAL_S="${DEVICE_CHECK_TOTAL_S:-470}"
  MODEL_TABLE=$(mktemp)
  local st=0 out model_args tools="$DIR/bin" smollm2="$DIR/models/$SMOLLM2" t
  printf '%-22s %-8s %s\n' "model step" "result" "detail" >"$MODEL_TABLE"
  if ! wants greedy && ! wants serve && ! wants graphs && ! wants step; then
    rm -f "$MODEL_TABLE"; return 0
  fi
  if [ ! -x "$tools/pagoda" ] || [ ! -x "$tools/device_step" ]; then
    echo "device-check: $tools/pagoda or device_step missing (an older build): model steps skipped"
    rm -f "$MODEL_TABLE"; return 1
  fi
  if wants greedy; then
    if [ -f "$smollm2" ]; then
      t=$(step_timeout 90)
      if out=$(greedy_check "$tools/pagoda" "$smollm2" "$t" 2>&1); then
        row greedy ok "$(echo "$out" | tail -n 1)"
      else
        fail_row greedy "$out" || st=1
      fi
    else
      row greedy skipped "$SMOLLM2 (94 MB) does not fit the ${CARRY_LIMIT_MIB} MiB carry"
    fi
  fi
  if wants serve; then
    if [ -f "$smollm2" ]; then model_args=(--model "$smollm2"); else
      model_args=(--load-format dummy --model tests/data/smollm2-shape); fi
    t=$(step_timeout 150)
    if out=$(serve_bench "$tools/pagoda" "$t" "${model_args[@]}" 2>&1); then
      row serve ok "${model_args[*]}; $(grep -m1 -o 'CUDA graphs: .*' "$DIR/serve.log" || echo 'no graph log line')"
      echo "$out" | tail -n 8
    else
      fail_row serve "$out" || st=1
    fi
  fi
  if wants graphs; then
    local g e
    t=$(step_timeout 30)
    if g=$(timeout "$t" "$tools/device_step" --model tests/data/smollm2-shape --load-format dummy \
        --device cuda:0 --batch-sizes 1 --context 128 --prefill-tokens 0 --warmup 10 \
        --steps 200 2>&1); then
      t=$(step_timeout 30)
      if e=$(timeout "$t" "$tools/device_step" --model tests/data/smollm2-shape \
          --load-format dummy --device cuda:0 --batch-sizes 1 --context 128 \
          --prefill-tokens 0 --warmup 10 --steps 200 --enforce-eager 2>&1); then
        row graphs ok "SmolLM2-shape b1 tok/s: graphs $(tok_s "$g"), eager $(tok_s "$e") (target >= 1000)"
      else
        fail_row graphs "$e" || st=1
      fi
    else
      fail_row graphs "$g" || st=1
    fi
  fi
  if wants step; then
    t=$(step_timeout 180)
    if out=$(timeout "$t" "$tools/device_step" --model tests/data/llama3-8b-shape \
        --load-format dummy --device cuda:0 --batch-sizes 1,32,128 --context 512 \
        --prefill-tokens 8192 --max-num-batched-tokens 8192 --warmup 2 --steps 10 \
        --prefill-reps 1 2>&1); then
      row device_step ok "8B-shaped dummy, bf16"
      echo "$out" | grep -v '^device_step:'
    else
      fail_row device_step "$out" || st=1
    fi
  fi
  cat "$MODEL_TABLE"
  rm -f "$MODEL_TABLE"
  return "$st"
}

# pagoda generate --device cuda on the reference prompts' ids, greedy; each case's ids
# must equal the reference's up to its first step whose top-1/top-2 gap is under
# 0.5 nats (past it, bf16 rounding may pick the other token).
greedy_check() {
  local pagoda=$1 model=$2 t=$3 args=() out
  mapfile -t args < <(python3 - <<'PY'
import json
for c in json.load(open("tests/data/smollm2-greedy.json"))["cases"]:
    print("--prompt-ids"); print(",".join(map(str, c["prompt_ids"])))
PY
)
  out=$(timeout "$t" "$pagoda" generate --model "$model" --device cuda:0 --json \
        --max-tokens 48 --temperature 0 "${args[@]}") || { echo "pagoda generate failed"; return 1; }
  python3 - "$out" <<'PY'
import json, sys
ref = json.load(open("tests/data/smollm2-greedy.json"))["cases"]
got = [json.loads(l) for l in sys.argv[1].splitlines() if l.startswith("{")]
assert len(got) == len(ref), f"{len(got)} outputs for {len(ref)} cases"
checked = 0
for i, (c, g) in enumerate(zip(ref, got)):
    n = next((k for k, gap in enumerate(c["gaps"]) if gap < 0.5), len(c["gaps"]))
    n = min(n, len(c["greedy_ids"]))
    if g["token_ids"][:n] != c["greedy_ids"][:n]:
        print(f"case {i}: ids differ within the first {n}: {g['token_ids'][:n]} vs {c['greedy_ids'][:n]}")
        sys.exit(1)
    checked += n
print(f"{len(ref)} cases, {checked} ids equal to the reference")
PY
}

# pagoda serve on loopback, then pagoda bench serve at 1, 32 and 256 streams.
serve_bench() {
  local pagoda=$1 t=$2 port=18123 pid rc=0 end
  shift 2
  end=$(($(date +%s) + t))
  "$pagoda" serve "$@" --device cuda:0 --host 127.0.0.1 --port "$port" \
    --max-num-seqs 256 --max-num-batched-tokens 8192 --kv-cache-memory-mib 8192 \
    --disable-log-stats >"$DIR/serve.log" 2>&1 &
  pid=$!
  until http_ok "http://127.0.0.1:$port/health"; do
    if ! kill -0 "$pid" 2>/dev/null; then tail -n 5 "$DIR/serve.log"; echo "the server exited"; return 1; fi
    [ "$(date +%s)" -lt "$end" ] || { kill "$pid"; echo "the server did not start in time"; return 1; }
    sleep 1
  done
  timeout $((end - $(date +%s))) "$pagoda" bench serve --base-url "http://127.0.0.1:$port" \
    --concurrency 1,32,256 --input-len 128 --output-len 64 \
    --token-id-range 1000..10000 --quiet || rc=1
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  return "$rc"
}

case "${1:-all}" in
  build) build ;;
  run) run ;;
  all) build; run ;;
  *) echo "usage: $0 [build|run|all]" >&2; exit 2 ;;
esac
