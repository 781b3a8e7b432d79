//! The shared conformance suites run against `cuda-warp-decode` on the `emu` device
//! (its `.cu` through the SIMT emulator), as for the library's CUDA backends.
//!
//! Tolerances as `cuda-paged`'s (backends/cuda-paged/tests/conformance.rs): the output's
//! rounding to the element type plus f32 accumulation, within `Tolerance::BF16`,
//! `Tolerance::F16` and `Tolerance::F32`. The emulator runs one OS thread per CUDA
//! thread, so cases are capped (`CaseLimit::EMULATOR`): every check still runs,
//! batch invariance among them (the backend declares it).

use pagoda_backend_cuda_example as _; // link the crate so its registration is seen
use pagoda_backend_testkit::{conformance_suites, CaseLimit};
use pagoda_core::Device;

conformance_suites!(
    "cuda-warp-decode",
    Device::Emu,
    |s| s.small_cases(CaseLimit::EMULATOR),
    [(bf16, BF16, BF16), (f16, F16, F16), (f32, F32, F32)]
);

/// The same suites on `cuda:0` when this crate's fatbin was built (the CUDA build):
/// skipped, saying why, where no CUDA device is usable.
#[cfg(pagoda_cuda)]
mod cuda {
    use super::*;
    conformance_suites!(
        "cuda-warp-decode",
        Device::Cuda(0),
        |s| s,
        [(bf16, BF16, BF16), (f16, F16, F16), (f32, F32, F32)]
    );
}
