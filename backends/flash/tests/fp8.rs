//! `flash` over an fp8 (E4M3) cache against `naive` over the f32 cache it rounds,
//! on random prefill rows (up to 40 new tokens, the rest cached context): every output element within the testkit's derived
//! bound (`pagoda_backend_testkit::fp8`: the E4M3 rounding error of K moved through
//! the softmax, plus that of V) and twice `Tolerance::F32`. (Against `naive` on the
//! same fp8-rounded cache the tolerance is `Tolerance::F32`: `tests/reference.rs`
//! and the conformance suite.)

use pagoda_backend_flash::FlashBackend;
use pagoda_backend_testkit::direct::{rows_case, HEAD_SHAPES};
use pagoda_backend_testkit::fp8::check_against_f32_cache;
use pagoda_core::{AttentionConfig, DType};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn fp8_cache_stays_within_the_bound_of_the_f32_cache(
        shape in 0usize..HEAD_SHAPES.len(),
        bs in prop::sample::select(vec![1usize, 16]),
        seqs in prop::collection::vec(1usize..300, 1..4),
        seed in any::<u64>(),
    ) {
        let (nh, nkv, hd) = HEAD_SHAPES[shape];
        let rows: Vec<(usize, usize)> = seqs.iter().map(|&s| (s.clamp(2, 40), s.max(2))).collect();
        let cfg = AttentionConfig::cpu_f32(nh, nkv, hd, bs);
        let case = rows_case(&cfg, &rows, seed).unwrap();
        let mut be = FlashBackend::new(&AttentionConfig { kv_dtype: DType::F8E4M3, ..cfg }).unwrap();
        let (err, bound) = check_against_f32_cache(&mut be, &case).unwrap();
        // The rounding does move the output: the fp8 cache is really what is read.
        prop_assert!(err > 0.0, "err {err}, bound {bound}");
    }
}
