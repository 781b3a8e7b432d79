//! `flash` against the naive f64 reference (through the testkit's `direct` helpers)
//! on random prefill batches (rows with and without cached context; shuffled
//! blocks, NaN in unused slots) and one long prefill, plus its refusals (decode
//! rows among them: mixed batches go through the selector's hybrid, tested in
//! `selector/tests/hybrid.rs`). Every case runs over f32, bf16, f16 and fp8 KV caches.
//!
//! Tolerance: `Tolerance::F32` for every KV dtype. The case's K/V are values of the
//! cache's dtype and the reference reads the same values; the repacking widens them
//! exactly, so only the f32 arithmetic differs from the f64 reference.

use pagoda_backend_flash::{FlashBackend, FlashError, NAME};
use pagoda_backend_testkit::case::Case;
use pagoda_backend_testkit::direct::{
    assert_close, misuse, reference, rows_case, run_twice, HEAD_SHAPES,
};
use pagoda_backend_testkit::Tolerance;
use pagoda_core::{AttentionBackend, AttentionConfig, CoreError, DType, InvalidReason, Role};
use proptest::prelude::*;

const TOL: Tolerance = Tolerance::F32;

fn make_case(cfg: AttentionConfig, rows: &[(usize, usize)], seed: u64) -> Case {
    rows_case(&cfg, rows, seed).expect("valid case")
}

fn check(c: &Case, threads: usize) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let (want_o, want_l) = reference(c).unwrap();
        let mut be = FlashBackend::new(&c.cfg).unwrap();
        let (o, l) = run_twice(&mut be, c, true).unwrap();
        assert_close("out", &o, &want_o, c, TOL);
        assert_close("lse", &l, &want_l, c, TOL);
        let (o2, _) = run_twice(&mut be, c, false).unwrap();
        assert_eq!(o, o2, "LSE output must not change the attention output");
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn prefill_batches_match_reference(
        shape in 0usize..HEAD_SHAPES.len(),
        bs in prop::sample::select(vec![1usize, 4, 16, 32]),
        prefills in prop::collection::vec((2usize..160, 0usize..200), 1..5),
        seed in any::<u64>(),
        threads in 1usize..8,
        kv_dtype in prop::sample::select(vec![DType::F32, DType::BF16, DType::F16, DType::F8E4M3]),
    ) {
        let (nh, nkv, hd) = HEAD_SHAPES[shape];
        let rows: Vec<(usize, usize)> = prefills.iter().map(|&(q, ctx)| (q, q + ctx)).collect();
        let cfg = AttentionConfig { kv_dtype, ..AttentionConfig::cpu_f32(nh, nkv, hd, bs) };
        check(&make_case(cfg, &rows, seed), threads);
    }
}

#[test]
fn long_prefill_with_prefix_matches_naive_backend() {
    for kv_dtype in [DType::F32, DType::BF16, DType::F16, DType::F8E4M3] {
        let cfg = AttentionConfig {
            kv_dtype,
            ..AttentionConfig::cpu_f32(32, 8, 128, 16)
        };
        let c = make_case(cfg, &[(300, 700), (129, 129)], 11);
        let (want_o, want_l) = reference(&c).unwrap();
        let mut be = FlashBackend::new(&c.cfg).unwrap();
        let (o, l) = run_twice(&mut be, &c, true).unwrap();
        assert_close(&format!("out ({kv_dtype})"), &o, &want_o, &c, TOL);
        assert_close(&format!("lse ({kv_dtype})"), &l, &want_l, &c, TOL);
    }
}

#[test]
fn registered_for_prefill_only() {
    let reg = pagoda_core::registered_backends()
        .into_iter()
        .find(|r| r.name == NAME)
        .expect("registered");
    let cfg = AttentionConfig::cpu_f32(9, 3, 64, 16);
    assert!(reg.reasons(&cfg, Role::Prefill).is_empty());
    let decode = vec![InvalidReason::RoleUnsupported { role: Role::Decode }];
    assert_eq!(reg.reasons(&cfg, Role::Decode), decode);
    assert_eq!(reg.reasons(&cfg, Role::Both), decode);
    // Sliding windows and soft caps are served (Mistral, Gemma 2); a head dim
    // beyond the tile kernel's is not, nor one that is no multiple of 16 (a row
    // runs `paged`'s arithmetic, which steps through a head 16 lanes at a time).
    let mut windowed = cfg.clone();
    windowed.sliding_window = Some(8);
    windowed.logits_soft_cap = Some(50.0);
    assert!(reg.reasons(&windowed, Role::Prefill).is_empty());
    assert!(FlashBackend::new(&windowed).is_ok());
    for hd in [1024, 40] {
        let cfg = AttentionConfig::cpu_f32(2, 1, hd, 16);
        assert!(matches!(
            FlashBackend::new(&cfg),
            Err(FlashError::Unsupported { .. })
        ));
    }
}

#[test]
fn decode_rows_are_refused_at_plan() {
    let c = make_case(AttentionConfig::cpu_f32(4, 2, 32, 4), &[(1, 9), (5, 9)], 3);
    let mut be = FlashBackend::new(&c.cfg).unwrap();
    let err = be.plan(&c.batch).unwrap_err();
    assert_eq!(
        err,
        CoreError::BackendInvalid {
            backend: NAME.into(),
            reasons: vec![InvalidReason::RoleUnsupported { role: Role::Decode }],
        }
    );
}

#[test]
fn bad_buffers_and_blocks_are_errors_not_panics() {
    let c = make_case(AttentionConfig::cpu_f32(4, 2, 32, 4), &[(5, 9)], 3);
    let m = misuse(&mut FlashBackend::new(&c.cfg).unwrap(), &c).unwrap();
    m.assert_refused();
    // A pool of one block cannot hold the request's blocks: the kernel says so.
    assert!(
        matches!(m.one_block_pool, Err(CoreError::BlockOutOfRange { .. })),
        "{:?}",
        m.one_block_pool
    );
}
