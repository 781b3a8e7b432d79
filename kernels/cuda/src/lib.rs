//! Pagoda's CUDA kernels (attention and the model forward's row/elementwise kernels),
//! usable without a GPU.
//!
//! The kernels live in `cu/*.cu` (one file per family: `write_kv`, `paged` and its
//! `merge`, `model`, plus the `mma_probe`); a CUDA backend crate's own attention kernels
//! live in its folder and are described here by the same [`AttnKernel`] struct
//! (`cuda-naive`'s `naive.cu`, `cuda-flash`'s `flash.cu`). Each is written once and
//! built two ways:
//!
//! * always, for the host, by g++ through the SIMT emulator `emu/simt.h`: the
//!   [`emu`] module (attention) and the [`emu_model`] module (embedding, RMSNorm, fused
//!   residual add + RMSNorm, RoPE + paged KV write, SwiGLU/GeGLU, row gather, argmax,
//!   casts, and the families' Q/K norms, soft cap, MoE routing and expert sum) run
//!   them on host slices, checking every length and index first (bad input
//!   is an [`Error`], never a panic or undefined behaviour). Slow (an OS thread per CUDA
//!   thread), exact in logic: it is what the tests run;
//! * with the `cuda` feature, by nvcc into one fatbin per file (SASS sm_80/sm_90 + PTX
//!   compute_80); the `cuda` module loads them through cudarc (driver opened at run time)
//!   and launches the same parameter structs (`CudaKernels::rms_norm`, ... for `model.cu`).
//!
//! The launch parameters ([`AttnParams`], [`WriteKvParams`], [`EmbedParams`],
//! [`NormParams`], [`RopeKvParams`], [`GluParams`], [`GatherParams`], [`ArgmaxParams`],
//! [`CastParams`], [`QkNormParams`], [`SoftCapParams`], [`MoeRouteParams`],
//! [`MoeAccParams`]) are `#[repr(C)]` mirrors of `cu/params.h`; their geometry ([`Launch`])
//! comes from the same host code on both paths.
//! docs/gpu.md has the build, the emulator's limits and the device check.

pub mod attn;
pub mod call;
pub mod emu;
pub mod emu_launch;
pub mod emu_model;
pub mod emu_model_families;
mod ffi;
mod geometry;
pub mod graph;
pub mod params;
#[doc(hidden)]
pub mod selftest;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
mod cuda_model;
#[cfg(feature = "cuda")]
mod model_entries;

pub use attn::{AttnKernel, PAGED};
pub use call::Call;
pub use params::{
    ArgmaxParams, AttnParams, CastParams, EmbedParams, GatherParams, GluParams, Launch,
    MmaProbeParams, MoeAccParams, MoeRouteParams, NormParams, QkNormParams, RopeKvParams,
    SoftCapParams, SplitPlan, WriteKvParams, MOE_MAX_TOP_K,
};

/// Element type of q/out/K/V (f32 only where cheap: `write_kv`, `paged`, `naive`).
/// The discriminants are the kernels' ABI (`PG_F32`, `PG_BF16`, `PG_F16` in params.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Dtype {
    /// IEEE binary32.
    F32 = 0,
    /// bfloat16.
    Bf16 = 1,
    /// IEEE binary16.
    F16 = 2,
}

impl Dtype {
    /// The suffix of this dtype's kernel names (`pg_merge_states_bf16`, ...).
    pub fn kernel_suffix(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }
}

/// A host element type the kernels take: `f32`, `half::bf16`, `half::f16`.
pub trait Element: Copy + Default + Send + Sync + sealed::Sealed + 'static {
    /// Its kernel dtype.
    const DTYPE: Dtype;
}
impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
}
impl Element for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
}
impl Element for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
}
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// Head dims with a `paged` kernel, per dtype (a lane group of 16-byte vectors must tile
/// a warp: `head_dim / (16 / size_of::<T>())` divides 32).
pub fn paged_head_dims(dtype: Dtype) -> &'static [usize] {
    match dtype {
        Dtype::F32 => &[64, 128],
        Dtype::Bf16 | Dtype::F16 => &[64, 128, 256],
    }
}

/// Where `common.cuh` and `params.h` are (the headers every kernel file includes, and
/// through them the emulator): for tools that build a kernel file outside cargo, such
/// as the sanitizer runs of `pagoda-cuda-testkit`.
pub const INCLUDE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cu");

/// Query heads one `paged` CTA serves at most; a larger GQA group takes more CTAs.
pub const PAGED_MAX_GROUP: usize = 8;

/// What can go wrong, on either path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An argument is inconsistent (a length, an index, a range).
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// No kernel for this combination.
    #[error("{kernel}: no kernel for {dtype:?} with head dim {head_dim}")]
    Unsupported {
        /// Kernel family.
        kernel: &'static str,
        /// Element type asked for.
        dtype: Dtype,
        /// Head dim asked for.
        head_dim: usize,
    },
    /// libcuda could not be loaded.
    #[error("no CUDA driver found (libcuda.so could not be loaded)")]
    NoDriver,
    /// The driver sees no device (or not this ordinal).
    #[error("no CUDA device{0}")]
    NoDevice(String),
    /// Any other driver error.
    #[error("CUDA driver: {0}")]
    Driver(String),
}

/// The error of a launch that made a misaligned 16-byte access (a GPU would fault).
pub(crate) fn misaligned(kernel: &'static str) -> Error {
    invalid(
        "alignment",
        format!("{kernel} made a 16-byte vector access at an address not a multiple of 16 (a GPU faults: misaligned address)"),
    )
}

pub(crate) fn invalid(what: &'static str, detail: impl Into<String>) -> Error {
    Error::Invalid {
        what,
        detail: detail.into(),
    }
}
