#!/usr/bin/env bash
# The long soak (RELIABILITY.md): `pagoda serve` under SECS seconds of STREAMS
# concurrent clients with random prompt and output lengths, streaming or not,
# and hang-ups; prints the SOAK summary line (requests, errors, p99, RSS growth,
# final gauges) and fails on any server error, a leaked request or KV block, or
# RSS growth after warm-up. Defaults: 600 s, 256 streams.
#   scripts/soak.sh [SECS] [STREAMS]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh >/dev/null
export PAGODA_SOAK_SECS="${1:-600}" PAGODA_SOAK_STREAMS="${2:-256}"
export PAGODA_SOAK_KV_MIB="${PAGODA_SOAK_KV_MIB:-1024}"
cargo test --release -p pagoda-server --test soak soak_random_load_with_aborts -- --exact --nocapture 2>&1 \
  | tee "${TMPDIR:-/tmp}/pagoda-soak.log" | grep -E "^SOAK|test result|panicked"
