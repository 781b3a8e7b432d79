//! Activations and row reductions: SwiGLU's `silu(gate) * up`, argmax, softmax and
//! log-softmax.

use crate::error::{check_len, KernelError};
use rayon::prelude::*;

/// `out = silu(gate) * up`, elementwise, where `silu(x) = x / (1 + e^-x)`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    check_len("up", up.len(), gate.len())?;
    check_len("out", out.len(), gate.len())?;
    silu_mul_row(gate, up, out);
    Ok(())
}

/// `o = silu(g) * u` over equal-length slices, 16 lanes wide on AVX-512 CPUs.
fn silu_mul_row(g: &[f32], u: &[f32], o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::detect().avx512() {
        // SAFETY: AVX-512 F detected.
        unsafe { silu_mul_row_avx512(g, u, o) };
        return;
    }
    silu_mul_row_generic(g, u, o);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn silu_mul_row_avx512(g: &[f32], u: &[f32], o: &mut [f32]) {
    // The same code, compiled with AVX-512 enabled so the loop vectorises 16 wide.
    silu_mul_row_generic(g, u, o)
}

#[inline(always)]
fn silu_mul_row_generic(g: &[f32], u: &[f32], o: &mut [f32]) {
    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + exp_fast(-g)) * u;
    }
}

/// `e^x` in plain arithmetic the compiler vectorises (libm's `expf` is a call per
/// element; it was 1-2 % of a serving profile in the SiLU alone). Cephes' method:
/// `x = n ln2 + r` with `|r| <= ln2 / 2` (ln2 split in two for an exact `n ln2`),
/// a degree-5 polynomial for `e^r`, and `2^n` built in the exponent bits. Within
/// 2 ulp of `expf` on `[-87, 88]`; inputs are clamped there (beyond it `e^x` is
/// below the normal range or overflows, and SiLU's result is then `0` or `x`).
///
/// The one vectorised exp of the tree: the CPU attention backends' online softmax
/// (`paged`, `flash`) uses it too, on arguments `<= 0` (a `-inf` maximum difference
/// gives about `1e-38`, never NaN).
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    // max/min rather than clamp: clamp keeps a NaN, max/min map it into range
    // (SiLU's result is NaN either way, through `g`); both vectorise.
    #[allow(clippy::manual_clamp)]
    let x = x.max(-87.0).min(88.0);
    // t holds round(x log2 e) in its low mantissa bits: n as a float and as an
    // integer without a float-to-int conversion (whose saturating semantics keep
    // the loop from vectorising).
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let ni = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits((ni + 127).wrapping_shl(23) as u32)
}

/// [`silu_mul`] on a fused `[rows, 2 * inter]` buffer whose rows are `[gate | up]`
/// (one GEMM against `[w_gate; w_up]`), writing `out` `[rows, inter]`. Rows run in
/// parallel when there are many (prefill).
pub fn silu_mul_fused(gate_up: &[f32], inter: usize, out: &mut [f32]) -> Result<(), KernelError> {
    if inter == 0 {
        return Err(KernelError::InvalidArgument {
            name: "inter",
            message: "must be > 0".into(),
        });
    }
    let rows = out.len() / inter;
    check_len("out", out.len(), rows * inter)?;
    check_len("gate_up", gate_up.len(), rows * 2 * inter)?;
    let body = |(o, gu): (&mut [f32], &[f32])| {
        let (g, u) = gu.split_at(inter);
        silu_mul_row(g, u, o);
    };
    if out.len() >= 1 << 15 {
        out.par_chunks_mut(inter)
            .zip(gate_up.par_chunks(2 * inter))
            .for_each(body);
    } else {
        out.chunks_mut(inter)
            .zip(gate_up.chunks(2 * inter))
            .for_each(body);
    }
    Ok(())
}

/// GeGLU on a fused `[rows, 2 * inter]` buffer whose rows are `[gate | up]`:
/// `out = gelu_tanh(gate) * up`, with PyTorch's tanh approximation of GELU
/// (`0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))`, Gemma's `gelu_pytorch_tanh`).
/// Scalar: the models that use it are small next to the GEMMs around it.
pub fn gelu_tanh_mul_fused(
    gate_up: &[f32],
    inter: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    if inter == 0 {
        return Err(KernelError::InvalidArgument {
            name: "inter",
            message: "must be > 0".into(),
        });
    }
    let rows = out.len() / inter;
    check_len("out", out.len(), rows * inter)?;
    check_len("gate_up", gate_up.len(), rows * 2 * inter)?;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (o, gu) in out.chunks_mut(inter).zip(gate_up.chunks(2 * inter)) {
        let (g, u) = gu.split_at(inter);
        for ((o, &x), &u) in o.iter_mut().zip(g).zip(u) {
            let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
            *o = 0.5 * x * (1.0 + inner.tanh()) * u;
        }
    }
    Ok(())
}

/// Slow reference of [`gelu_tanh_mul_fused`] in f64, on separate gate and up rows.
pub fn gelu_tanh_mul_ref(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    check_len("up", up.len(), gate.len())?;
    check_len("out", out.len(), gate.len())?;
    for i in 0..gate.len() {
        let x = gate[i] as f64;
        let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
        out[i] = (0.5 * x * (1.0 + inner.tanh()) * up[i] as f64) as f32;
    }
    Ok(())
}

/// Slow reference of [`silu_mul`] in f64.
pub fn silu_mul_ref(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    check_len("up", up.len(), gate.len())?;
    check_len("out", out.len(), gate.len())?;
    for i in 0..gate.len() {
        let g = gate[i] as f64;
        out[i] = (g / (1.0 + (-g).exp()) * up[i] as f64) as f32;
    }
    Ok(())
}

/// Index of the largest element (the first one on ties; NaNs are never chosen).
/// `None` for an empty row or one of only NaNs.
pub fn argmax(row: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if v <= b => {}
            _ => best = Some((i, v)),
        }
    }
    best.map(|(i, _)| i)
}

/// Lanes of the vectorised row scans below.
const LANES: usize = 16;

/// The largest value of a NaN-free row and the first index holding it; `(0, -inf)`
/// for an empty row or one of only `-inf` (the greedy sampler's contract). 16
/// lanes keep their own best value and index, merged at the end, so the loop
/// vectorises (the plain loop was ~1 % of a 32-stream serving profile).
pub fn max_index(row: &[f32]) -> (usize, f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::detect().avx512() {
        // SAFETY: AVX-512 F detected.
        return unsafe { max_index_avx512(row) };
    }
    max_index_generic(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn max_index_avx512(row: &[f32]) -> (usize, f32) {
    max_index_generic(row)
}

#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn max_index_generic(row: &[f32]) -> (usize, f32) {
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut idx = [0usize; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail_start = row.len() - chunks.remainder().len();
    for (c, ch) in chunks.enumerate() {
        for l in 0..LANES {
            let better = ch[l] > best[l];
            best[l] = if better { ch[l] } else { best[l] };
            idx[l] = if better { c * LANES + l } else { idx[l] };
        }
    }
    // Lanes hold disjoint index sets, each lane's first maximum: the overall first
    // maximum is the smallest index among the lanes that reach the maximum.
    let mut out = (0usize, f32::NEG_INFINITY);
    for l in 0..LANES {
        if best[l] > out.1 || (best[l] == out.1 && best[l] > f32::NEG_INFINITY && idx[l] < out.0) {
            out = (idx[l], best[l]);
        }
    }
    for (i, &v) in row.iter().enumerate().skip(tail_start) {
        if v > out.1 {
            out = (i, v);
        }
    }
    out
}

/// The first index holding NaN or `+inf`, if any (`-inf` is a valid masked logit).
// `!(v < inf)` is the point: true for NaN and +inf alike.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub fn first_nan_or_inf(row: &[f32]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::detect().avx512() {
        // SAFETY: AVX-512 F detected.
        return unsafe { first_nan_or_inf_avx512(row) };
    }
    first_nan_or_inf_generic(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn first_nan_or_inf_avx512(row: &[f32]) -> Option<usize> {
    first_nan_or_inf_generic(row)
}

#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)]
fn first_nan_or_inf_generic(row: &[f32]) -> Option<usize> {
    // Branch-free per chunk so the common all-finite case vectorises.
    const CHUNK: usize = 256;
    for (c, ch) in row.chunks(CHUNK).enumerate() {
        // NaN: magnitude bits above +inf's; +inf: exactly its bits (-inf passes).
        let bad = ch.iter().fold(0u32, |b, &v| {
            let bits = v.to_bits();
            b | (((bits & 0x7fff_ffff) > 0x7f80_0000) | (bits == 0x7f80_0000)) as u32
        });
        if bad != 0 {
            return ch
                .iter()
                .position(|&v| !(v < f32::INFINITY))
                .map(|i| c * CHUNK + i);
        }
    }
    None
}

fn row_max(row: &[f32]) -> f32 {
    row.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// In-place softmax of one row. An empty row is left alone.
pub fn softmax(row: &mut [f32]) {
    if row.is_empty() {
        return;
    }
    let m = row_max(row);
    if m == f32::NEG_INFINITY {
        // Every entry is -inf: no preference, uniform.
        let u = 1.0 / row.len() as f32;
        row.fill(u);
        return;
    }
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// In-place log-softmax of one row (`x - logsumexp(x)`).
pub fn log_softmax(row: &mut [f32]) {
    if row.is_empty() {
        return;
    }
    let m = row_max(row);
    if m == f32::NEG_INFINITY {
        let l = -(row.len() as f32).ln();
        row.fill(l);
        return;
    }
    // f64 sum: vocab-sized rows add ~50k terms.
    let sum: f64 = row.iter().map(|&v| ((v - m) as f64).exp()).sum();
    let lse = m + sum.ln() as f32;
    row.iter_mut().for_each(|v| *v -= lse);
}

/// Slow reference of [`log_softmax`] (and, exponentiated, of [`softmax`]) in f64.
pub fn log_softmax_ref(row: &[f32]) -> Vec<f64> {
    let m = row
        .iter()
        .map(|&v| v as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    row.iter().map(|&v| v as f64 - lse).collect()
}
