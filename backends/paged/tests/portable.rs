//! `PAGODA_DISABLE_AVX512=1` reaches `paged`: with it set before the first probe,
//! the backend runs its AVX2 (or portable) kernel, AVX-512 cannot be forced, and the
//! whole conformance suite passes on that kernel (random batches over bf16 and f16
//! caches too). Its own binary and one test,
//! because the switch is read once per process.

use pagoda_backend_paged::{PagedBackend, PagedError};
use pagoda_backend_testkit::{run_check, Check, Subject, Tolerance};
use pagoda_core::{AttentionConfig, DType, Device};
use pagoda_kernels::isa::DISABLE_AVX512_ENV;
use pagoda_kernels::Isa;

#[test]
fn conformance_without_avx512() {
    std::env::set_var(DISABLE_AVX512_ENV, "1");
    assert!(!Isa::detect().avx512());
    let mut be = PagedBackend::new(&AttentionConfig::cpu_f32(9, 3, 64, 16)).unwrap();
    assert_eq!(be.isa(), Isa::detect());
    assert_eq!(
        be.set_isa(Isa::Avx512),
        Err(PagedError::IsaUnavailable { isa: Isa::Avx512 })
    );
    for check in Check::ALL {
        run_check(check, "paged", Tolerance::F32, None);
    }
    // The 16-bit and fp8 caches through the same kernel (AVX2's F16C widening of
    // f16 and of fp8 through f16).
    for kv in [DType::BF16, DType::F16, DType::F8E4M3] {
        let subject = || Subject::registered("paged").map(|s| s.on(Device::Cpu, DType::F32, kv));
        run_check(Check::RandomBatches, subject(), Tolerance::F32, None);
        run_check(Check::DecodeEqualsPrefill, subject(), Tolerance::F32, None);
    }
}
