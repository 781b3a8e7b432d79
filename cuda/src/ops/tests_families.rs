//! The families' ops through [`ModelOps`] on `emu` (views, addresses, packed structs,
//! the driver) against slow f64 references of the CPU decoder's math, with stated f32
//! tolerances; and malformed views are errors.

use super::*;
use pagoda_core::{open_device, HostSlice, Shape, Storage};
use proptest::prelude::*;

fn rt() -> Arc<dyn DeviceRuntime> {
    open_device(Device::Emu).unwrap()
}

fn buf(rt: &Arc<dyn DeviceRuntime>, dims: &[usize], data: &[f32]) -> Storage {
    let mut s = rt
        .alloc_zeroed(DType::F32, Shape::new(dims).unwrap())
        .unwrap();
    rt.upload(s.view_mut(), HostSlice::F32(data)).unwrap();
    s
}

fn host(ops: &mut DeviceOps<EmuDriver>, s: &Storage) -> Vec<f32> {
    let mut v = vec![0.0; s.view().len()];
    ops.download_f32(s.view(), &mut v).unwrap();
    v
}

/// A deterministic generator (xorshift) of values in [-scale, scale).
fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Q/K norms: each q/k head `x / sqrt(mean(x²) + eps) * w` within 1e-5 relative of
    /// the f64 value (a few f32 roundings), v untouched; the soft cap within 2 ulp of
    /// `cap * tanh(x / cap)` in f64.
    #[test]
    fn qk_norm_and_soft_cap_match_f64(tokens in 1..4usize, nkv in 1..3usize, group in 1..3usize,
                                       d in 1..40usize, cap in 1.0f32..30.0, seed in any::<u64>()) {
        let rt = rt();
        let mut ops = emu_ops(rt.clone()).unwrap();
        let shape = RopeShape { num_heads: nkv * group, num_kv_heads: nkv, head_dim: d };
        let width = shape.qkv_dim();
        let x = values(seed, tokens * width, 3.0);
        let (qw, kw) = (values(seed ^ 1, d, 1.5), values(seed ^ 2, d, 1.5));
        let mut qkv = buf(&rt, &[tokens, width], &x);
        let (qwb, kwb) = (buf(&rt, &[d], &qw), buf(&rt, &[d], &kw));
        ops.qk_norm(qkv.view_mut(), qwb.view(), kwb.view(), 1e-6, shape).unwrap();
        let got = host(&mut ops, &qkv);
        for t in 0..tokens {
            for h in 0..width / d {
                let at = t * width + h * d;
                let row = &x[at..at + d];
                if h >= shape.num_heads + nkv {
                    prop_assert_eq!(&got[at..at + d], row);
                    continue;
                }
                let w = if h < shape.num_heads { &qw } else { &kw };
                let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
                let inv = 1.0 / (ms + 1e-6).sqrt();
                for i in 0..d {
                    let want = row[i] as f64 * inv * w[i] as f64;
                    prop_assert!((got[at + i] as f64 - want).abs() <= 1e-5 * want.abs() + 1e-30);
                }
            }
        }
        let logits = values(seed ^ 3, tokens * 50, 4.0 * cap);
        let mut l = buf(&rt, &[tokens, 50], &logits);
        ops.soft_cap(l.view_mut(), cap).unwrap();
        for (g, x) in host(&mut ops, &l).iter().zip(&logits) {
            let want = cap as f64 * (*x as f64 / cap as f64).tanh();
            prop_assert!((*g as f64 - want).abs() <= 2.0 * f32::EPSILON as f64 * want.abs() + 1e-30);
        }
    }

    /// Routing then the weighted expert sum: each token's `top_k` experts (the smaller
    /// index on ties) with softmax weights renormalised, within 1e-6 of f64; the sum
    /// over experts within 1e-5 of the f64 sum of `w · y` (relative to `Σ |w y|`).
    #[test]
    fn moe_route_and_accumulate_match_f64(tokens in 1..5usize, experts in 1..9usize,
                                          k_pick in 1..9usize, hidden in 1..40usize,
                                          seed in any::<u64>()) {
        let k = 1 + (k_pick - 1) % experts;
        let rt = rt();
        let mut ops = emu_ops(rt.clone()).unwrap();
        let logits = values(seed, tokens * experts, 4.0);
        let lb = buf(&rt, &[tokens, experts], &logits);
        let mut wb = buf(&rt, &[tokens, experts], &vec![f32::NAN; tokens * experts]);
        ops.moe_route(lb.view(), k, wb.view_mut()).unwrap();
        let w = host(&mut ops, &wb);
        for t in 0..tokens {
            let l = &logits[t * experts..(t + 1) * experts];
            let mx = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let total: f64 = l.iter().map(|&v| (v as f64 - mx).exp()).sum();
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap());
            let kept: f64 = order[..k].iter().map(|&e| (l[e] as f64 - mx).exp() / total).sum();
            for e in 0..experts {
                let want = if order[..k].contains(&e) { (l[e] as f64 - mx).exp() / total / kept } else { 0.0 };
                let got = w[t * experts + e] as f64;
                prop_assert_eq!(got == 0.0, want == 0.0);
                prop_assert!((got - want).abs() <= 1e-6, "token {} expert {}: {} vs {}", t, e, got, want);
            }
        }
        let ys: Vec<Vec<f32>> = (0..experts).map(|e| values(seed ^ (e as u64 + 7), tokens * hidden, 2.0)).collect();
        let mut acc = buf(&rt, &[tokens, hidden], &vec![f32::NAN; tokens * hidden]);
        let mut out = buf(&rt, &[tokens, hidden], &vec![f32::NAN; tokens * hidden]);
        for (e, y) in ys.iter().enumerate() {
            let yb = buf(&rt, &[tokens, hidden], y);
            let last = (e + 1 == experts).then(|| out.view_mut());
            ops.moe_accumulate(yb.view(), wb.view(), e, e == 0, acc.view_mut(), last).unwrap();
        }
        let got = host(&mut ops, &out);
        prop_assert_eq!(&got, &host(&mut ops, &acc));
        for t in 0..tokens {
            for i in 0..hidden {
                let terms = (0..experts).map(|e| w[t * experts + e] as f64 * ys[e][t * hidden + i] as f64);
                let (want, mag): (f64, f64) = terms.fold((0.0, 0.0), |(s, m), v| (s + v, m + v.abs()));
                prop_assert!((got[t * hidden + i] as f64 - want).abs() <= 1e-5 * mag + 1e-30);
            }
        }
    }
}

#[test]
fn malformed_family_op_views_are_errors() {
    let rt = rt();
    let mut ops = emu_ops(rt.clone()).unwrap();
    let shape = RopeShape {
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 4,
    };
    let mut qkv = buf(&rt, &[1, 15], &[0.0; 15]);
    let w = buf(&rt, &[4], &[1.0; 4]);
    let e = ops.qk_norm(qkv.view_mut(), w.view(), w.view(), 1e-6, shape);
    assert!(e.unwrap_err().to_string().contains("qk_norm"));
    let mut x = buf(&rt, &[4], &[0.0; 4]);
    assert!(ops.soft_cap(x.view_mut(), -1.0).is_err());
    let logits = buf(&rt, &[2, 4], &[0.0; 8]);
    let mut weights = buf(&rt, &[2, 4], &[0.0; 8]);
    for k in [0, 5] {
        let e = ops.moe_route(logits.view(), k, weights.view_mut());
        assert!(e.unwrap_err().to_string().contains("moe_route"));
    }
    let y = buf(&rt, &[2, 3], &[0.0; 6]);
    let mut acc = buf(&rt, &[2, 3], &[0.0; 6]);
    let e = ops.moe_accumulate(y.view(), weights.view(), 4, true, acc.view_mut(), None);
    assert!(e.unwrap_err().to_string().contains("moe_accumulate"));
}
