//! `cuda-naive`: reference attention on CUDA (naive.cu): f32/bf16/f16, any head dim and block size, decode and prefill, sliding window and logit soft-capping.
//!
//! The fallback of the CUDA backends (its priority is below cuda-paged and cuda-flash,
//! above every CPU backend), e.g. for f32 prefill where cuda-flash has no kernel, and
//! the GPU's reference: one block per (token, head), f32 accumulation, keys in chunks
//! of one per thread with an online softmax kept in shared memory, so any head dim fits.
//! Valid on the `cuda` and `emu` devices; on `emu` the kernel runs on host buffers
//! through the SIMT emulator. The crate owns its kernel: the `.cu` file, the one-line
//! `build.rs` (`pagoda_cuda_build::backend`), the [`NAIVE_CU`] description and the
//! [`KERNEL`] the backend type [`pagoda_cuda::attn::CudaAttention`] launches; the
//! runtime reasons (q and KV dtypes equal, a usable CUDA device, a window of at least
//! one key, a positive soft cap) come from [`pagoda_cuda::attn::runtime_reasons`].

use pagoda_core::{
    register_backend, AttentionBackend, AttentionConfig, BackendRegistration, Capabilities,
    CoreError, GraphSupport, InvalidReason, Role,
};
use pagoda_cuda::attn::{CudaAttention, Kernel, ALL_DTYPES};
use pagoda_cuda_kernels::{AttnKernel, AttnParams, Dtype, Launch};

/// The registered name.
pub const NAME: &str = "cuda-naive";

extern "C" {
    // cu/naive.cu's host part, in the static library build.rs made.
    fn pg_naive_launch(p: *const AttnParams) -> Launch;
    fn pg_emu_naive(p: *const AttnParams, dtype: i32) -> i32;
}

#[cfg(pagoda_cuda)]
const FATBIN: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/naive.fatbin")));
#[cfg(not(pagoda_cuda))]
const FATBIN: Option<&[u8]> = None;

/// One entry per dtype, any head dim.
fn entry(dtype: Dtype, _head_dim: usize) -> Option<&'static str> {
    Some(match dtype {
        Dtype::F32 => "pg_naive_f32",
        Dtype::Bf16 => "pg_naive_bf16",
        Dtype::F16 => "pg_naive_f16",
    })
}

/// `cu/naive.cu`, compiled (see [`AttnKernel`]).
pub static NAIVE_CU: AttnKernel = AttnKernel {
    name: "naive",
    launch: pg_naive_launch,
    emu: pg_emu_naive,
    fatbin: FATBIN,
    entry,
    max_dyn_shared_bytes: 0,
};

/// What the backend type needs to know of it (see [`Kernel`]).
pub static KERNEL: Kernel = Kernel {
    name: "naive",
    role: Role::Both,
    dtypes: &ALL_DTYPES,
    head_dims: None,
    split_kv: false,
    // Its grid follows the token rows and the heads; lengths and block tables come
    // from the metadata buffers.
    graph_support: GraphSupport::UniformDecode,
    // Untested for it.
    batch_invariant: None,
    vector_io: false,
    compiled: &NAIVE_CU,
    invariant_rows: None,
};

/// What the kernel serves (see [`pagoda_cuda::attn::Kernel::capabilities`]).
pub fn capabilities() -> Capabilities {
    KERNEL.capabilities()
}

/// The reasons beyond the capabilities (see [`pagoda_cuda::attn::runtime_reasons`]).
pub fn runtime_reasons(cfg: &AttentionConfig) -> Vec<InvalidReason> {
    pagoda_cuda::attn::runtime_reasons(&KERNEL, cfg)
}

/// A backend for `cfg`, or why it cannot serve it.
pub fn new(cfg: &AttentionConfig) -> Result<CudaAttention, CoreError> {
    CudaAttention::new(NAME, &KERNEL, cfg)
}

fn create(cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> {
    Ok(Box::new(new(cfg)?))
}

register_backend!(BackendRegistration {
    name: NAME,
    priority: 50,
    description: "reference attention on CUDA (naive.cu): f32/bf16/f16, any head dim and block size, decode and prefill, sliding window and logit soft-capping.",
    capabilities,
    runtime_reasons,
    create,
});
