//! The families' extra kernels of model.cu (Q/K norms, the final-logit soft cap, MoE
//! routing and the weighted expert sum) against slow, obviously correct references of
//! what the CPU decoder does (models/src/llama.rs, models/src/moe.rs), on f32; and bad
//! input is an error, never a panic.

use pagoda_cuda_kernels::emu_model_families::{self as ef, MoeAccIo, QkShape};
use pagoda_cuda_kernels::Error;
use pagoda_cuda_testkit::Rng;
use proptest::prelude::*;

fn rand(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.unit() * scale).collect()
}

/// The CPU's routing, written the slow way: softmax in f64, experts sorted by
/// descending logit (a stable sort: the smaller index first on ties), the first `k`
/// kept and renormalised. Dense `[experts]` weights.
fn route_ref(logits: &[f32], k: usize) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let exp: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
    let total: f64 = exp.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap());
    let kept: f64 = order[..k].iter().map(|&e| exp[e] / total).sum();
    let mut w = vec![0.0; logits.len()];
    for &e in &order[..k] {
        w[e] = exp[e] / total / kept;
    }
    w
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Each q and k head normalised as pagoda_kernels::rms_norm normalises a row of
    /// head_dim (what the CPU decoder runs on q and k): only the order of the sum of
    /// squares differs, so 4e-6 relative; v is untouched (bit-equal).
    #[test]
    fn qk_norm_is_rms_norm_per_head(tokens in 1..4usize, kv_heads in 1..3usize,
                                    group in 1..4usize, d in 1..80usize, seed in any::<u64>()) {
        let (nkv, nh) = (kv_heads, kv_heads * group);
        let mut rng = Rng(seed | 1);
        let width = (nh + 2 * nkv) * d;
        let qkv = rand(&mut rng, tokens * width, 3.0);
        let (qw, kw) = (rand(&mut rng, d, 1.5), rand(&mut rng, d, 1.5));
        let mut got = qkv.clone();
        let shape = QkShape { num_heads: nh, num_kv_heads: nkv, head_dim: d };
        ef::qk_norm(&mut got, &qw, &kw, shape, 1e-6).unwrap();
        for t in 0..tokens {
            for h in 0..nh + 2 * nkv {
                let at = t * width + h * d;
                let (x, g) = (&qkv[at..at + d], &got[at..at + d]);
                if h >= nh + nkv {
                    prop_assert_eq!(g, x, "v head {} of token {} changed", h, t);
                    continue;
                }
                let w = if h < nh { &qw } else { &kw };
                let mut want = vec![0.0f32; d];
                pagoda_kernels::rms_norm(x, w, 1e-6, &mut want).unwrap();
                for (g, e) in g.iter().zip(&want) {
                    prop_assert!((g - e).abs() <= 4e-6 * e.abs(), "head {}: {} vs {}", h, g, e);
                }
            }
        }
    }

    /// `cap * (x / cap).tanh()` as the CPU computes it: the host's tanhf on both sides,
    /// so within 1 ulp (2^-23 relative, plus the smallest normal for values near 0).
    #[test]
    fn soft_cap_is_the_cpus(n in 1..600usize, cap in 0.5f32..50.0, seed in any::<u64>()) {
        let mut rng = Rng(seed | 1);
        let x = rand(&mut rng, n, 4.0 * cap);
        let mut got = x.clone();
        ef::soft_cap(&mut got, cap).unwrap();
        for (g, x) in got.iter().zip(&x) {
            let want = cap * (x / cap).tanh();
            prop_assert!((g - want).abs() <= want.abs() * f32::EPSILON + f32::MIN_POSITIVE,
                "{} -> {} vs {}", x, g, want);
            prop_assert!(g.abs() <= cap);
        }
    }

    /// Routing: the same experts as the slow reference (ties included: logits drawn
    /// from a few values), weights within 1e-6 of its f64 ones (f32 exp and sums over
    /// <= 16 terms), exactly 0 elsewhere, summing to 1.
    #[test]
    fn moe_route_is_softmax_top_k_renormalised(tokens in 1..6usize, experts in 1..17usize,
                                               k_pick in 1..17usize, ties in any::<bool>(),
                                               seed in any::<u64>()) {
        let k = 1 + (k_pick - 1) % experts;
        let mut rng = Rng(seed | 1);
        let logits: Vec<f32> = (0..tokens * experts)
            .map(|_| if ties { (rng.next() % 4) as f32 - 1.5 } else { rng.unit() * 6.0 })
            .collect();
        let mut w = vec![f32::NAN; tokens * experts];
        ef::moe_route(&logits, experts, k, &mut w).unwrap();
        for t in 0..tokens {
            let want = route_ref(&logits[t * experts..(t + 1) * experts], k);
            let got = &w[t * experts..(t + 1) * experts];
            for (e, (&g, &r)) in got.iter().zip(&want).enumerate() {
                prop_assert_eq!(g == 0.0, r == 0.0, "token {} expert {}: {} vs {}", t, e, g, r);
                prop_assert!((g as f64 - r).abs() <= 1e-6, "token {} expert {}: {} vs {}", t, e, g, r);
            }
            prop_assert!((got.iter().sum::<f32>() - 1.0).abs() <= 1e-6);
        }
    }

    /// The weighted sum over experts, accumulated expert by expert in expert order,
    /// is the CPU's `out += y * w` loop from 0 bit for bit; `out` gets the final sum.
    #[test]
    fn moe_accumulate_is_the_cpus_expert_order_sum(tokens in 1..5usize, hidden in 1..70usize,
                                                   experts in 1..6usize, seed in any::<u64>()) {
        let mut rng = Rng(seed | 1);
        let ys: Vec<Vec<f32>> = (0..experts).map(|_| rand(&mut rng, tokens * hidden, 2.0)).collect();
        // About half the weights 0 (the experts not picked).
        let weights: Vec<f32> = (0..tokens * experts)
            .map(|_| if rng.next().is_multiple_of(2) { 0.0 } else { rng.unit().abs() })
            .collect();
        let mut acc = vec![f32::NAN; tokens * hidden];
        let mut out = vec![f32::NAN; tokens * hidden];
        for (e, y) in ys.iter().enumerate() {
            let last = e + 1 == experts;
            let io = MoeAccIo { y, weights: &weights, acc: &mut acc, out: last.then_some(&mut out[..]) };
            ef::moe_accumulate(io, hidden, experts, e, e == 0).unwrap();
        }
        let mut want = vec![0.0f32; tokens * hidden];
        for (e, y) in ys.iter().enumerate() {
            for t in 0..tokens {
                let w = weights[t * experts + e];
                if w == 0.0 {
                    continue;
                }
                for i in 0..hidden {
                    want[t * hidden + i] += y[t * hidden + i] * w;
                }
            }
        }
        prop_assert_eq!(&acc, &want);
        prop_assert_eq!(&out, &want);
    }
}

fn is_invalid(r: Result<(), Error>, what: &str) {
    match r {
        Err(Error::Invalid { what: w, .. }) => assert_eq!(w, what),
        other => panic!("expected Invalid({what}), got {other:?}"),
    }
}

#[test]
fn bad_input_is_an_error() {
    let shape = QkShape {
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 4,
    };
    let mut qkv = vec![0.0f32; 16];
    is_invalid(
        ef::qk_norm(&mut qkv, &[1.0; 4], &[1.0; 3], shape, 1e-6),
        "k_weight",
    );
    is_invalid(
        ef::qk_norm(&mut qkv[..15], &[1.0; 4], &[1.0; 4], shape, 1e-6),
        "qkv",
    );
    is_invalid(
        ef::qk_norm(&mut qkv, &[1.0; 4], &[1.0; 4], shape, -1.0),
        "eps",
    );
    let mut x = vec![1.0f32; 4];
    is_invalid(ef::soft_cap(&mut x, 0.0), "cap");
    is_invalid(ef::soft_cap(&mut x, f32::INFINITY), "cap");
    let mut w = vec![0.0f32; 8];
    is_invalid(ef::moe_route(&[0.0; 8], 4, 5, &mut w), "top_k");
    is_invalid(ef::moe_route(&[0.0; 8], 4, 0, &mut w), "top_k");
    is_invalid(ef::moe_route(&[0.0; 7], 4, 2, &mut w), "logits");
    is_invalid(ef::moe_route(&[0.0; 8], 4, 2, &mut w[..4]), "weights");
    let mut acc = vec![0.0f32; 6];
    fn io(acc: &mut [f32]) -> MoeAccIo<'_, f32> {
        MoeAccIo {
            y: &[0.0; 6],
            weights: &[0.0; 4],
            acc,
            out: None,
        }
    }
    is_invalid(ef::moe_accumulate(io(&mut acc), 3, 2, 2, true), "expert");
    is_invalid(ef::moe_accumulate(io(&mut acc[..5]), 3, 2, 0, true), "acc");
    is_invalid(ef::moe_accumulate(io(&mut acc), 4, 2, 0, true), "y");
    // A routing with every weight exactly 0 for an expert leaves it out; then valid.
    ef::moe_accumulate(io(&mut acc), 3, 2, 1, true).unwrap();
    assert_eq!(acc, [0.0; 6]);
}
