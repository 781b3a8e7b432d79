//! `naive` on the emulator against the f64 reference: f32/bf16/f16, odd head dims and
//! block sizes, GQA, chunked-prefill context offsets.

mod common;
use common::*;
use half::{bf16, f16};
use pagoda_cuda_kernels::emu;
use proptest::prelude::*;

fn run<T: Conv>(
    seqs: &[SeqSpec],
    h: usize,
    kvh: usize,
    d: usize,
    bs: usize,
    seed: u64,
) -> Result<(), String> {
    let case = Case::<T>::new(seqs, h, kvh, d, bs, seed);
    let mut out = vec![T::default(); case.q.len()];
    let mut lse = vec![0.0f32; case.num_tokens * h];
    let n = seqs.len();
    emu::naive(case.io(&mut out, &mut lse), &case.batch(0..n), &case.shape)
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
    run::<f32>(&seqs, 4, 2, 64, 16, 1).unwrap();
    run::<bf16>(&seqs, 4, 1, 128, 32, 2).unwrap();
    run::<f16>(&seqs, 3, 3, 80, 7, 3).unwrap();
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
    ) {
        let r = match dt {
            0 => run::<f32>(&seqs, h, kvh, d, bs, seed),
            1 => run::<bf16>(&seqs, h, kvh, d, bs, seed),
            _ => run::<f16>(&seqs, h, kvh, d, bs, seed),
        };
        prop_assert!(r.is_ok(), "{:?}", r);
    }
}
