//! `paged` against a slow f64 reference on random decode batches (shuffled blocks,
//! NaN in unused slots), plus its refusals: prefill rows, bad buffers, bad blocks.

mod common;

use common::{assert_close, make_case, reference, Case};
use pagoda_backend_paged::simd::Isa;
use pagoda_backend_paged::{PagedBackend, PagedError, NAME};
use pagoda_core::{AttentionBackend, AttentionConfig, CoreError, InvalidReason, LayerIo, Role};
use proptest::prelude::*;

const ATOL: f32 = 1e-5;
const RTOL: f32 = 1e-4;

fn run(c: &Case, with_lse: bool, isa: Isa) -> Result<(Vec<f32>, Vec<f32>), CoreError> {
    let mut be = PagedBackend::new(&c.cfg).map_err(CoreError::from)?;
    be.set_isa(isa).map_err(CoreError::from)?;
    be.plan(&c.batch)?;
    let n = c.batch.num_tokens();
    let mut out = vec![f32::NAN; n * c.cfg.num_heads * c.cfg.head_dim];
    let mut lse = vec![f32::NAN; n * c.cfg.num_heads];
    // Run twice: a layer call must not depend on leftovers of the previous one.
    for _ in 0..2 {
        be.run(LayerIo {
            q: &c.q,
            k_cache: &c.k_cache,
            v_cache: &c.v_cache,
            out: &mut out,
            lse: if with_lse { Some(&mut lse) } else { None },
        })?;
    }
    Ok((out, lse))
}

/// Plans and runs inside a pool of `threads` threads: more threads means more splits.
fn check(c: &Case, threads: usize) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| check_here(c));
}

fn check_here(c: &Case) {
    let (want_o, want_l) = reference(c);
    for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable]
        .into_iter()
        .filter(|i| i.available())
    {
        let (o, l) = run(c, true, isa).unwrap();
        assert_close(&format!("out ({isa:?})"), &o, &want_o, ATOL, RTOL);
        assert_close(&format!("lse ({isa:?})"), &l, &want_l, ATOL, RTOL);
        let (o2, _) = run(c, false, isa).unwrap();
        assert_eq!(o, o2, "LSE output must not change the attention output");
    }
}

const SHAPES: [(usize, usize, usize); 5] = [
    (9, 3, 64),
    (4, 1, 16),
    (8, 8, 32),
    (32, 8, 128),
    (2, 2, 256),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn decode_matches_reference(
        shape in 0usize..SHAPES.len(),
        bs in prop::sample::select(vec![1usize, 4, 16, 32]),
        seqs in prop::collection::vec(1usize..700, 1..6),
        seed in any::<u64>(),
        threads in 1usize..24,
    ) {
        let (nh, nkv, hd) = SHAPES[shape];
        let rows: Vec<(usize, usize)> = seqs.iter().map(|&s| (1, s)).collect();
        check(&make_case(AttentionConfig::cpu_f32(nh, nkv, hd, bs), &rows, seed), threads);
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
    let mut be = PagedBackend::new(&c.cfg).unwrap();
    let mut out = vec![0f32; 4 * 32];
    fn io<'a>(q: &'a [f32], k: &'a [f32], out: &'a mut [f32]) -> LayerIo<'a> {
        LayerIo {
            q,
            k_cache: k,
            v_cache: k,
            out,
            lse: None,
        }
    }
    assert!(
        be.run(io(&c.q, &c.k_cache, &mut out)).is_err(),
        "run before plan"
    );
    be.plan(&c.batch).unwrap();
    let e = be.run(io(&c.q[1..], &c.k_cache, &mut out)).unwrap_err();
    assert!(matches!(e, CoreError::ShapeMismatch { name: "q", .. }));
    // A pool of one block cannot hold the request's blocks.
    let small = &c.k_cache[..4 * 2 * 32];
    let e = be.run(io(&c.q, small, &mut out)).unwrap_err();
    assert!(matches!(e, CoreError::BackendFailed { .. }), "{e:?}");
}
