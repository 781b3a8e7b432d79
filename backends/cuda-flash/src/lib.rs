//! `cuda-flash`: flash prefill attention on CUDA tensor cores (flash.cu): bf16/f16, head dims 64 and 128, prefill only, sliding window and logit soft-capping.
//!
//! Prefill rows only (query length >= 2). Under `VLLM_BATCH_INVARIANT=1` each prompt
//! token runs as a fixed-split `paged.cu` decode row instead (batch-invariant, the bits of
//! `cuda-paged`; `CudaAttention::with_paged_rows`). Valid on the `cuda` and `emu` devices; on `emu` the kernel runs on host
//! buffers through the SIMT emulator. The backend is [`pagoda_cuda::attn::CudaAttention`]
//! with [`FLASH`]; the runtime reasons (q and KV dtypes equal, the head dims of
//! the dtype, a usable CUDA device, a window of at least one key, a positive soft cap)
//! come from [`pagoda_cuda::attn::runtime_reasons`].

use pagoda_core::{
    register_backend, AttentionBackend, AttentionConfig, BackendRegistration, Capabilities,
    CoreError, InvalidReason,
};
use pagoda_cuda::attn::{CudaAttention, FLASH};

/// The registered name.
pub const NAME: &str = "cuda-flash";

/// What the kernel serves (see [`pagoda_cuda::attn::Kernel::capabilities`]).
pub fn capabilities() -> Capabilities {
    FLASH.capabilities()
}

/// The reasons beyond the capabilities (see [`pagoda_cuda::attn::runtime_reasons`]).
pub fn runtime_reasons(cfg: &AttentionConfig) -> Vec<InvalidReason> {
    pagoda_cuda::attn::runtime_reasons(&FLASH, cfg)
}

/// A backend for `cfg`, or why it cannot serve it.
pub fn new(cfg: &AttentionConfig) -> Result<CudaAttention, CoreError> {
    CudaAttention::new(NAME, &FLASH, cfg)
}

fn create(cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> {
    Ok(Box::new(new(cfg)?))
}

register_backend!(BackendRegistration {
    name: NAME,
    priority: 190,
    description: "flash prefill attention on CUDA tensor cores (flash.cu): bf16/f16, head dims 64 and 128, prefill only, sliding window and logit soft-capping.",
    capabilities,
    runtime_reasons,
    create,
});
