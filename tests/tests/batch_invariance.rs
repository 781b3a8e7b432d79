//! Bit-exact batch invariance on the real model (issue 27): a request's top-20
//! logprobs, and with sampling its tokens, are the same bits alone, in a batch of
//! 32 mixed requests, with `max_num_batched_tokens = 8` (its prompt in chunks of
//! 8), after a prefix-cache hit and after a preemption (recompute), on the
//! default path (the GGUF's Q4_1 blocks, int8 activations) and on f32 and bf16
//! weights, with an f32 and a bf16 KV cache (the last in the lighter regimes
//! only). `batch_invariance_avx2.rs` runs the Q4_1 case on the AVX2 kernels
//! (`PAGODA_DISABLE_AVX512=1`).
//!
//! The target prompt is longer than one attention split (256 positions), so its
//! rows merge several splits, and its chunked prefill crosses split boundaries.

mod invariance;

use invariance::check;
use pagoda_core::{DType, KvCacheDtype};
use pagoda_models::WeightDtype;

#[test]
fn q4_1_default_path_is_batch_invariant() {
    check(WeightDtype::Native, KvCacheDtype::Auto, true);
}

#[test]
fn f32_weights_are_batch_invariant() {
    check(WeightDtype::F32, KvCacheDtype::Auto, true);
}

/// Alone, batched and chunked only (the other regimes run above).
#[test]
fn bf16_weights_and_bf16_kv_are_batch_invariant() {
    check(WeightDtype::Bf16, KvCacheDtype::Fixed(DType::BF16), false);
}
