//! The shared conformance suite run against `cuda-naive` on the `emu` device.
//!
//! Tolerances: the kernels' error bound against an f64 reference on the same quantized
//! inputs (pagoda-cuda-testkit) is the output's rounding to the element type, U
//! (2^-8 bf16, 2^-11 f16), doubled for flash's P rounding, times 1.25, + 1e-5 (outputs in
//! [-1, 1]); f32 accumulation otherwise. `Tolerance::BF16` (2e-2 abs + rel) and
//! `Tolerance::F16` (2e-3) exceed 2.5 U + 1e-5 (9.8e-3 and 1.2e-3), and `Tolerance::F32`
//! covers f32 accumulation as for the CPU backends. The emulator runs one OS thread per
//! CUDA thread, so cases are capped (`CaseLimit::EMULATOR`): every check still runs.
//! The suites draw a sliding window and a soft cap in a quarter of their cases each;
//! `features` runs random batches with both in every case (tanh is 1-Lipschitz, so a
//! cap adds no error beyond the f32 score's, and a window only drops keys: same
//! tolerances).

use pagoda_backend_cuda_naive as _; // link the crate so its registration is seen
use pagoda_backend_testkit::{conformance_suites, run_check, CaseLimit, Check, Subject, Tolerance};
use pagoda_core::{DType, Device};

conformance_suites!(
    "cuda-naive",
    Device::Emu,
    |s| s.small_cases(CaseLimit::EMULATOR),
    [(bf16, BF16, BF16), (f16, F16, F16), (f32, F32, F32)]
);

mod features {
    use super::*;

    /// Random batches, every case with a sliding window and a soft cap.
    #[test]
    fn window_and_soft_cap_in_every_case_match_naive() {
        run_check(
            Check::RandomBatches,
            Subject::registered("cuda-naive").map(|s| {
                s.on(Device::Emu, DType::F32, DType::F32)
                    .small_cases(CaseLimit {
                        cases: 4,
                        ..CaseLimit::EMULATOR
                    })
                    .features_always()
            }),
            Tolerance::F32,
            Some(file!()),
        );
    }
}

/// The same suite on `cuda:0` (feature `cuda`), without the emulator's case limit:
/// skipped, saying why, where no CUDA device is usable; scripts/device-check.sh runs
/// it on a GPU with `PAGODA_REQUIRE_DEVICE` set, where a skip is a failure.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    conformance_suites!(
        "cuda-naive",
        Device::Cuda(0),
        |s| s,
        [(bf16, BF16, BF16), (f16, F16, F16), (f32, F32, F32)]
    );
}
