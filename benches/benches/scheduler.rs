//! Criterion benchmarks of one scheduler step (to be written).
fn main() {}
