//! `naive.cu` on the emulator against the f64 reference of `pagoda-cuda-testkit`:
//! f32/bf16/f16, odd head dims and block sizes, GQA, chunked-prefill context offsets, sliding windows, soft caps.

use half::{bf16, f16};
use pagoda_backend_cuda_naive::NAIVE_CU;
use pagoda_cuda_kernels::emu;
use pagoda_cuda_testkit::*;
use proptest::prelude::*;

fn run<T: Conv>(
    seqs: &[SeqSpec],
    (h, kvh, d, bs): (usize, usize, usize, usize),
    seed: u64,
    (window, cap): (Option<usize>, Option<f32>),
) -> Result<(), String> {
    let case = Case::<T>::new(seqs, h, kvh, d, bs, seed).with_options(window, cap);
    let mut out = vec![T::default(); case.q.len()];
    let mut lse = vec![0.0f32; case.num_tokens * h];
    let n = seqs.len();
    emu::attn(
        &NAIVE_CU,
        case.io(&mut out, &mut lse),
        &case.batch(0..n),
        &case.shape,
    )
    .map_err(|e| e.to_string())?;
    let (want, want_lse) = case.reference(0..n);
    let err = max_err(&out, &want);
    if err > tolerance::<T>(false) {
        return Err(format!("max error {err} > {}", tolerance::<T>(false)));
    }
    check_lse(&lse, &want_lse)
}

#[test]
fn naive_fixed_shapes() {
    let seqs = [
        SeqSpec { q_len: 1, ctx: 40 },
        SeqSpec { q_len: 1, ctx: 3 },
        SeqSpec { q_len: 5, ctx: 130 },
    ];
    run::<f32>(&seqs, (4, 2, 64, 16), 1, NONE).unwrap();
    run::<bf16>(&seqs, (4, 1, 128, 32), 2, NONE).unwrap();
    run::<f16>(&seqs, (3, 3, 80, 7), 3, NONE).unwrap();
}

const NONE: (Option<usize>, Option<f32>) = (None, None);

#[test]
fn naive_sliding_window_and_soft_cap() {
    // Windows shorter than the context, than a key chunk (128 threads), and longer
    // than the sequence; a tight cap and Gemma 2's.
    let seqs = [
        SeqSpec { q_len: 1, ctx: 200 },
        SeqSpec { q_len: 3, ctx: 4 },
        SeqSpec { q_len: 4, ctx: 140 },
    ];
    run::<f32>(&seqs, (2, 1, 64, 16), 4, (Some(5), None)).unwrap();
    run::<bf16>(&seqs, (2, 2, 24, 5), 5, (Some(130), Some(50.0))).unwrap();
    run::<f16>(&seqs, (2, 1, 32, 16), 6, (Some(1), Some(0.5))).unwrap();
    run::<f32>(&seqs, (2, 1, 16, 1), 7, (Some(1000), Some(2.0))).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn naive_matches_reference(
        seqs in seq_specs(3, 4, 150),
        (h, kvh) in prop_oneof![Just((2usize, 1usize)), Just((4, 2)), Just((3, 3))],
        d in prop_oneof![Just(8usize), Just(24), Just(64)],
        bs in prop_oneof![Just(1usize), Just(5), Just(16)],
        dt in 0..3u8,
        seed in any::<u64>(),
        window in windows(40),
        cap in soft_caps(),
    ) {
        let o = (window, cap);
        let r = match dt {
            0 => run::<f32>(&seqs, (h, kvh, d, bs), seed, o),
            1 => run::<bf16>(&seqs, (h, kvh, d, bs), seed, o),
            _ => run::<f16>(&seqs, (h, kvh, d, bs), seed, o),
        };
        prop_assert!(r.is_ok(), "{:?}", r);
    }
}
