#!/usr/bin/env bash
# Creates (once) the CUDA toolkit venv that `--features cuda` builds use, and prints
# the path of its nvcc. Idempotent: a venv whose pins already match is left alone.
#
# Why a venv from PyPI: the CI machines have no CUDA install and no GPU; the toolkit
# wheels carry nvcc/ptxas/headers and need no CUDA_HOME.
# Why exactly 13.0: the GPU machine's driver 580 JIT-compiles PTX up to ISA 9.0 only;
# nvcc 13.5 writes `.version 9.5`, which that driver refuses. The `cuda-toolkit`
# meta package leaves nvvm/crt unpinned (pip then pulls 13.5 and ptxas fails), so
# every wheel is pinned here by hand. `nvidia-cuda-cuobjdump` has no 13.0 release on
# PyPI (13.2 is the oldest): it is not installed; nvcc's `-Xptxas -v` is enough for
# the spill check. `nvidia-cutlass` carries CUTLASS's C++ headers
# (`site-packages/cutlass_library/source/include`), which kernels/cutlass compiles against.
set -euo pipefail

CACHE="${PAGODA_CACHE:-$HOME/.cache/pagoda}"
VENV="$CACHE/cuda-venv"
PINS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
)
# Headers only: without --no-deps pip would add cuda-python, numpy, scipy (~300 MiB) for
# CUTLASS's Python generator, which the build does not run.
NODEPS=(nvidia-cutlass==4.2.0.0)
STAMP="$VENV/.pagoda-pins"
WANT="$(printf '%s\n' "${PINS[@]}" "${NODEPS[@]}")"

nvcc_path() {
  "$VENV/bin/python" - <<'PY'
import sysconfig, os
p = os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cu13", "bin", "nvcc")
print(p)
PY
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$(nvcc_path)" ]; then
  nvcc_path
  exit 0
fi

mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}" >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${NODEPS[@]}" >&2
NVCC="$(nvcc_path)"
if [ ! -x "$NVCC" ]; then
  echo "cuda-venv.sh: nvcc not found at $NVCC after install" >&2
  exit 1
fi
# The wheels ship ptxas/nvcc without the executable bit on some pip versions.
chmod +x "$(dirname "$NVCC")"/* 2>/dev/null || true
"$NVCC" --version >&2
printf '%s\n' "$WANT" >"$STAMP"
echo "$NVCC"
