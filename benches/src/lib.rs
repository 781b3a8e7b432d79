//! Benchmark support: this machine's ceilings (memory bandwidth, f32 GEMM rate,
//! [`ceilings`]) and the attention shapes every backend is measured on
//! ([`attn`]), shared by the criterion benches and the `ceilings` / `attn_table`
//! binaries.

pub mod attn;
pub mod ceilings;
