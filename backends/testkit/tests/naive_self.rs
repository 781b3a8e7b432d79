//! Sanity: the suite run on `naive` against itself passes, through both ways of
//! naming a subject (registry name and constructor).

use pagoda_backend_naive::{capabilities, NaiveBackend};
use pagoda_backend_testkit::{conformance_suite, Subject, Tolerance};

conformance_suite!("naive", tolerance = Tolerance::F32);

mod by_constructor {
    use super::*;
    conformance_suite!(Subject::from_ctor(
        "naive-ctor",
        capabilities(),
        NaiveBackend::new
    ));
}

/// The kit places cases on a subject's dtypes: `naive` reading bf16 queries and a
/// bf16 cache (widened to f64) against the reference on the same bf16 inputs. Each
/// output is rounded to bf16 once; the metamorphic checks compare outputs computed
/// different ways, which may then differ by one bf16 ulp (2^-8 relative):
/// `Tolerance::BF16`.
mod bf16_placement {
    use super::*;
    use pagoda_core::{DType, Device};
    conformance_suite!(
        Subject::registered("naive").map(|s| s.on(Device::Cpu, DType::BF16, DType::BF16)),
        tolerance = Tolerance::BF16
    );
}
