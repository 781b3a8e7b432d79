//! `batch_invariance.rs`'s Q4_1 case on the AVX2 kernels: `PAGODA_DISABLE_AVX512=1`
//! switches every AVX-512 path of the process off (GEMMs, activations, attention),
//! and invariance must hold with AVX2's arithmetic too. One test per binary: the
//! switch is read once per process. (On a machine without AVX-512 it repeats the
//! other file's case.)

mod invariance;

use pagoda_core::KvCacheDtype;
use pagoda_models::WeightDtype;

#[test]
fn q4_1_is_batch_invariant_on_avx2() {
    std::env::set_var("PAGODA_DISABLE_AVX512", "1");
    assert!(!pagoda_kernels::Isa::detect().avx512());
    invariance::check(WeightDtype::Native, KvCacheDtype::Auto, true);
}
