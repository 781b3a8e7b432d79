//! `flash.cu` (mma.sync prefill) on the emulator against the f64 reference of
//! `pagoda-cuda-testkit`: variable
//! lengths, context offsets (chunked prefill / prefix hits), GQA, several query and KV
//! tiles, sliding windows (KV tiles from the first row's window, rows masking their
//! own) and soft caps; and the planted fragment-layout bug, which must fail the same
//! check.

use half::{bf16, f16};
use pagoda_backend_cuda_flash::{FLASH_CU, FLASH_PLANTED_CU};
use pagoda_cuda_kernels::{emu, AttnKernel};
use pagoda_cuda_testkit::*;
use proptest::prelude::*;

/// (num_heads, num_kv_heads, head_dim, block_size).
type Dims = (usize, usize, usize, usize);

/// Sliding window and soft cap.
type Options = (Option<usize>, Option<f32>);
const NONE: Options = (None, None);

/// Runs `kernel` over `seqs[first..]` and returns the max error and the LSE check.
fn run<T: Conv>(
    kernel: &'static AttnKernel,
    seqs: &[SeqSpec],
    (h, kvh, d, bs): Dims,
    first: usize,
    seed: u64,
    (window, cap): Options,
) -> (f64, Result<(), String>) {
    let case = Case::<T>::new(seqs, h, kvh, d, bs, seed).with_options(window, cap);
    let mut out = vec![T::default(); case.q.len()];
    let mut lse = vec![0.0f32; case.num_tokens * h];
    let range = first..seqs.len();
    emu::attn(
        kernel,
        case.io(&mut out, &mut lse),
        &case.batch(range.clone()),
        &case.shape,
    )
    .expect("flash launch");
    let (want, want_lse) = case.reference(range);
    (max_err(&out, &want), check_lse(&lse, &want_lse))
}

fn check<T: Conv>(
    seqs: &[SeqSpec],
    dims: Dims,
    first: usize,
    seed: u64,
    options: Options,
) -> Result<(), String> {
    let (err, lse) = run::<T>(&FLASH_CU, seqs, dims, first, seed, options);
    let tol = tolerance::<T>(true);
    if err > tol {
        return Err(format!("max error {err} > {tol}"));
    }
    lse
}

#[test]
fn flash_fixed_shapes() {
    // A decode row first (skipped: first = 1), then prefill with and without context;
    // 70 rows make two query tiles, 90+ keys two or more KV tiles.
    let seqs = [
        SeqSpec { q_len: 1, ctx: 9 },
        SeqSpec { q_len: 70, ctx: 0 },
        SeqSpec { q_len: 5, ctx: 37 },
    ];
    check::<bf16>(&seqs, (2, 1, 64, 16), 1, 1, NONE).unwrap();
    check::<f16>(&seqs[1..], (2, 2, 128, 32), 0, 2, NONE).unwrap();
}

#[test]
fn flash_sliding_window_and_soft_cap() {
    // 70 rows after 30 cached (positions 30..99). Window 65: the second query tile
    // (positions 94..99) reads KV tiles from key 30, its first row's window start
    // (unaligned to 64); window 3: most rows see no key of the second KV tile.
    let seqs = [
        SeqSpec { q_len: 70, ctx: 30 },
        SeqSpec { q_len: 5, ctx: 37 },
    ];
    check::<bf16>(&seqs, (2, 1, 64, 16), 0, 3, (Some(65), Some(50.0))).unwrap();
    check::<f16>(&seqs, (2, 2, 64, 32), 0, 4, (Some(3), None)).unwrap();
    check::<f16>(&seqs[1..], (2, 1, 128, 16), 0, 5, (None, Some(0.5))).unwrap();
}

#[test]
fn planted_fragment_bug_is_caught() {
    let seqs = [SeqSpec { q_len: 20, ctx: 12 }];
    let (good, _) = run::<bf16>(&FLASH_CU, &seqs, (1, 1, 64, 16), 0, 7, NONE);
    let (bad, _) = run::<bf16>(&FLASH_PLANTED_CU, &seqs, (1, 1, 64, 16), 0, 7, NONE);
    let tol = tolerance::<bf16>(true);
    assert!(good <= tol, "correct kernel: {good} > {tol}");
    assert!(
        bad > 10.0 * tol,
        "the planted a2a3/a4a5 swap went unnoticed: error {bad}"
    );
}

#[test]
fn flash_refuses_what_it_has_no_kernel_for() {
    let case = Case::<f32>::new(&[SeqSpec { q_len: 3, ctx: 0 }], 1, 1, 64, 16, 1);
    let mut out = vec![0.0; case.q.len()];
    let mut lse = vec![0.0; case.num_tokens];
    let (io, batch) = (case.io(&mut out, &mut lse), case.batch(0..1));
    assert!(emu::attn(&FLASH_CU, io, &batch, &case.shape).is_err());
    let case = Case::<bf16>::new(&[SeqSpec { q_len: 3, ctx: 0 }], 1, 1, 80, 16, 1);
    let mut out = vec![bf16::ZERO; case.q.len()];
    let mut lse = vec![0.0; case.num_tokens];
    let (io, batch) = (case.io(&mut out, &mut lse), case.batch(0..1));
    assert!(emu::attn(&FLASH_CU, io, &batch, &case.shape).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]
    #[test]
    fn flash_matches_reference(
        seqs in seq_specs(2, 40, 50),
        (h, kvh) in prop_oneof![Just((2usize, 1usize)), Just((2, 2))],
        d in prop_oneof![Just(64usize), Just(128)],
        bs in prop_oneof![Just(16usize), Just(32)],
        f16_dtype in any::<bool>(),
        seed in any::<u64>(),
        window in windows(60),
        cap in soft_caps(),
    ) {
        let o = (window, cap);
        let r = if f16_dtype {
            check::<f16>(&seqs, (h, kvh, d, bs), 0, seed, o)
        } else {
            check::<bf16>(&seqs, (h, kvh, d, bs), 0, seed, o)
        };
        prop_assert!(r.is_ok(), "{:?}", r);
    }
}
