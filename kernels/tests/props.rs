//! Property tests: every fast kernel against its slow reference.
//!
//! Tolerances: norms, RoPE, SwiGLU, GeGLU and log-softmax within 1e-5 relative + 1e-6
//! absolute. (The packed GEMMs are tested in `packed.rs`; the unpacked baseline in
//! `benches/tests/unpacked.rs`.)

mod common;

use pagoda_kernels::*;
use proptest::prelude::*;

fn vals(n: usize) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-2.0f32..2.0, n)
}

fn close(a: f32, b: f64, rel: f64, abs: f64) -> bool {
    ((a as f64) - b).abs() <= abs + rel * b.abs()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn rms_norm_matches_reference(rows in 1usize..6, dim in 1usize..100, seed in vals(600), eps in 1e-6f32..1e-3) {
        let x: Vec<f32> = seed.iter().cycle().take(rows * dim).copied().collect();
        let w: Vec<f32> = seed.iter().rev().cycle().take(dim).copied().collect();
        let mut out = vec![0.0; rows * dim];
        let mut r = vec![0.0; rows * dim];
        rms_norm(&x, &w, eps, &mut out).unwrap();
        rms_norm_ref(&x, &w, eps, &mut r).unwrap();
        for (a, b) in out.iter().zip(&r) {
            prop_assert!(close(*a, *b as f64, 1e-5, 1e-6), "{a} vs {b}");
        }
        // Fused: residual + delta, then norm.
        let delta: Vec<f32> = x.iter().map(|v| v * 0.5 - 0.1).collect();
        let mut resid = x.clone();
        add_rms_norm(&mut resid, &delta, &w, eps, &mut out).unwrap();
        let summed: Vec<f32> = x.iter().zip(&delta).map(|(a, b)| a + b).collect();
        prop_assert_eq!(&resid, &summed);
        rms_norm_ref(&summed, &w, eps, &mut r).unwrap();
        for (a, b) in out.iter().zip(&r) {
            prop_assert!(close(*a, *b as f64, 1e-5, 1e-6), "{a} vs {b}");
        }
    }

    #[test]
    fn rope_matches_reference(
        tokens in 1usize..5, heads in 1usize..4, half in 1usize..33, seed in vals(512),
        positions in proptest::collection::vec(0u32..2048, 5), scaled in any::<bool>(),
        theta in prop_oneof![Just(10000.0f32), Just(500000.0f32)],
    ) {
        let head_dim = 2 * half;
        let scaling = Llama3Scaling { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 64 };
        let scaling = if scaled { Some(&scaling) } else { None };
        let cache = RopeCache::new(head_dim, 2048, theta, scaling).unwrap();
        let x: Vec<f32> = seed.iter().cycle().take(tokens * heads * head_dim).copied().collect();
        let pos = &positions[..tokens];
        let mut fast = x.clone();
        cache.apply(&mut fast, heads, pos).unwrap();
        let mut slow = x.clone();
        rope_ref(&mut slow, heads, head_dim, pos, theta, scaling);
        for (a, b) in fast.iter().zip(&slow) {
            // Angles up to ~2048 rad are rounded to f32 (as HF does): ~1e-4 absolute.
            prop_assert!(close(*a, *b as f64, 1e-5, 3e-4), "{a} vs {b}");
        }
    }

    /// Against the plain loop (first maximum, `(0, -inf)` when nothing beats -inf),
    /// with ties and -inf planted.
    #[test]
    fn max_index_matches_plain_loop(mut row in proptest::collection::vec(-4.0f32..4.0, 0..300), ties in 0usize..5, masked in 0usize..300) {
        for (i, v) in row.iter_mut().enumerate() {
            if i % 7 == ties { *v = 3.99; }
            if i < masked { *v = f32::NEG_INFINITY; }
        }
        let mut want = (0usize, f32::NEG_INFINITY);
        for (i, &v) in row.iter().enumerate() {
            if v > want.1 { want = (i, v); }
        }
        prop_assert_eq!(max_index(&row), want);
    }

    #[test]
    fn first_nan_or_inf_finds_the_first(len in 0usize..700, a in 0usize..700, b in 0usize..700, kind in 0usize..3) {
        let mut row: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 - 100.0).collect();
        if len > 0 { row[len / 2] = f32::NEG_INFINITY; }
        let bad = [f32::NAN, f32::INFINITY, f32::NAN][kind];
        let mut want = None;
        for p in [a, b] {
            if p < len && p != len / 2 {
                row[p] = bad;
                want = Some(want.map_or(p, |w: usize| w.min(p)));
            }
        }
        prop_assert_eq!(first_nan_or_inf(&row), want);
    }

    /// Within 2.5 ulp (3e-7 relative) of e^x over the clamped range [-87, 88].
    #[test]
    fn exp_fast_matches_exp(x in -87.0f32..88.0) {
        let (a, b) = (exp_fast(x) as f64, (x as f64).exp());
        prop_assert!((a - b).abs() <= 3e-7 * b, "exp({x}): {a} vs {b}");
    }

    #[test]
    fn silu_mul_matches_reference(g in vals(40), u in vals(40)) {
        let mut a = vec![0.0; 40];
        let mut b = vec![0.0; 40];
        silu_mul(&g, &u, &mut a).unwrap();
        silu_mul_ref(&g, &u, &mut b).unwrap();
        for (x, y) in a.iter().zip(&b) {
            prop_assert!(close(*x, *y as f64, 1e-5, 1e-6));
        }
    }

    #[test]
    fn fused_silu_mul_matches_reference(rows in prop_oneof![1usize..4, 150usize..260], inter in 1usize..200, seed in vals(997)) {
        let gu: Vec<f32> = seed.iter().cycle().take(rows * 2 * inter).copied().collect();
        let mut out = vec![f32::NAN; rows * inter];
        silu_mul_fused(&gu, inter, &mut out).unwrap();
        let mut r = vec![0.0; inter];
        for t in 0..rows {
            let row = &gu[t * 2 * inter..(t + 1) * 2 * inter];
            silu_mul_ref(&row[..inter], &row[inter..], &mut r).unwrap();
            for (a, b) in out[t * inter..(t + 1) * inter].iter().zip(&r) {
                prop_assert!(close(*a, *b as f64, 1e-5, 1e-6));
            }
        }
    }

    #[test]
    fn fused_gelu_tanh_mul_matches_reference(rows in 1usize..5, inter in 1usize..70, seed in vals(331)) {
        let gu: Vec<f32> = seed.iter().cycle().take(rows * 2 * inter).map(|x| x * 3.0).collect();
        let mut out = vec![f32::NAN; rows * inter];
        gelu_tanh_mul_fused(&gu, inter, &mut out).unwrap();
        let mut r = vec![0.0; inter];
        for t in 0..rows {
            let row = &gu[t * 2 * inter..(t + 1) * 2 * inter];
            gelu_tanh_mul_ref(&row[..inter], &row[inter..], &mut r).unwrap();
            for (a, b) in out[t * inter..(t + 1) * inter].iter().zip(&r) {
                prop_assert!(close(*a, *b as f64, 1e-5, 1e-6));
            }
        }
    }

    #[test]
    fn softmaxes_match_reference(row in proptest::collection::vec(-30.0f32..30.0, 1..200)) {
        let r = log_softmax_ref(&row);
        let mut ls = row.clone();
        log_softmax(&mut ls);
        let mut sm = row.clone();
        softmax(&mut sm);
        for i in 0..row.len() {
            prop_assert!(close(ls[i], r[i], 1e-5, 1e-5), "{} vs {}", ls[i], r[i]);
            prop_assert!(close(sm[i], r[i].exp(), 1e-5, 1e-7), "{} vs {}", sm[i], r[i].exp());
        }
        let best = argmax(&row).unwrap();
        prop_assert!(row.iter().all(|&v| v <= row[best]));
        prop_assert!(row[..best].iter().all(|&v| v < row[best]));
    }
}

#[test]
fn shape_errors_are_errors_not_panics() {
    let mut out = vec![0.0; 4];
    assert!(matches!(
        matmul_t_ref(&[1.0; 3], &[1.0; 4], &mut out, 2, 2, 2),
        Err(KernelError::ShapeMismatch { name: "x", .. })
    ));
    assert!(rms_norm(&[1.0; 5], &[1.0; 2], 1e-5, &mut [0.0; 5]).is_err());
    assert!(RopeCache::new(3, 8, 10000.0, None).is_err());
    let cache = RopeCache::new(4, 8, 10000.0, None).unwrap();
    assert!(matches!(
        cache.apply(&mut [0.0; 4], 1, &[8]),
        Err(KernelError::PositionOutOfRange { position: 8, .. })
    ));
    assert!(silu_mul(&[1.0], &[1.0, 2.0], &mut [0.0]).is_err());
    assert!(silu_mul_fused(&[1.0; 5], 2, &mut [0.0; 2]).is_err());
    assert!(silu_mul_fused(&[1.0; 4], 0, &mut []).is_err());
    assert_eq!(argmax(&[]), None);
    assert_eq!(argmax(&[f32::NAN, 1.0, 3.0, 3.0]), Some(2));
}

/// Below the clamp `exp_fast` gives a tiny positive value, never NaN: the attention
/// softmax feeds it `-inf` (a row's first chunk) and very negative differences.
#[test]
fn exp_fast_at_the_edges() {
    assert_eq!(exp_fast(0.0), 1.0);
    for x in [-87.5, -90.0, -1e30, f32::NEG_INFINITY] {
        let e = exp_fast(x);
        assert!((0.0..1e-37).contains(&e), "exp_fast({x}) = {e}");
    }
    assert!(exp_fast(f32::NAN).is_finite());
}

/// Llama 3.1 as a GGUF carries it: llama.cpp's converter turns the llama3 scaling
/// into per-frequency divisors (`rope_freqs.weight`), computed in f32 from f32
/// frequencies. Dividing by them rotates as the llama3 rule does (to f32 rounding),
/// and bad factors are refused.
#[test]
fn freq_factors_reproduce_llama3_scaling() {
    let (hd, theta) = (128usize, 500_000.0f32);
    let s = Llama3Scaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    // conversion/llama.py, in f32 as torch computes it there.
    let factors: Vec<f32> = (0..hd / 2)
        .map(|i| {
            let freq = 1.0f32 / theta.powf((2 * i) as f32 / hd as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            let (lo, hi) = (8192.0 / 1.0f32, 8192.0 / 4.0f32);
            if wavelen < hi {
                1.0
            } else if wavelen > lo {
                8.0
            } else {
                let smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
                1.0 / ((1.0 - smooth) / 8.0 + smooth)
            }
        })
        .collect();
    let positions: Vec<u32> = vec![0, 1, 7, 100, 4095, 8191, 30_000, 131_071];
    let x: Vec<f32> = (0..positions.len() * hd)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let scaled = RopeCache::new(hd, 131_072, theta, Some(&s)).unwrap();
    let factored = RopeCache::with_freq_factors(hd, 131_072, theta, None, Some(&factors)).unwrap();
    let (mut a, mut b) = (x.clone(), x.clone());
    scaled.apply(&mut a, 1, &positions).unwrap();
    factored.apply(&mut b, 1, &positions).unwrap();
    for (i, (p, q)) in a.iter().zip(&b).enumerate() {
        // Angles up to ~1.3e5 rad: f32 frequencies that differ in the last bit move
        // them by ~1e-2 at the far positions, so compare per position scale.
        let pos = positions[i / hd] as f32;
        assert!(
            (p - q).abs() <= 1e-5 + pos * 2e-7,
            "element {i}: {p} vs {q}"
        );
    }
    // Without scaling, factors of 1 change nothing.
    let plain = RopeCache::new(hd, 64, theta, None).unwrap();
    let ones = RopeCache::with_freq_factors(hd, 64, theta, None, Some(&vec![1.0; hd / 2])).unwrap();
    let (mut a, mut b) = (x[..hd].to_vec(), x[..hd].to_vec());
    plain.apply(&mut a, 1, &[63]).unwrap();
    ones.apply(&mut b, 1, &[63]).unwrap();
    assert_eq!(a, b);
    for bad in [
        vec![1.0; hd / 2 - 1],
        vec![0.0; hd / 2],
        vec![f32::NAN; hd / 2],
    ] {
        assert!(RopeCache::with_freq_factors(hd, 8, theta, None, Some(&bad)).is_err());
    }
}
