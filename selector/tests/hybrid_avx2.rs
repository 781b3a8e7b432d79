//! `hybrid.rs`'s batch-invariance check of `decode=paged,prefill=flash` on the AVX2
//! kernels (`PAGODA_DISABLE_AVX512=1`: both backends switch, and a decode row and
//! a prefill row must still agree bit for bit). One test per binary: the switch is
//! read once per process.

use pagoda_backend_testkit::{run_check, Check, Tolerance};
use pagoda_core::{DType, Device};

use pagoda_backends as _;

mod invariant;

#[test]
fn paged_flash_hybrid_is_batch_invariant_on_avx2() {
    std::env::set_var("PAGODA_DISABLE_AVX512", "1");
    for kv in [DType::F32, DType::BF16] {
        run_check(
            Check::BatchInvariance,
            invariant::invariant_subject().on(Device::Cpu, DType::F32, kv),
            Tolerance::F32,
            Some(file!()),
        );
    }
}
