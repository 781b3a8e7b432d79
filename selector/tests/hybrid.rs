//! Mixed batches (decode rows, then prefill rows with and without cached context)
//! through the automatic selection, `decode=paged,prefill=flash` composed by
//! `HybridBackend`, against the naive f64 reference: what the engine runs on
//! every step, and how a mixed batch is served now that `flash` is prefill-only;
//! over f32, bf16 and f16 KV caches (`Tolerance::F32` for all: the reference reads
//! the same rounded K/V, which both backends widen exactly); and the composition's
//! bit-exact batch invariance (the kit's check).

use pagoda_backend_testkit::direct::{assert_close, reference, rows_case, run_twice, HEAD_SHAPES};
use pagoda_backend_testkit::{run_check, Check, Tolerance};
use pagoda_core::{AttentionBackend, AttentionConfig, DType, Device};
use pagoda_selector::{select, BackendOverride};
use proptest::prelude::*;

use pagoda_backends as _;

mod invariant;
use invariant::invariant_subject;

fn auto(cfg: &AttentionConfig) -> Box<dyn AttentionBackend> {
    let sel = select(cfg, &BackendOverride::default()).unwrap();
    assert_eq!(sel.name(), "decode=paged,prefill=flash");
    sel.build(cfg).unwrap()
}

fn check(cfg: AttentionConfig, rows: &[(usize, usize)], seed: u64, threads: usize) {
    let c = rows_case(&cfg, rows, seed).expect("valid case");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let (want_o, want_l) = reference(&c).unwrap();
        let mut be = auto(&c.cfg);
        let (o, l) = run_twice(be.as_mut(), &c, true).unwrap();
        assert_close("out", &o, &want_o, &c, Tolerance::F32);
        assert_close("lse", &l, &want_l, &c, Tolerance::F32);
        let (o2, _) = run_twice(be.as_mut(), &c, false).unwrap();
        assert_eq!(o, o2, "LSE output must not change the attention output");
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn mixed_batches_match_reference(
        shape in 0usize..HEAD_SHAPES.len(),
        bs in prop::sample::select(vec![1usize, 4, 16, 32]),
        decodes in prop::collection::vec(1usize..300, 0..3),
        prefills in prop::collection::vec((2usize..160, 0usize..200), 0..4),
        seed in any::<u64>(),
        threads in 1usize..8,
        kv_dtype in prop::sample::select(vec![DType::F32, DType::BF16, DType::F16]),
    ) {
        let (nh, nkv, hd) = HEAD_SHAPES[shape];
        let mut rows: Vec<(usize, usize)> = decodes.iter().map(|&s| (1, s)).collect();
        rows.extend(prefills.iter().map(|&(q, ctx)| (q, q + ctx)));
        prop_assume!(!rows.is_empty());
        let cfg = AttentionConfig { kv_dtype, ..AttentionConfig::cpu_f32(nh, nkv, hd, bs) };
        check(cfg, &rows, seed, threads);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// Speculative decoding's verify rows as one row of `k + 1` causal query tokens
    /// (k = 1..=8 drafts) over a long cached context, beside plain decode rows: a row
    /// of query length > 1 is a prefill row, so the automatic selection sends it to
    /// `flash` (whose per-row arithmetic is `paged`'s, as the invariance check below
    /// shows). The engine's runner instead hands the backends one decode row per
    /// verified token (`paged`, 3x cheaper than `flash` for such short rows here);
    /// this is the route any other caller of the protocol gets.
    #[test]
    fn verify_rows_match_reference(
        shape in 0usize..HEAD_SHAPES.len(),
        bs in prop::sample::select(vec![4usize, 16]),
        decodes in prop::collection::vec(1usize..600, 0..3),
        verifies in prop::collection::vec((1usize..=8, 1usize..600), 1..4),
        seed in any::<u64>(),
        threads in 1usize..4,
    ) {
        let (nh, nkv, hd) = HEAD_SHAPES[shape];
        let mut rows: Vec<(usize, usize)> = decodes.iter().map(|&s| (1, s)).collect();
        rows.extend(verifies.iter().map(|&(k, ctx)| (k + 1, k + 1 + ctx)));
        check(AttentionConfig::cpu_f32(nh, nkv, hd, bs), &rows, seed, threads);
    }
}

#[test]
fn long_mixed_batch_matches_reference() {
    check(
        AttentionConfig::cpu_f32(32, 8, 128, 16),
        &[(1, 70), (1, 1), (300, 700), (129, 129)],
        11,
        2,
    );
}

/// A row's bits are the same as a decode row on `paged` and as a row of a prefill
/// chunk of any length on `flash`, in any batch, over any block layout and thread
/// count: the kit's invariance check on the composition, per KV dtype.
#[test]
fn paged_flash_hybrid_is_batch_invariant() {
    for kv in [DType::F32, DType::BF16, DType::F16, DType::F8E4M3] {
        run_check(
            Check::BatchInvariance,
            invariant_subject().on(Device::Cpu, DType::F32, kv),
            Tolerance::F32,
            Some(file!()),
        );
    }
}

/// `build_batch_invariant` refuses a composition of two arithmetics, naming both.
#[test]
fn a_mixed_arithmetic_composition_is_refused_when_invariance_is_required() {
    let cfg = AttentionConfig::cpu_f32(9, 3, 64, 16);
    let sel = select(
        &cfg,
        &BackendOverride::parse("decode=naive,prefill=flash").unwrap(),
    )
    .unwrap();
    let err = sel
        .build_batch_invariant(&cfg)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("not batch-invariant") && err.contains("cpu-split256"),
        "{err}"
    );
    assert!(sel.build(&cfg).is_ok(), "plain build still composes it");
    let auto = select(&cfg, &BackendOverride::default()).unwrap();
    let be = auto
        .build_batch_invariant(&cfg)
        .expect("paged + flash is invariant");
    assert_eq!(
        be.batch_invariant(),
        Some(pagoda_core::CPU_SPLIT_ARITHMETIC)
    );
}
