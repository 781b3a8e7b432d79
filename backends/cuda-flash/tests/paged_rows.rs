//! `cuda-flash` with paged rows (`VLLM_BATCH_INVARIANT=1`, issue 27): each prefill
//! token runs as a fixed-split `paged.cu` decode row. The kit's random batches
//! against naive (tolerance as `conformance.rs`: f16's rounding bound) and its
//! bit-exact batch-invariance check (the rows re-cut into other chunks, shuffled,
//! dealt into other batches, blocks renumbered) on `emu`.

use pagoda_backend_cuda_flash::KERNEL as FLASH;
use pagoda_backend_testkit::{run_check, CaseLimit, Check, Subject, Tolerance};
use pagoda_core::{AttentionBackend, DType, Device};
use pagoda_cuda::attn::CudaAttention;

fn subject() -> Subject {
    Subject::new("cuda-flash (paged rows)", FLASH.capabilities(), |cfg| {
        let b = CudaAttention::new(pagoda_backend_cuda_flash::NAME, &FLASH, cfg)?;
        Ok(Box::new(b.with_paged_rows()) as Box<dyn AttentionBackend>)
    })
    .on(Device::Emu, DType::F16, DType::F16)
    .small_cases(CaseLimit {
        work: 6_000,
        cases: 4,
    })
}

#[test]
fn paged_rows_match_naive() {
    run_check(
        Check::RandomBatches,
        subject(),
        Tolerance::F16,
        Some(file!()),
    );
}

#[test]
fn paged_rows_are_batch_invariant_bit_for_bit() {
    run_check(
        Check::BatchInvariance,
        subject(),
        Tolerance::F16,
        Some(file!()),
    );
}
