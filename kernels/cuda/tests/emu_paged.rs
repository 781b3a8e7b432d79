//! `paged` (split-KV decode + merge) on the emulator against the f64 reference:
//! one split and several, GQA groups below and above the per-CTA limit, block sizes
//! 16/32, head dims 64/128/256, sliding windows (partitions from the window's first
//! key, empty ones merged away) and soft caps.

use half::{bf16, f16};
use pagoda_cuda_kernels::{emu, SplitPlan};
use pagoda_cuda_testkit::*;
use proptest::prelude::*;

fn run<T: Conv>(
    ctxs: &[usize],
    (h, kvh, d, bs): (usize, usize, usize, usize),
    splits: Option<usize>,
    seed: u64,
    (window, cap): (Option<usize>, Option<f32>),
) -> Result<(), String> {
    let seqs: Vec<SeqSpec> = ctxs.iter().map(|&ctx| SeqSpec { q_len: 1, ctx }).collect();
    let case = Case::<T>::new(&seqs, h, kvh, d, bs, seed).with_options(window, cap);
    // The plan covers the keys a row attends to: the last `window` under a window.
    let max_len = SplitPlan::keys(ctxs.iter().max().unwrap() + 1, window);
    let plan = match splits {
        None => SplitPlan::single(max_len, bs),
        Some(n) => {
            let partition = max_len.div_ceil(n).div_ceil(bs) * bs;
            SplitPlan {
                num_splits: max_len.div_ceil(partition),
                partition_size: partition,
            }
        }
    };
    let mut out = vec![T::default(); case.q.len()];
    let mut lse = vec![0.0f32; case.num_tokens * h];
    let n = seqs.len();
    emu::paged(
        case.io(&mut out, &mut lse),
        &case.batch(0..n),
        &case.shape,
        plan,
    )
    .map_err(|e| e.to_string())?;
    let (want, want_lse) = case.reference(0..n);
    let err = max_err(&out, &want);
    if err > tolerance::<T>(false) {
        return Err(format!(
            "{plan:?}: max error {err} > {}",
            tolerance::<T>(false)
        ));
    }
    check_lse(&lse, &want_lse)
}

#[test]
fn paged_fixed_shapes() {
    run::<bf16>(&[70, 0, 33], (4, 2, 128, 16), None, 1, NONE).unwrap();
    run::<bf16>(&[70, 0, 33], (4, 2, 128, 16), Some(3), 2, NONE).unwrap();
    run::<f16>(&[50, 17], (8, 1, 64, 32), Some(2), 3, NONE).unwrap();
    run::<f32>(&[40], (2, 1, 64, 16), Some(2), 4, NONE).unwrap();
    run::<bf16>(&[20], (2, 2, 256, 16), None, 5, NONE).unwrap();
    // 10 query heads per KV head: two CTAs (8 + 2 heads) per KV head.
    run::<bf16>(&[24, 9], (10, 1, 64, 16), Some(2), 6, NONE).unwrap();
}

const NONE: (Option<usize>, Option<f32>) = (None, None);

#[test]
fn paged_sliding_window_and_soft_cap() {
    // Window 20 over 71 keys: partitions of 16 from key 51 (51..67, 67..71); the
    // 1-key sequence's second partition is empty (lse -inf, dropped by the merge).
    run::<bf16>(&[70, 0, 33], (4, 2, 128, 16), Some(3), 7, (Some(20), None)).unwrap();
    run::<f16>(&[50, 17], (8, 1, 64, 32), None, 8, (Some(1), Some(0.5))).unwrap();
    run::<f32>(&[40, 3], (2, 1, 64, 16), Some(2), 9, (Some(17), Some(50.0))).unwrap();
    // A window longer than the sequence changes nothing.
    run::<bf16>(&[20], (2, 2, 256, 16), Some(2), 10, (Some(1000), Some(2.0))).unwrap();
}

#[test]
fn paged_refuses_prefill_rows_and_bad_plans() {
    let case = Case::<bf16>::new(&[SeqSpec { q_len: 2, ctx: 3 }], 2, 1, 64, 16, 1);
    let mut out = vec![bf16::ZERO; case.q.len()];
    let mut lse = vec![0.0; case.num_tokens * 2];
    let r = emu::paged(
        case.io(&mut out, &mut lse),
        &case.batch(0..1),
        &case.shape,
        SplitPlan::single(5, 16),
    );
    assert!(r.is_err());
    // Under a window of 16, one partition of 16 keys covers a 41-token sequence.
    let windowed = Case::<bf16>::new(&[SeqSpec { q_len: 1, ctx: 40 }], 2, 1, 64, 16, 1)
        .with_options(Some(16), None);
    let mut out = vec![bf16::ZERO; windowed.q.len()];
    let mut lse = vec![0.0; windowed.num_tokens * 2];
    let one = SplitPlan::single(16, 16);
    assert!(emu::paged(
        windowed.io(&mut out, &mut lse),
        &windowed.batch(0..1),
        &windowed.shape,
        one
    )
    .is_ok());
    let case = Case::<bf16>::new(&[SeqSpec { q_len: 1, ctx: 40 }], 2, 1, 64, 16, 1);
    let mut out = vec![bf16::ZERO; case.q.len()];
    let mut lse = vec![0.0; case.num_tokens * 2];
    // 16 keys cannot cover a 41-token sequence; 8 is not a multiple of the block size.
    let short = SplitPlan {
        num_splits: 1,
        partition_size: 16,
    };
    assert!(emu::paged(
        case.io(&mut out, &mut lse),
        &case.batch(0..1),
        &case.shape,
        short
    )
    .is_err());
    let odd = SplitPlan {
        num_splits: 6,
        partition_size: 8,
    };
    assert!(emu::paged(
        case.io(&mut out, &mut lse),
        &case.batch(0..1),
        &case.shape,
        odd
    )
    .is_err());
}

#[test]
fn split_plan_covers_the_sequence() {
    for &(len, bs, ctas, sms) in &[
        (1usize, 16usize, 1usize, 132usize),
        (4096, 16, 64 * 8, 132),
        (8192, 32, 8, 132),
        (300, 16, 1, 4),
    ] {
        let p = SplitPlan::choose(len, bs, ctas, sms);
        assert!(
            p.num_splits >= 1 && p.partition_size.is_multiple_of(bs),
            "{p:?}"
        );
        assert!(p.num_splits * p.partition_size >= len, "{p:?}");
        assert!(
            (p.num_splits - 1) * p.partition_size < len,
            "{p:?} has an empty split"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]
    #[test]
    fn paged_matches_reference(
        ctxs in prop::collection::vec(0usize..120, 1..=3),
        (h, kvh) in prop_oneof![Just((2usize, 1usize)), Just((4, 4)), Just((6, 2))],
        d in prop_oneof![Just(64usize), Just(128)],
        bs in prop_oneof![Just(16usize), Just(32)],
        splits in prop_oneof![Just(None), Just(Some(2usize)), Just(Some(4))],
        dt in 0..3u8,
        seed in any::<u64>(),
        window in windows(80),
        cap in soft_caps(),
    ) {
        let o = (window, cap);
        let r = match dt {
            0 => run::<f32>(&ctxs, (h, kvh, d, bs), splits, seed, o),
            1 => run::<bf16>(&ctxs, (h, kvh, d, bs), splits, seed, o),
            _ => run::<f16>(&ctxs, (h, kvh, d, bs), splits, seed, o),
        };
        prop_assert!(r.is_ok(), "{:?}", r);
    }
}
