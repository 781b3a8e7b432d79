//! The linear layers' GEMM: `out[m, n] = x[m, k] · w[n, k]ᵀ`, the same everywhere.
//!
//! x and out are row-major activations (m = tokens), w the weight row-major
//! `[out_features, in_features]` as PyTorch and GGUF store it; sums in f32. x and w share
//! one dtype (bf16, f16 or f32); out is x's dtype or f32 ([`check_dtypes`]).
//!
//! * [`gemm_host`]: host memory (the `emu` device and tests), plain Rust with rayon;
//!   batch-invariant (a row's result does not depend on m or the other rows);
//!   [`gemm_host_ref`] is its f64 reference.
//! * `DeviceGemm` (feature `cuda`): one entry point on a `cuda:N` device, backed by cuBLAS
//!   (`cublasGemmEx`, f32 compute) or CUTLASS (crate `pagoda-cutlass`), chosen by
//!   [`GemmImpl`]: no allocation and no host synchronization per call.

#[cfg(feature = "cuda")]
mod cublas;
#[cfg(feature = "cuda")]
mod device;
mod host;
mod types;

#[cfg(feature = "cuda")]
pub use device::DeviceGemm;
pub use host::{gemm_host, gemm_host_ref};
pub use pagoda_cuda_kernels::{Dtype, Element};
pub use types::{check_dtypes, operand_lens, GemmError, GemmImpl};
