//! `paged` against the naive f64 reference on random decode batches (shuffled
//! blocks, NaN in unused slots) over f32, bf16, f16 and fp8 KV caches on every available
//! ISA, plus its refusals: prefill rows, bad buffers, bad blocks.
//!
//! Tolerance: `Tolerance::F32` for every KV dtype. The case's K/V are values of the
//! cache's dtype and the reference reads the same values; the kernel widens them
//! exactly, so only its f32 arithmetic differs from the f64 reference.

use pagoda_backend_paged::{PagedBackend, PagedError, NAME};
use pagoda_backend_testkit::case::Case;
use pagoda_backend_testkit::direct::{
    assert_close, misuse, reference, rows_case, run_twice, HEAD_SHAPES,
};
use pagoda_backend_testkit::Tolerance;
use pagoda_core::{AttentionBackend, AttentionConfig, CoreError, DType, InvalidReason, Role};
use pagoda_kernels::Isa;
use proptest::prelude::*;

const TOL: Tolerance = Tolerance::F32;

fn make_case(cfg: AttentionConfig, rows: &[(usize, usize)], seed: u64) -> Case {
    rows_case(&cfg, rows, seed).expect("valid case")
}

fn run(c: &Case, with_lse: bool, isa: Isa) -> Result<(Vec<f32>, Vec<f32>), CoreError> {
    let mut be = PagedBackend::new(&c.cfg).map_err(CoreError::from)?;
    be.set_isa(isa).map_err(CoreError::from)?;
    run_twice(&mut be, c, with_lse)
}

/// Plans and runs inside a pool of `threads` threads (the splits are fixed; the
/// threads only change who runs them).
fn check(c: &Case, threads: usize) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| check_here(c));
}

fn check_here(c: &Case) {
    let (want_o, want_l) = reference(c).unwrap();
    for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable]
        .into_iter()
        .filter(|i| i.available())
    {
        let (o, l) = run(c, true, isa).unwrap();
        assert_close(&format!("out ({isa:?})"), &o, &want_o, c, TOL);
        assert_close(&format!("lse ({isa:?})"), &l, &want_l, c, TOL);
        let (o2, _) = run(c, false, isa).unwrap();
        assert_eq!(o, o2, "LSE output must not change the attention output");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn decode_matches_reference(
        shape in 0usize..HEAD_SHAPES.len(),
        bs in prop::sample::select(vec![1usize, 4, 16, 32]),
        seqs in prop::collection::vec(1usize..700, 1..6),
        seed in any::<u64>(),
        threads in 1usize..24,
        kv_dtype in prop::sample::select(vec![DType::F32, DType::BF16, DType::F16, DType::F8E4M3]),
    ) {
        let (nh, nkv, hd) = HEAD_SHAPES[shape];
        let rows: Vec<(usize, usize)> = seqs.iter().map(|&s| (1, s)).collect();
        let cfg = AttentionConfig { kv_dtype, ..AttentionConfig::cpu_f32(nh, nkv, hd, bs) };
        check(&make_case(cfg, &rows, seed), threads);
    }
}

#[test]
fn narrow_caches_long_context_and_llama8b_shape() {
    for kv_dtype in [DType::BF16, DType::F16, DType::F8E4M3] {
        let cfg = AttentionConfig {
            kv_dtype,
            ..AttentionConfig::cpu_f32(32, 8, 128, 16)
        };
        check(&make_case(cfg, &[(1, 3000), (1, 17), (1, 1)], 5), 16);
    }
}

#[test]
fn long_context_is_split_and_merged() {
    let c = make_case(
        AttentionConfig::cpu_f32(32, 8, 128, 16),
        &[(1, 3000), (1, 17)],
        7,
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(16)
        .build()
        .unwrap();
    pool.install(|| {
        let mut be = PagedBackend::new(&c.cfg).unwrap();
        be.plan(&c.batch).unwrap();
        let items = be.work_items();
        assert!(
            items.iter().filter(|i| i.req == 0).count() > 1,
            "3000 keys must be split"
        );
        assert!(
            items.iter().all(|i| i.start % 16 == 0),
            "splits start on block boundaries"
        );
    });
    check(&c, 16);
}

#[test]
fn asked_for_prefill_it_gives_the_prefill_reason() {
    let reg = pagoda_core::registered_backends()
        .into_iter()
        .find(|r| r.name == NAME)
        .expect("registered");
    let cfg = AttentionConfig::cpu_f32(9, 3, 64, 16);
    assert!(reg.reasons(&cfg, Role::Decode).is_empty());
    let reasons = reg.reasons(&cfg, Role::Prefill);
    assert_eq!(
        reasons,
        vec![InvalidReason::RoleUnsupported {
            role: Role::Prefill
        }]
    );
    assert!(reasons[0].to_string().contains("prefill"));

    // A batch with a prefill row is refused at plan time with the same reason.
    let c = make_case(cfg.clone(), &[(1, 5), (4, 9)], 1);
    let mut be = (reg.create)(&cfg).unwrap();
    match be.plan(&c.batch) {
        Err(CoreError::BackendInvalid { reasons, .. }) => {
            assert_eq!(
                reasons,
                vec![InvalidReason::RoleUnsupported {
                    role: Role::Prefill
                }]
            )
        }
        other => panic!("expected the prefill reason, got {other:?}"),
    }
}

#[test]
fn unsupported_configs_are_refused() {
    let e = PagedBackend::new(&AttentionConfig::cpu_f32(9, 3, 72, 16))
        .err()
        .unwrap();
    assert!(
        matches!(e, PagedError::Unsupported { ref reasons } if reasons.iter().any(|r| matches!(r, InvalidReason::HeadDimUnsupported { .. })))
    );
}

#[test]
fn bad_buffers_and_blocks_are_errors_not_panics() {
    let c = make_case(AttentionConfig::cpu_f32(4, 2, 32, 4), &[(1, 9)], 3);
    let m = misuse(&mut PagedBackend::new(&c.cfg).unwrap(), &c).unwrap();
    m.assert_refused();
    // A pool of one block cannot hold the request's blocks: the kernel says so.
    assert!(
        matches!(m.one_block_pool, Err(CoreError::BlockOutOfRange { .. })),
        "{:?}",
        m.one_block_pool
    );
}
