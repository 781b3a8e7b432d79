//! model.cu's kernels on the emulator: proptests over small random shapes and every dtype
//! combination against plain f64 references on the same (quantized) inputs.
//!
//! Tolerances (never widened to make a test pass):
//! * exact (bit for bit): `embed` (one f32 product, then one rounding, as the reference
//!   does), `gather_rows`, `argmax` (ids and values), `cast`, the residual of
//!   `add_rms_norm` (one f32 add) and the V rows of `rope_write_kv` (one f32 bias add);
//! * f32 math: relative `1e-5` of the value for the norms and SwiGLU (a handful of f32
//!   roundings plus a sum of <= 256 squares), `2e-6` of the magnitudes `|x1 cos| + |x2
//!   sin|` for RoPE (two rounded products and a difference, which can cancel), and for
//!   GeGLU an extra `2e-6 |gate up|` (`1 + tanh` cancels for negative gates: tanhf's error
//!   is absolute);
//! * plus, for a 16-bit output, its rounding: unit roundoff `U` (2^-8 bf16, 2^-11 f16)
//!   times the value, and 2^-25 absolute for f16's subnormals.
//!
//! The cross-checks against `pagoda_kernels` (the CPU kernels the model runs today) and
//! the error cases are in `emu_model_cpu.rs`.

use half::{bf16, f16};
use pagoda_cuda_kernels::emu_model::{self as em, RopeKvIo, RopeKvShape};
use pagoda_cuda_testkit::{Conv, Rng};
use proptest::prelude::*;

/// Calls `$f::<A, B>($args)` for the dtype pair `($a, $b)` (0 = f32, 1 = bf16, 2 = f16).
macro_rules! dtypes2 {
    ($a:expr, $b:expr, $f:ident ( $($arg:expr),* )) => {
        match ($a, $b) {
            (0, 0) => $f::<f32, f32>($($arg),*),
            (0, 1) => $f::<f32, bf16>($($arg),*),
            (0, 2) => $f::<f32, f16>($($arg),*),
            (1, 0) => $f::<bf16, f32>($($arg),*),
            (1, 1) => $f::<bf16, bf16>($($arg),*),
            (1, 2) => $f::<bf16, f16>($($arg),*),
            (2, 0) => $f::<f16, f32>($($arg),*),
            (2, 1) => $f::<f16, bf16>($($arg),*),
            _ => $f::<f16, f16>($($arg),*),
        }
    };
}
macro_rules! dtypes1 {
    ($a:expr, $f:ident ( $($arg:expr),* )) => {
        match $a {
            0 => $f::<f32>($($arg),*),
            1 => $f::<bf16>($($arg),*),
            _ => $f::<f16>($($arg),*),
        }
    };
}

/// Uniform in [-scale, scale], quantized to T.
fn rand_vec<T: Conv>(rng: &mut Rng, n: usize, scale: f32) -> Vec<T> {
    (0..n).map(|_| T::from_f32(rng.unit() * scale)).collect()
}

/// A value of T as f32 (exact).
fn f<T: Conv>(x: T) -> f32 {
    x.to_f64() as f32
}

/// Rounding of a 16-bit output: `U |want|`, plus f16's subnormal half-ulp.
fn out_round<O: Conv>(want: f64) -> f64 {
    O::U * want.abs() + if O::U == f16::U { 2f64.powi(-25) } else { 0.0 }
}

fn check_close(what: &str, i: usize, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol,
        "{what}[{i}]: got {got}, want {want}, |diff| {} > tol {tol}",
        (got - want).abs()
    );
}

// ---- embed ------------------------------------------------------------------------------

fn embed_case<W: Conv, O: Conv>(tokens: usize, hidden: usize, vocab: usize, scale: f32, seed: u64) {
    let mut rng = Rng(seed | 1);
    let table: Vec<W> = rand_vec(&mut rng, vocab * hidden, 3.0);
    let ids: Vec<i32> = (0..tokens)
        .map(|_| (rng.next() % vocab as u64) as i32)
        .collect();
    let mut out = vec![O::from_f32(9.0); tokens * hidden];
    em::embed(&ids, &table, hidden, scale, &mut out).unwrap();
    for t in 0..tokens {
        for i in 0..hidden {
            let w = table[ids[t] as usize * hidden + i];
            // f64 product of two f32s is exact; rounding it to f32 is the f32 product.
            let want = O::from_f32((f64::from(scale) * w.to_f64()) as f32).to_f64();
            assert_eq!(out[t * hidden + i].to_f64(), want, "embed[{t}, {i}]");
        }
    }
}

// ---- rms_norm / add_rms_norm --------------------------------------------------------------

fn norm_case<X: Conv, O: Conv>(rows: usize, dim: usize, w_offset: f32, add: bool, seed: u64) {
    let mut rng = Rng(seed | 1);
    let eps = 1e-5f32;
    let x: Vec<X> = rand_vec(&mut rng, rows * dim, 2.0);
    let weight: Vec<f32> = (0..dim).map(|_| rng.unit() * 1.5).collect();
    let mut residual: Vec<f32> = (0..rows * dim).map(|_| rng.unit() * 4.0).collect();
    let before = residual.clone();
    let mut out = vec![O::from_f32(9.0); rows * dim];
    // The rows the norm sees: x, or residual + x (one f32 add each).
    let v: Vec<f32> = if add {
        em::add_rms_norm(&mut residual, &x, &weight, eps, w_offset, &mut out).unwrap();
        let want: Vec<f32> = before.iter().zip(&x).map(|(&r, &x)| r + f(x)).collect();
        assert_eq!(residual, want, "add_rms_norm residual");
        want
    } else {
        em::rms_norm(&x, &weight, eps, w_offset, &mut out).unwrap();
        x.iter().map(|&x| f(x)).collect()
    };
    for r in 0..rows {
        let row = &v[r * dim..(r + 1) * dim];
        let ms = row.iter().map(|&a| f64::from(a).powi(2)).sum::<f64>() / dim as f64;
        let inv = 1.0 / (ms + f64::from(eps)).sqrt();
        for i in 0..dim {
            let want = f64::from(row[i]) * inv * (f64::from(weight[i]) + f64::from(w_offset));
            let tol = 1e-5 * want.abs() + out_round::<O>(want) * 1.0001;
            check_close("norm", r * dim + i, out[r * dim + i].to_f64(), want, tol);
        }
    }
}

// ---- rope_write_kv ---------------------------------------------------------------------------

/// Everything a rope case draws.
#[derive(Debug, Clone, Copy)]
struct RopeSpec {
    tokens: usize,
    kv_heads: usize,
    group: usize,
    head_dim: usize,
    block_size: usize,
    num_blocks: usize,
    bias: bool,
    seed: u64,
}

fn rope_case<T: Conv, KV: Conv>(s: RopeSpec) {
    let mut rng = Rng(s.seed | 1);
    let (nh, nkv, d) = (s.kv_heads * s.group, s.kv_heads, s.head_dim);
    let half = d / 2;
    let width = (nh + 2 * nkv) * d;
    let max_pos = 12;
    let qkv: Vec<T> = rand_vec(&mut rng, s.tokens * width, 2.0);
    let bias: Vec<f32> = (0..width).map(|_| rng.unit()).collect();
    // Any table works; angles as RopeCache makes them would too (emu_model_cpu.rs).
    let angles: Vec<f64> = (0..max_pos * half)
        .map(|_| f64::from(rng.unit()) * 7.0)
        .collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
    let positions: Vec<i32> = (0..s.tokens)
        .map(|_| (rng.next() % max_pos as u64) as i32)
        .collect();
    // Distinct slots (a permutation), a quarter of the rows padding (-1).
    let slots_total = s.num_blocks * s.block_size;
    let mut perm: Vec<i32> = (0..slots_total as i32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let slots: Vec<i32> = (0..s.tokens)
        .map(|t| {
            if rng.next().is_multiple_of(4) {
                -1
            } else {
                perm[t]
            }
        })
        .collect();
    let mut q_out = vec![T::from_f32(7.0); s.tokens * nh * d];
    let mut k_pool = vec![KV::from_f32(9.0); slots_total * nkv * d];
    let mut v_pool = k_pool.clone();
    let shape = RopeKvShape {
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: d,
        block_size: s.block_size,
    };
    let io = RopeKvIo {
        qkv: &qkv,
        bias: s.bias.then_some(&bias[..]),
        positions: &positions,
        cos: &cos,
        sin: &sin,
        slot_mapping: &slots,
        q_out: &mut q_out,
        k_pool: &mut k_pool,
        v_pool: &mut v_pool,
    };
    em::rope_write_kv(io, &shape).unwrap();

    let mut want_k = vec![9.0f64; k_pool.len()];
    let mut want_v = vec![9.0f64; v_pool.len()];
    let kv_row = nkv * d;
    for t in 0..s.tokens {
        // Inputs as the kernel sees them: T as f32, plus the bias in f32.
        let x = |c: usize| f(qkv[t * width + c]) + if s.bias { bias[c] } else { 0.0 };
        let p = positions[t] as usize;
        for h in 0..nh + nkv {
            for i in 0..half {
                let (a, b) = (h * d + i, h * d + i + half);
                let (x1, x2) = (f64::from(x(a)), f64::from(x(b)));
                let (c, sn) = (f64::from(cos[p * half + i]), f64::from(sin[p * half + i]));
                let y = [x1 * c - x2 * sn, x2 * c + x1 * sn];
                let mag = (x1 * c).abs() + (x2 * sn).abs() + (x2 * c).abs() + (x1 * sn).abs();
                for (j, &want) in y.iter().enumerate() {
                    let col = i + j * half;
                    if h < nh {
                        let tol = 2e-6 * mag + out_round::<T>(want) * 1.0001;
                        let got = q_out[(t * nh + h) * d + col].to_f64();
                        check_close("q", (t * nh + h) * d + col, got, want, tol);
                    } else if slots[t] >= 0 {
                        let at = slots[t] as usize * kv_row + (h - nh) * d + col;
                        let tol = 2e-6 * mag + out_round::<KV>(want) * 1.0001;
                        check_close("k", at, k_pool[at].to_f64(), want, tol);
                        want_k[at] = k_pool[at].to_f64(); // checked; the rest must stay 9
                    }
                }
            }
        }
        if slots[t] >= 0 {
            for c in 0..kv_row {
                let at = slots[t] as usize * kv_row + c;
                want_v[at] = KV::from_f32(x((nh + nkv) * d + c)).to_f64();
            }
        }
    }
    let got_k: Vec<f64> = k_pool.iter().map(|v| v.to_f64()).collect();
    let got_v: Vec<f64> = v_pool.iter().map(|v| v.to_f64()).collect();
    assert_eq!(got_k, want_k, "k pool outside the written slots changed");
    assert_eq!(got_v, want_v, "v pool (bit-exact)");
}

// ---- silu_mul / gelu_tanh_mul -------------------------------------------------------------

fn glu_case<T: Conv>(rows: usize, inter: usize, gelu: bool, seed: u64) {
    let mut rng = Rng(seed | 1);
    let gate_up: Vec<T> = rand_vec(&mut rng, rows * 2 * inter, 6.0);
    let mut out = vec![T::from_f32(9.0); rows * inter];
    if gelu {
        em::gelu_tanh_mul(&gate_up, inter, &mut out).unwrap();
    } else {
        em::silu_mul(&gate_up, inter, &mut out).unwrap();
    }
    for r in 0..rows {
        for i in 0..inter {
            let g = gate_up[r * 2 * inter + i].to_f64();
            let u = gate_up[r * 2 * inter + inter + i].to_f64();
            let (want, extra) = if gelu {
                let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
                (0.5 * g * (1.0 + inner.tanh()) * u, 2e-6 * (g * u).abs())
            } else {
                (g / (1.0 + (-g).exp()) * u, 0.0)
            };
            let tol = 1e-5 * want.abs() + extra + out_round::<T>(want) * 1.0001;
            check_close("glu", r * inter + i, out[r * inter + i].to_f64(), want, tol);
        }
    }
}

// ---- gather_rows, argmax, cast ----------------------------------------------------------------

fn gather_case<X: Conv>(src_rows: usize, dim: usize, n: usize, seed: u64) {
    let mut rng = Rng(seed | 1);
    let x: Vec<X> = rand_vec(&mut rng, src_rows * dim, 5.0);
    let rows: Vec<i32> = (0..n)
        .map(|_| (rng.next() % src_rows as u64) as i32)
        .collect();
    let mut out = vec![X::from_f32(9.0); n * dim];
    em::gather_rows(&x, dim, &rows, &mut out).unwrap();
    for (i, &r) in rows.iter().enumerate() {
        let want: Vec<f64> = x[r as usize * dim..][..dim]
            .iter()
            .map(|v| v.to_f64())
            .collect();
        let got: Vec<f64> = out[i * dim..][..dim].iter().map(|v| v.to_f64()).collect();
        assert_eq!(got, want, "gather row {i} (source {r})");
    }
}

/// `pagoda_kernels::argmax`'s contract, plainly: the first index of the largest non-NaN
/// value (`-inf` counts), `(0, -inf)` when there is none.
fn argmax_ref(row: &[f32]) -> (i32, f32) {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or((0, f32::NEG_INFINITY), |(i, v)| (i as i32, v))
}

fn argmax_case<X: Conv>(rows: usize, vocab: usize, nan_row: bool, seed: u64) {
    let mut rng = Rng(seed | 1);
    // Few distinct values: ties are common. NaN 1 in 5, -inf 1 in 8.
    let mut logits: Vec<X> = (0..rows * vocab)
        .map(|_| match rng.next() % 40 {
            0..=7 => X::from_f32(f32::NAN),
            8..=12 => X::from_f32(f32::NEG_INFINITY),
            k => X::from_f32((k % 5) as f32 - 2.0),
        })
        .collect();
    if nan_row && rows > 1 {
        logits[vocab..2 * vocab].fill(X::from_f32(f32::NAN));
    }
    let mut ids = vec![-7i32; rows];
    let mut values = vec![9.0f32; rows];
    em::argmax(&logits, vocab, &mut ids, &mut values).unwrap();
    for r in 0..rows {
        let row: Vec<f32> = logits[r * vocab..][..vocab].iter().map(|&v| f(v)).collect();
        let (id, v) = argmax_ref(&row);
        assert_eq!((ids[r], values[r]), (id, v), "argmax row {r}: {row:?}");
    }
}

fn cast_case<S: Conv, D: Conv>(n: usize, seed: u64) {
    let mut rng = Rng(seed | 1);
    let specials = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e5,
        -7e4,
        1e-7,
        -3e-8,
        0.0,
        -0.0,
    ];
    let src: Vec<S> = (0..n)
        .map(|i| {
            let v = if i % 5 == 0 {
                specials[(i / 5) % specials.len()]
            } else {
                rng.unit() * 100.0
            };
            S::from_f32(v)
        })
        .collect();
    let mut dst = vec![D::from_f32(9.0); n];
    em::cast(&src, &mut dst).unwrap();
    for i in 0..n {
        let want = D::from_f32(f(src[i])).to_f64();
        // Compare bits of the f64 (keeps -0.0 apart from 0.0).
        assert_eq!(
            dst[i].to_f64().to_bits(),
            want.to_bits(),
            "cast[{i}] of {}",
            f(src[i])
        );
    }
}

// ---- fixed cases ---------------------------------------------------------------------------

#[test]
fn fixed_shapes_every_dtype() {
    for a in 0..3 {
        for b in 0..3 {
            dtypes2!(a, b, embed_case(3, 40, 7, 1.0, 11));
            dtypes2!(a, b, norm_case(2, 64, 0.0, false, 12));
            dtypes2!(a, b, norm_case(2, 36, 1.0, true, 13));
            dtypes2!(a, b, cast_case(300, 14));
            let spec = RopeSpec {
                tokens: 3,
                kv_heads: 2,
                group: 2,
                head_dim: 16,
                block_size: 4,
                num_blocks: 3,
                bias: a == b,
                seed: 15,
            };
            dtypes2!(a, b, rope_case(spec));
        }
        dtypes1!(a, glu_case(2, 40, false, 16));
        dtypes1!(a, glu_case(2, 24, true, 17));
        dtypes1!(a, gather_case(5, 24, 3, 18));
        dtypes1!(a, argmax_case(4, 50, true, 19));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Any table row, any hidden (vector path when hidden * size is a multiple of 16
    /// bytes, scalar otherwise), Llama's scale 1 and Gemma's sqrt(hidden).
    #[test]
    fn embed_matches(a in 0..3u8, b in 0..3u8, tokens in 1..6usize, hidden in 1..200usize,
                     vocab in 1..20usize, gemma in any::<bool>(), seed in any::<u64>()) {
        let scale = if gemma { (hidden as f32).sqrt() } else { 1.0 };
        dtypes2!(a, b, embed_case(tokens, hidden, vocab, scale, seed));
    }

    #[test]
    fn rms_norm_matches(a in 0..3u8, b in 0..3u8, rows in 1..5usize, dim in 1..257usize,
                        gemma in any::<bool>(), seed in any::<u64>()) {
        dtypes2!(a, b, norm_case(rows, dim, if gemma { 1.0 } else { 0.0 }, false, seed));
    }

    #[test]
    fn add_rms_norm_matches(a in 0..3u8, b in 0..3u8, rows in 1..5usize, dim in 1..257usize,
                            gemma in any::<bool>(), seed in any::<u64>()) {
        dtypes2!(a, b, norm_case(rows, dim, if gemma { 1.0 } else { 0.0 }, true, seed));
    }

    /// GQA groups 1-4, even head dims 2-64, bias or not, padded (-1) rows, mixed dtypes.
    #[test]
    fn rope_write_kv_matches(a in 0..3u8, b in 0..3u8, tokens in 1..6usize,
                             kv_heads in 1..3usize, group in 1..5usize, half_d in 1..33usize,
                             block_size in 1..5usize, extra_blocks in 0..3usize,
                             bias in any::<bool>(), seed in any::<u64>()) {
        let spec = RopeSpec {
            tokens,
            kv_heads,
            group,
            head_dim: 2 * half_d,
            block_size,
            num_blocks: tokens.div_ceil(block_size) + extra_blocks,
            bias,
            seed,
        };
        dtypes2!(a, b, rope_case(spec));
    }

    #[test]
    fn silu_mul_matches(a in 0..3u8, rows in 1..5usize, inter in 1..200usize,
                        seed in any::<u64>()) {
        dtypes1!(a, glu_case(rows, inter, false, seed));
    }

    #[test]
    fn gelu_tanh_mul_matches(a in 0..3u8, rows in 1..5usize, inter in 1..200usize,
                             seed in any::<u64>()) {
        dtypes1!(a, glu_case(rows, inter, true, seed));
    }

    #[test]
    fn gather_rows_exact(a in 0..3u8, src_rows in 1..8usize, dim in 1..130usize,
                         n in 1..6usize, seed in any::<u64>()) {
        dtypes1!(a, gather_case(src_rows, dim, n, seed));
    }

    /// Ties, NaNs, -inf, an all-NaN row; vocab 0 included.
    #[test]
    fn argmax_exact(a in 0..3u8, rows in 1..5usize, vocab in 0..300usize,
                    nan_row in any::<bool>(), seed in any::<u64>()) {
        dtypes1!(a, argmax_case(rows, vocab, nan_row, seed));
    }

    #[test]
    fn cast_exact(a in 0..3u8, b in 0..3u8, n in 1..700usize, seed in any::<u64>()) {
        dtypes2!(a, b, cast_case(n, seed));
    }
}
