//! `cuda-naive`: reference attention on CUDA (naive.cu): f32/bf16/f16, any head dim and block size, decode and prefill, sliding window and logit soft-capping.
//!
//! The fallback of the CUDA backends (its priority is below cuda-paged and cuda-flash, above every CPU backend), e.g. for f32 prefill where cuda-flash has no kernel. Valid on the `cuda` and `emu` devices; on `emu` the kernel runs on host
//! buffers through the SIMT emulator. The backend is [`pagoda_cuda::attn::CudaAttention`]
//! with [`NAIVE`]; the runtime reasons (q and KV dtypes equal, the head dims of
//! the dtype, a usable CUDA device, a window of at least one key, a positive soft cap)
//! come from [`pagoda_cuda::attn::runtime_reasons`].

use pagoda_core::{
    register_backend, AttentionBackend, AttentionConfig, BackendRegistration, Capabilities,
    CoreError, InvalidReason,
};
use pagoda_cuda::attn::{CudaAttention, NAIVE};

/// The registered name.
pub const NAME: &str = "cuda-naive";

/// What the kernel serves (see [`pagoda_cuda::attn::Kernel::capabilities`]).
pub fn capabilities() -> Capabilities {
    NAIVE.capabilities()
}

/// The reasons beyond the capabilities (see [`pagoda_cuda::attn::runtime_reasons`]).
pub fn runtime_reasons(cfg: &AttentionConfig) -> Vec<InvalidReason> {
    pagoda_cuda::attn::runtime_reasons(&NAIVE, cfg)
}

/// A backend for `cfg`, or why it cannot serve it.
pub fn new(cfg: &AttentionConfig) -> Result<CudaAttention, CoreError> {
    CudaAttention::new(NAME, &NAIVE, cfg)
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
