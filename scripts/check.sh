#!/usr/bin/env bash
# Static checks, run first by scripts/test.sh so they fail fast (no model, no network):
# formatting, clippy on every target with warnings as errors (the lints are in the root
# Cargo.toml's [workspace.lints], e.g. every `unsafe` block needs a `// SAFETY:` comment),
# and the docs with warnings (broken intra-doc links, ...) as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1 && command -v rustup >/dev/null; then
    rustup component add "$c"
  fi
done
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --workspace --no-deps
