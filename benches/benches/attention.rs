//! Criterion comparisons of every registered attention backend (to be written).
fn main() {}
