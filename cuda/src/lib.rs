//! The CUDA device runtime and the host side the CUDA attention backends share.
//!
//! * [`runtime`]: registers the `cuda` device family with core
//!   ([`pagoda_core::register_device!`]). Its reason for being unavailable is exactly
//!   one of [`NOT_COMPILED`], [`NO_DRIVER`], [`NO_DEVICE`]; with the `cuda` feature it
//!   opens `cuda:N` through cudarc (device memory as [`pagoda_core::DeviceMemory`]).
//! * [`attn`]: one [`attn::CudaAttention`] type behind `cuda-naive`, `cuda-paged` and
//!   `cuda-flash` (crates `backends/cuda-*`): planning, validation, and launches of the
//!   kernels of `pagoda-cuda-kernels`.
//! * `driver.rs`: the one layer that differs by device, a small driver (allocate,
//!   copies on the stream, launch a named kernel with its packed parameters, the GEMM,
//!   events, graph capture and replay, memory info): host memory and the SIMT
//!   emulator on `emu` (`driver/emu.rs`), cudarc on `cuda:N` (`gpu.rs`, feature `cuda`),
//!   over each device's one context and engine stream (`context.rs`, `engine_stream`).
//! * [`device`]: the attention backends' device code path (conversions, buffers,
//!   parameter packing, the graph lock) over the driver.
//! * [`ops`]: core's `ModelOps` (the device forward's non-attention kernels), one
//!   implementation over the driver for both devices (`model.cu` emulated and GEMMs on
//!   the CPU on `emu`; on the GPU and cuBLAS/CUTLASS on `cuda:N`).
//! * [`gemm`]: the linear layers' GEMM, on host memory ([`gemm_host`]) and (feature
//!   `cuda`) on `cuda:N` through cuBLAS or CUTLASS (`DeviceGemm`, [`GemmImpl`]).

pub mod attn;
mod batch_invariant;
#[cfg(feature = "cuda")]
mod context;
pub mod device;
mod driver;
pub mod gemm;
#[cfg(feature = "cuda")]
mod gpu;
mod kernel;
pub mod ops;
pub mod runtime;

pub use driver::EMU_MEMORY_BYTES;

#[cfg(feature = "cuda")]
pub use context::engine_stream;
#[cfg(feature = "cuda")]
pub use gemm::DeviceGemm;
pub use gemm::{gemm_host, GemmError, GemmImpl};
pub use runtime::{cuda_unavailable, COMPILED, NOT_COMPILED, NO_DEVICE, NO_DRIVER};
