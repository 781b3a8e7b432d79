//! The CUDA device runtime and the host side the CUDA attention backends share.
//!
//! * [`runtime`]: registers the `cuda` device family with core
//!   ([`pagoda_core::register_device!`]). Its reason for being unavailable is exactly
//!   one of [`NOT_COMPILED`], [`NO_DRIVER`], [`NO_DEVICE`]; with the `cuda` feature it
//!   opens `cuda:N` through cudarc (device memory as [`pagoda_core::DeviceMemory`]).
//! * [`attn`]: one [`attn::CudaAttention`] type behind `cuda-naive`, `cuda-paged` and
//!   `cuda-flash` (crates `backends/cuda-*`): planning, validation, and launches of the
//!   kernels of `pagoda-cuda-kernels`.
//! * [`device`]: the backends' one device code path (conversions, buffers, parameter
//!   packing, the graph lock) over a small driver: the SIMT emulator on `emu`, cudarc
//!   on `cuda:N` (`gpu.rs`, feature `cuda`).
//! * [`ops`]: core's `ModelOps` (the device forward's non-attention kernels) on `emu`
//!   (`model.cu` emulated, GEMMs on the CPU) and, feature `cuda`, on `cuda:N`
//!   (`ops_cuda.rs`: the same kernels on the GPU, the step's inputs in one copy).
//! * [`gemm`]: the linear layers' GEMM, on host memory ([`gemm_host`]) and (feature
//!   `cuda`) on `cuda:N` through cuBLAS or CUTLASS (`DeviceGemm`, [`GemmImpl`]).

pub mod attn;
pub mod device;
pub mod gemm;
#[cfg(feature = "cuda")]
mod gpu;
pub mod ops;
#[cfg(feature = "cuda")]
mod ops_cuda;
pub mod runtime;

#[cfg(feature = "cuda")]
pub use gemm::DeviceGemm;
pub use gemm::{gemm_host, GemmError, GemmImpl};
#[cfg(feature = "cuda")]
pub use gpu::engine_stream;
pub use runtime::{cuda_unavailable, COMPILED, NOT_COMPILED, NO_DEVICE, NO_DRIVER};
