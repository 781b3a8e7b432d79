//! The shared conformance suite (pagoda-backend-testkit) run against `flash`, once per
//! KV cache dtype it declares: f32, bf16, f16 and fp8 E4M3 (queries and outputs f32).
//!
//! Tolerance: `Tolerance::F32` (1e-5 abs + 1e-4 rel) for every KV dtype, fp8
//! included (its error against the f32 cache it rounds is `tests/fp8.rs`). The kit
//! rounds each case's K/V to the cache's dtype once, so the reference reads the
//! same values as the backend; the backend widens them to f32 exactly and computes
//! in f32, so only f32 arithmetic separates it from the f64 reference, as for an
//! f32 cache. (New K/V rows are rounded to the cache's dtype by `write_kv` for
//! both alike.)

use pagoda_backend_flash as _; // link the crate so its registration is seen
use pagoda_backend_testkit::{conformance_suite, Subject, Tolerance};
use pagoda_core::{DType, Device};

mod f32 {
    use super::*;
    conformance_suite!("flash", tolerance = Tolerance::F32);
}

mod bf16 {
    use super::*;
    conformance_suite!(
        Subject::registered("flash").map(|s| s.on(Device::Cpu, DType::F32, DType::BF16)),
        tolerance = Tolerance::F32
    );
}

mod f16 {
    use super::*;
    conformance_suite!(
        Subject::registered("flash").map(|s| s.on(Device::Cpu, DType::F32, DType::F16)),
        tolerance = Tolerance::F32
    );
}

mod fp8 {
    use super::*;
    conformance_suite!(
        Subject::registered("flash").map(|s| s.on(Device::Cpu, DType::F32, DType::F8E4M3)),
        tolerance = Tolerance::F32
    );
}
