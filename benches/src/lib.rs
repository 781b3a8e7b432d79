//! Benchmark support: this machine's ceilings (memory bandwidth, f32 GEMM rate,
//! [`ceilings`]) and the attention shapes every backend is measured on
//! ([`attn`]), shared by the criterion benches and the `ceilings` / `attn_table`
//! binaries; and the unpacked matmul family ([`unpacked`]), the baseline the
//! packed GEMMs are measured against (`benches/matmul.rs`, `bin/matmul_ab.rs`).
//! With the `cuda` feature, `cuda_ceilings`: the device's copy bandwidth and cuBLAS
//! bf16 rate, which `cuda_attention`, `cuda_gemm` and `device_step` compare against.

pub mod attn;
pub mod ceilings;
#[cfg(feature = "cuda")]
pub mod cuda_ceilings;
pub mod unpacked;
