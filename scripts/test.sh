#!/usr/bin/env bash
# The whole test suite: the static checks first (fmt, clippy, docs: scripts/check.sh),
# then fetches the model and test tools and runs the Rust tests (unit, property,
# conformance, real-model end-to-end) and the OpenAI-client tests.
# The fast tier without model or network is scripts/test-fast.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/check.sh
scripts/fetch-model.sh
python3 -m pip install --quiet --disable-pip-version-check openai==1.* "anthropic>=2,<3" pytest requests pyzmq msgspec
# The real router for tests/python/test_router.py (which skips, saying why, without it).
python3 -m pip install --quiet --disable-pip-version-check vllm-router==0.1.17 ||
  echo "test.sh: vllm-router==0.1.17 could not be installed; the router tests will skip" >&2
cargo build --release -p pagoda-server --bin pagoda
# Each test binary runs under scripts/test-runner.sh: bounded in time, a hang printed
# with every thread's backtrace and run once more (see the script for why).
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/test-runner.sh" \
  cargo test --workspace --no-fail-fast
if [ -d tests/python ] && ls tests/python/test_*.py >/dev/null 2>&1; then
  PAGODA_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/pagoda" python3 -m pytest -q tests/python
fi
