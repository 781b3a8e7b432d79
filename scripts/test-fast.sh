#!/usr/bin/env bash
# The fast tier: unit, property and conformance tests of the crates that need neither the
# model nor the network (core, kernels, scheduler, selector, every attention backend, the
# testkit, the example backend, the backends umbrella and the load generator). Extra arguments go to `cargo test` (e.g. `-- --quiet`).
# The whole suite, with the real model and the static checks, is scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test \
  -p pagoda-core -p pagoda-kernels -p pagoda-scheduler -p pagoda-selector \
  -p pagoda-backend-naive -p pagoda-backend-paged -p pagoda-backend-flash \
  -p pagoda-cuda -p pagoda-backend-cuda-naive -p pagoda-backend-cuda-paged -p pagoda-backend-cuda-flash -p pagoda-backend-testkit -p pagoda-backend-example \
  -p pagoda-backends -p pagoda-loadgen "$@"
