//! Benchmark support: this machine's ceilings (memory bandwidth, f32 GEMM rate,
//! [`ceilings`]) and the attention shapes every backend is measured on
//! ([`attn`]; a CUDA device's ceilings in `device_ceilings`, feature `cuda`), shared by the criterion benches and the `ceilings` / `attn_table`
//! binaries; and the unpacked matmul family ([`unpacked`]), the baseline the
//! packed GEMMs are measured against (`benches/matmul.rs`, `bin/matmul_ab.rs`).

pub mod attn;
pub mod ceilings;
#[cfg(feature = "cuda")]
pub mod device_ceilings;
pub mod unpacked;
