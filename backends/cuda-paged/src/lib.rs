//! `cuda-paged`: split-KV paged decode attention on CUDA (paged.cu): f32 (head dims 64, 128), bf16/f16 (64, 128, 256), decode only, sliding window and logit soft-capping.
//!
//! Decode rows only. `plan` picks the split plan (flash-decoding) once per step:
//! partitions of 256 keys cut from each row's first key (`SplitPlan::fixed` in
//! `pagoda-cuda-kernels`), so a row's bits do not depend on the batch and the
//! backend declares `batch_invariant` (checked by the kit's `Check::BatchInvariance`
//! on `emu`). Valid on the `cuda` and `emu` devices; on `emu` the kernel runs on host
//! buffers through the SIMT emulator. The backend is [`pagoda_cuda::attn::CudaAttention`]
//! with [`PAGED`]; the runtime reasons (q and KV dtypes equal, the head dims of
//! the dtype, a usable CUDA device, a window of at least one key, a positive soft cap)
//! come from [`pagoda_cuda::attn::runtime_reasons`].

use pagoda_core::{
    register_backend, AttentionBackend, AttentionConfig, BackendRegistration, Capabilities,
    CoreError, InvalidReason,
};
use pagoda_cuda::attn::{CudaAttention, PAGED};

/// The registered name.
pub const NAME: &str = "cuda-paged";

/// What the kernel serves (see [`pagoda_cuda::attn::Kernel::capabilities`]).
pub fn capabilities() -> Capabilities {
    PAGED.capabilities()
}

/// The reasons beyond the capabilities (see [`pagoda_cuda::attn::runtime_reasons`]).
pub fn runtime_reasons(cfg: &AttentionConfig) -> Vec<InvalidReason> {
    pagoda_cuda::attn::runtime_reasons(&PAGED, cfg)
}

/// A backend for `cfg`, or why it cannot serve it.
pub fn new(cfg: &AttentionConfig) -> Result<CudaAttention, CoreError> {
    CudaAttention::new(NAME, &PAGED, cfg)
}

fn create(cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> {
    Ok(Box::new(new(cfg)?))
}

register_backend!(BackendRegistration {
    name: NAME,
    priority: 200,
    description: "split-KV paged decode attention on CUDA (paged.cu): f32 (head dims 64, 128), bf16/f16 (64, 128, 256), decode only, sliding window and logit soft-capping.",
    capabilities,
    runtime_reasons,
    create,
});
