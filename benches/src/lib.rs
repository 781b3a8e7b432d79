//! Criterion benchmarks.
