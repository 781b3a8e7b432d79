//! `cuda-flash`: flash prefill attention on CUDA tensor cores (flash.cu): bf16/f16, head dims 64 and 128, prefill only, sliding window and logit soft-capping.
//!
//! Prefill rows only (query length >= 2): `cu/flash.cu` (in this crate), FA2-style
//! tiles on `mma.sync` m16n8k16. Under `VLLM_BATCH_INVARIANT=1` each prompt token runs
//! as a fixed-split `paged.cu` decode row instead (the library's kernel,
//! [`pagoda_cuda::attn::PAGED`]: batch-invariant, the bits of `cuda-paged`;
//! `CudaAttention::with_paged_rows`). Valid on the `cuda` and `emu` devices; on `emu` the
//! kernel runs on host buffers through the SIMT emulator. The crate owns its kernel:
//! the `.cu` file, its `build.rs` (`pagoda_cuda_build::backend`, plus the planted-bug
//! copy for the emulator's test), the [`FLASH_CU`] description and the [`KERNEL`] the
//! backend type [`pagoda_cuda::attn::CudaAttention`] launches; the runtime reasons (q
//! and KV dtypes equal, the head dims of the dtype, a usable CUDA device, a window of at
//! least one key, a positive soft cap) come from [`pagoda_cuda::attn::runtime_reasons`].

use pagoda_core::{
    register_backend, AttentionBackend, AttentionConfig, BackendRegistration, Capabilities,
    CoreError, DType, GraphSupport, InvalidReason, Role,
};
use pagoda_cuda::attn::{CudaAttention, Kernel, PAGED};
use pagoda_cuda_kernels::{AttnKernel, AttnParams, Dtype, Launch};

/// The registered name.
pub const NAME: &str = "cuda-flash";

extern "C" {
    // cu/flash.cu's host part, in the static libraries build.rs made.
    fn pg_flash_launch(p: *const AttnParams) -> Launch;
    fn pg_emu_flash(p: *const AttnParams, dtype: i32) -> i32;
    fn pg_emu_flash_planted(p: *const AttnParams, dtype: i32) -> i32;
}

#[cfg(pagoda_cuda)]
const FATBIN: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/flash.fatbin")));
#[cfg(not(pagoda_cuda))]
const FATBIN: Option<&[u8]> = None;

/// Head dims with a `flash` kernel (bf16/f16 only: tensor cores).
pub fn head_dims(dtype: Dtype) -> &'static [usize] {
    match dtype {
        Dtype::F32 => &[],
        Dtype::Bf16 | Dtype::F16 => &[64, 128],
    }
}

fn entry(dtype: Dtype, head_dim: usize) -> Option<&'static str> {
    Some(match (dtype, head_dim) {
        (Dtype::Bf16, 64) => "pg_flash_bf16_d64",
        (Dtype::Bf16, 128) => "pg_flash_bf16_d128",
        (Dtype::F16, 64) => "pg_flash_f16_d64",
        (Dtype::F16, 128) => "pg_flash_f16_d128",
        _ => return None,
    })
}

/// The d128 tile's dynamic shared memory (the Q tile and two K/V stages, 85 KiB): past
/// the default 48 KiB, so the CUDA side raises each entry's limit when it loads it.
const MAX_DYN_SHARED: u32 = 87_040;

/// `cu/flash.cu`, compiled (see [`AttnKernel`]).
pub static FLASH_CU: AttnKernel = AttnKernel {
    name: "flash",
    launch: pg_flash_launch,
    emu: pg_emu_flash,
    fatbin: FATBIN,
    entry,
    max_dyn_shared_bytes: MAX_DYN_SHARED,
};

/// `flash.cu` built with a planted fragment-layout bug (P's registers a2a3/a4a5
/// swapped), emulator only: for the test that shows the emulator catches it.
#[doc(hidden)]
pub static FLASH_PLANTED_CU: AttnKernel = AttnKernel {
    name: "flash (planted bug)",
    emu: pg_emu_flash_planted,
    fatbin: None,
    ..FLASH_CU
};

/// What the backend type needs to know of it (see [`Kernel`]).
pub static KERNEL: Kernel = Kernel {
    name: "flash",
    role: Role::Prefill,
    dtypes: &[DType::BF16, DType::F16],
    head_dims: Some(head_dims),
    split_kv: false,
    graph_support: GraphSupport::Never,
    // `flash.cu` tiles a prompt differently from `paged.cu`'s decode row.
    batch_invariant: None,
    vector_io: true,
    compiled: &FLASH_CU,
    invariant_rows: Some(&PAGED),
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
    priority: 190,
    description: "flash prefill attention on CUDA tensor cores (flash.cu): bf16/f16, head dims 64 and 128, prefill only, sliding window and logit soft-capping.",
    capabilities,
    runtime_reasons,
    create,
});

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared memory the entries opt into is what the d128 launch asks for.
    #[test]
    fn the_opt_in_covers_the_largest_tile() {
        let p = AttnParams {
            head_dim: 128,
            ..AttnParams::default()
        };
        assert_eq!(FLASH_CU.launch_of(&p).shared_bytes, MAX_DYN_SHARED);
        let p = AttnParams {
            head_dim: 64,
            ..AttnParams::default()
        };
        assert!(FLASH_CU.launch_of(&p).shared_bytes <= MAX_DYN_SHARED);
    }
}
