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

/// `naive` reading an fp8 (E4M3) cache, widened to f64, against the reference on
/// the same fp8-rounded cache, queries and outputs f32: `Tolerance::F32`.
mod fp8_cache {
    use super::*;
    use pagoda_core::{DType, Device};
    conformance_suite!(
        Subject::registered("naive").map(|s| s.on(Device::Cpu, DType::F32, DType::F8E4M3)),
        tolerance = Tolerance::F32
    );
}

/// The fp8 bound of `pagoda_backend_testkit::fp8` holds for `naive` itself, on
/// every head shape of the CPU kernel tests, decode and prefill rows.
#[test]
fn naive_fp8_cache_within_the_bound_of_the_f32_cache() {
    use pagoda_backend_testkit::direct::{rows_case, HEAD_SHAPES};
    use pagoda_backend_testkit::fp8::check_against_f32_cache;
    use pagoda_core::{AttentionConfig, DType};
    for (i, &(nh, nkv, hd)) in HEAD_SHAPES.iter().enumerate() {
        let cfg = AttentionConfig::cpu_f32(nh, nkv, hd, 16);
        let case = rows_case(&cfg, &[(1, 200), (1, 1), (7, 40)], i as u64).unwrap();
        let mut be = NaiveBackend::new(&AttentionConfig {
            kv_dtype: DType::F8E4M3,
            ..cfg
        })
        .unwrap();
        let (err, bound) = check_against_f32_cache(&mut be, &case).unwrap();
        assert!(err > 0.0 && err < bound, "err {err}, bound {bound}");
    }
}
