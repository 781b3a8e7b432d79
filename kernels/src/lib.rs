//! CPU math kernels for the Llama forward pass: GEMM/GEMV (`out = x · wᵀ`; the
//! model runs the packed GEMMs of [`packed`] and [`packed_bf16`]; [`matmul`] holds
//! their shared checks and the slow reference), RMS norm, rotary embeddings, SwiGLU, argmax and softmax. Behind
//! the `cuda` feature (reserved, empty for now) CUDA kernels will live.
//!
//! It is also the one place for the CPU helpers the attention backends share:
//! [`Isa`] (the only CPU-feature probe, honouring `PAGODA_DISABLE_AVX512=1`),
//! [`exp_fast`] (the one vectorised exp), the [`simd`] vector types, the KV cache
//! element types as the kernels read them ([`kv_elem`]: f32, bf16, f16 and FP8 E4M3
//! ([`fp8`]), widened in registers), the paged-cache walk of [`blocks`], and the
//! one per-row attention arithmetic both CPU backends run ([`attn`]: fixed-size
//! splits, so a row's bits do not depend on the batch).
//!
//! Every fast kernel has a slow, obviously correct `*_ref` twin that the property
//! tests in `tests/` compare against. Parallel kernels use rayon's global pool only,
//! so callers size one pool for the whole process.

pub mod act;
pub mod attn;
pub mod blocks;
pub mod dispatch;
pub mod error;
pub mod fp8;
pub mod isa;
pub mod kv_elem;
pub mod matmul;
pub mod norm;
pub mod packed;
pub mod packed_bf16;
pub mod quant;
pub mod rope;
pub mod simd;

pub use act::{
    argmax, exp_fast, first_nan_or_inf, gelu_tanh_mul_fused, gelu_tanh_mul_ref, log_softmax,
    log_softmax_ref, max_index, silu_mul, silu_mul_fused, silu_mul_ref, softmax,
};
pub use blocks::StepBlocks;
pub use dispatch::{bf16_path, gemm_paths, GemmPath, GemmPaths};
pub use error::KernelError;
pub use fp8::E4M3;
pub use isa::Isa;
pub use kv_elem::KvElem;
pub use matmul::matmul_t_ref;
pub use norm::{add_rms_norm, rms_norm, rms_norm_ref};
pub use packed::{matmul_packed, PackedMatrix, PANEL};
pub use packed_bf16::{matmul_packed_bf16, PackedMatrixBf16};
pub use quant::{matmul_quant, QuantFormat, QuantKernel, QuantMatrix};
pub use rope::{inv_freq, rope_ref, Llama3Scaling, RopeCache};
