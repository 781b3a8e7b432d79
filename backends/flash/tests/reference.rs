//! `flash` against a slow f64 reference on random mixed batches (decode rows, then
//! prefill rows with and without cached context; shuffled blocks, NaN in unused
//! slots), against the registered naive backend, and its refusals.

mod common;

use common::{assert_close, make_case, reference, Case};
use pagoda_backend_flash::{FlashBackend, FlashError, NAME};
use pagoda_core::{AttentionBackend, AttentionConfig, CoreError, InvalidReason, LayerIo, Role};
use proptest::prelude::*;

const ATOL: f32 = 1e-5;
const RTOL: f32 = 1e-4;

fn run_with(
    be: &mut dyn AttentionBackend,
    c: &Case,
    with_lse: bool,
) -> Result<(Vec<f32>, Vec<f32>), CoreError> {
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

fn check(c: &Case, threads: usize) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let (want_o, want_l) = reference(c);
        let mut be = FlashBackend::new(&c.cfg).unwrap();
        let (o, l) = run_with(&mut be, c, true).unwrap();
        assert_close("out", &o, &want_o, ATOL, RTOL);
        assert_close("lse", &l, &want_l, ATOL, RTOL);
        let (o2, _) = run_with(&mut be, c, false).unwrap();
        assert_eq!(o, o2, "LSE output must not change the attention output");
    });
}

const SHAPES: [(usize, usize, usize); 6] = [
    (9, 3, 64),
    (4, 1, 16),
    (8, 8, 32),
    (32, 8, 128),
    (2, 2, 256),
    (6, 2, 40),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn mixed_batches_match_reference(
        shape in 0usize..SHAPES.len(),
        bs in prop::sample::select(vec![1usize, 4, 16, 32]),
        decodes in prop::collection::vec(1usize..300, 0..3),
        prefills in prop::collection::vec((2usize..160, 0usize..200), 0..4),
        seed in any::<u64>(),
        threads in 1usize..8,
    ) {
        let (nh, nkv, hd) = SHAPES[shape];
        let mut rows: Vec<(usize, usize)> = decodes.iter().map(|&s| (1, s)).collect();
        rows.extend(prefills.iter().map(|&(q, ctx)| (q, q + ctx)));
        prop_assume!(!rows.is_empty());
        check(&make_case(AttentionConfig::cpu_f32(nh, nkv, hd, bs), &rows, seed), threads);
    }
}

#[test]
fn long_prefill_with_prefix_matches_naive_backend() {
    let c = make_case(
        AttentionConfig::cpu_f32(32, 8, 128, 16),
        &[(1, 70), (300, 700), (129, 129)],
        11,
    );
    let mut naive = pagoda_backend_naive::NaiveBackend::new(&c.cfg).unwrap();
    let (want_o, want_l) = run_with(&mut naive, &c, true).unwrap();
    let mut be = FlashBackend::new(&c.cfg).unwrap();
    let (o, l) = run_with(&mut be, &c, true).unwrap();
    assert_close("out", &o, &want_o, ATOL, RTOL);
    assert_close("lse", &l, &want_l, ATOL, RTOL);
}

#[test]
fn registered_for_both_roles() {
    let reg = pagoda_core::registered_backends()
        .into_iter()
        .find(|r| r.name == NAME)
        .expect("registered");
    let cfg = AttentionConfig::cpu_f32(9, 3, 64, 16);
    assert!(reg.reasons(&cfg, Role::Both).is_empty());
    let mut windowed = cfg.clone();
    windowed.sliding_window = Some(8);
    assert_eq!(
        reg.reasons(&windowed, Role::Prefill),
        vec![InvalidReason::SlidingWindowUnsupported]
    );
    assert!(matches!(
        FlashBackend::new(&windowed),
        Err(FlashError::Unsupported { .. })
    ));
}

#[test]
fn bad_buffers_and_blocks_are_errors_not_panics() {
    let c = make_case(AttentionConfig::cpu_f32(4, 2, 32, 4), &[(5, 9)], 3);
    let mut be = FlashBackend::new(&c.cfg).unwrap();
    let mut out = vec![0f32; 5 * 4 * 32];
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
    let small = &c.k_cache[..4 * 2 * 32];
    let e = be.run(io(&c.q, small, &mut out)).unwrap_err();
    assert!(matches!(e, CoreError::BackendFailed { .. }), "{e:?}");
}
