//! `cuda-warp-decode`: the example CUDA backend crate (docs/new-backend.md), a decode
//! attention kernel of its own, one warp per (decode row, head) (`cu/warp_decode.cu`).
//!
//! What a CUDA backend crate is, all in this folder: the `.cu` file; a one-line
//! `build.rs` (`pagoda_cuda_build::backend`) that compiles it for the SIMT emulator
//! always and to a fatbin when the build turns on CUDA (`cfg(pagoda_cuda)`); an
//! [`AttnKernel`] naming its host launcher, its emulator entry, its fatbin and its
//! entry points; a [`Kernel`] saying what it serves (decode rows; f32/bf16/f16; head dims
//! that are multiples of 32 up to 256; windows and soft caps) and that its arithmetic
//! does not depend on the batch; and the registration. Planning, the device code path
//! on `emu` and `cuda:N`, graph capture and `write_kv` are [`CudaAttention`]'s. Linking
//! it into the binaries is one line in `backends/all/Cargo.toml`.
//!
//! Priority -1: automatic selection never prefers it over the library's kernels; force
//! it with `--attention-backend cuda-warp-decode`.

use pagoda_core::{
    register_backend, AttentionBackend, AttentionConfig, BackendRegistration, Capabilities,
    CoreError, DType, GraphSupport, InvalidReason, Role,
};
use pagoda_cuda::attn::{CudaAttention, Kernel};
use pagoda_cuda_kernels::{AttnKernel, AttnParams, Dtype, Launch};

/// The registered name.
pub const NAME: &str = "cuda-warp-decode";

extern "C" {
    // cu/warp_decode.cu's host part, in the static library build.rs made.
    fn pg_warp_decode_launch(p: *const AttnParams) -> Launch;
    fn pg_emu_warp_decode(p: *const AttnParams, dtype: i32) -> i32;
}

/// The head dims the kernel takes: 32 lanes, up to 8 elements each.
pub const HEAD_DIMS: [usize; 8] = [32, 64, 96, 128, 160, 192, 224, 256];

#[cfg(pagoda_cuda)]
const FATBIN: Option<&[u8]> = Some(include_bytes!(concat!(
    env!("OUT_DIR"),
    "/warp_decode.fatbin"
)));
#[cfg(not(pagoda_cuda))]
const FATBIN: Option<&[u8]> = None;

fn entry(dtype: Dtype, head_dim: usize) -> Option<&'static str> {
    HEAD_DIMS.contains(&head_dim).then_some(match dtype {
        Dtype::F32 => "pg_warp_decode_f32",
        Dtype::Bf16 => "pg_warp_decode_bf16",
        Dtype::F16 => "pg_warp_decode_f16",
    })
}

fn head_dims(_: Dtype) -> &'static [usize] {
    &HEAD_DIMS
}

/// The compiled kernel (see [`AttnKernel`]).
pub static WARP_DECODE_CU: AttnKernel = AttnKernel {
    name: "warp_decode",
    launch: pg_warp_decode_launch,
    emu: pg_emu_warp_decode,
    fatbin: FATBIN,
    entry,
    max_dyn_shared_bytes: 0,
};

/// What the backend type needs to know of it (see [`Kernel`]).
pub static KERNEL: Kernel = Kernel {
    name: "warp_decode",
    role: Role::Decode,
    dtypes: &[DType::F32, DType::BF16, DType::F16],
    head_dims: Some(head_dims),
    split_kv: false,
    // Its grid follows the number of requests and the heads; lengths and block tables
    // come from the metadata buffers.
    graph_support: GraphSupport::UniformDecode,
    // A row's keys are summed in position order by one warp, whatever the batch.
    batch_invariant: Some("cuda-warp-decode"),
    vector_io: false,
    compiled: &WARP_DECODE_CU,
    invariant_rows: None,
};

/// What the kernel serves.
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
    priority: -1,
    description: "example CUDA backend (examples/cuda-backend-example): one warp per decode row, its own cu/warp_decode.cu; f32/bf16/f16, head dims 32..=256 in steps of 32, decode only.",
    capabilities,
    runtime_reasons,
    create,
});
