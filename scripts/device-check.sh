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
# and 8192, cuBLAS against CUTLASS). At most 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${DEVICE_CHECK_DIR:-target/device-check}"
BUDGET_S="${DEVICE_CHECK_BUDGET_S:-420}"

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
  du -sh "$DIR" | sed 's/^/device-check: carry /'
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
  # The benches last (criterion, then their own table with the ceilings); the quick
  # set keeps the whole check within its budget.
  # Attention first, then the GEMM (the glob's order is not the run order).
  for bin in "$DIR"/bin/bench-cuda_attention "$DIR"/bin/bench-cuda_gemm; do
    [ -e "$bin" ] || continue
    start=$(date +%s)
    if ! PAGODA_BENCH_QUICK=1 timeout "$BUDGET_S" "$bin" --bench >"$log" 2>&1; then status=1; fi
    end=$(date +%s)
    grep -vE '^(Benchmarking|Gnuplot|Found [0-9]+ outliers|  [0-9]+ \()' "$log" | tail -n 40
    echo "$(basename "$bin"): $((end - start)) s"
  done
  rm -f "$log" "$log.table"
  exit "$status"
}

case "${1:-all}" in
  build) build ;;
  run) run ;;
  all) build; run ;;
  *) echo "usage: $0 [build|run|all]" >&2; exit 2 ;;
esac
