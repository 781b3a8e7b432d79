//! [`gemm_host`]: the GEMM on host memory (the `emu` device, tests), and its f64
//! reference [`gemm_host_ref`].
//!
//! Every output element is one dot product in a fixed order, whatever m, n, k and the
//! element's place in the tiles: 8 lane partial sums over `k / 8 · 8` elements (lane `l`
//! adds `x[8c + l]·w[8c + l]` for c = 0, 1, ... in order), summed pairwise
//! `((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))`, then the `k % 8` tail added in order. So a
//! row's result never depends on the other rows (batch invariance, which the engine's
//! "batched = solo" tests rely on) and the error bound is that of a depth `k/8 + 10` sum.
//! Rust never contracts `a * b + c` into an FMA, so the order is the arithmetic.
//!
//! Speed: w is widened to f32 one block of [`NB`] rows at a time (one rayon task per
//! block), x once per call; a 4-row kernel reads each x chunk once for 4 weight rows.

use super::types::{check_dtypes, check_lens, GemmError};
use half::{bf16, f16};
use pagoda_cuda_kernels::Element;
use rayon::prelude::*;
use std::any::Any;

/// Partial sums per dot product.
const LANES: usize = 8;
/// Weight rows per rayon task (widened to f32 together: 32 rows of k = 4096 is 512 KiB).
const NB: usize = 32;
/// Rows of x per pass: the temporary tiles of a pass hold `MB · n` floats.
const MB: usize = 64;

/// `v` as f32 (exact for all three element types).
fn widen<T: Element>(v: T) -> f32 {
    // The type tests are constants after monomorphization: no run-time cost.
    let a: &dyn Any = &v;
    if let Some(&f) = a.downcast_ref::<f32>() {
        f
    } else if let Some(b) = a.downcast_ref::<bf16>() {
        b.to_f32()
    } else if let Some(h) = a.downcast_ref::<f16>() {
        h.to_f32()
    } else {
        unreachable!("Element is sealed to f32, bf16 and f16")
    }
}

/// `v` rounded to `T` (round to nearest even).
fn narrow<T: Element>(v: f32) -> T {
    let mut out = T::default();
    let o: &mut dyn Any = &mut out;
    if let Some(f) = o.downcast_mut::<f32>() {
        *f = v;
    } else if let Some(b) = o.downcast_mut::<bf16>() {
        *b = bf16::from_f32(v);
    } else if let Some(h) = o.downcast_mut::<f16>() {
        *h = f16::from_f32(v);
    } else {
        unreachable!("Element is sealed to f32, bf16 and f16")
    }
    out
}

/// The lanes' sum, in the fixed pairwise order.
#[inline(always)]
fn lanes_sum(a: &[f32; LANES]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// `R` dot products of `x` with the rows `w[r]` (each exactly `x.len()` long), each in
/// the module's fixed order (the same arithmetic for every `R`).
#[inline(always)]
fn dots<const R: usize>(x: &[f32], w: [&[f32]; R]) -> [f32; R] {
    let k = x.len();
    let body = k - k % LANES;
    let mut acc = [[0.0f32; LANES]; R];
    for (c, xc) in x[..body].chunks_exact(LANES).enumerate() {
        let xc: &[f32; LANES] = xc.try_into().expect("chunks_exact");
        for (a, wr) in acc.iter_mut().zip(&w) {
            let wc: &[f32; LANES] = wr[c * LANES..][..LANES].try_into().expect("in bounds");
            for l in 0..LANES {
                a[l] += xc[l] * wc[l];
            }
        }
    }
    let mut s = [0.0f32; R];
    for r in 0..R {
        s[r] = lanes_sum(&acc[r]);
        for t in body..k {
            s[r] += x[t] * w[r][t];
        }
    }
    s
}

/// `out[rows, nb]` for weight rows `j0..j0 + nb` (block `b`) and the f32 rows `xs`.
fn tile<W: Element>(xs: &[f32], w: &[W], rows: usize, n: usize, k: usize, b: usize) -> Vec<f32> {
    let j0 = b * NB;
    let nb = NB.min(n - j0);
    let wt: Vec<f32> = w[j0 * k..(j0 + nb) * k].iter().map(|&v| widen(v)).collect();
    let wrow = |j: usize| &wt[j * k..(j + 1) * k];
    let mut t = vec![0.0f32; rows * nb];
    for (i, trow) in t.chunks_exact_mut(nb).enumerate() {
        let xr = &xs[i * k..(i + 1) * k];
        let mut j = 0;
        while j + 4 <= nb {
            let r = dots::<4>(xr, [wrow(j), wrow(j + 1), wrow(j + 2), wrow(j + 3)]);
            trow[j..j + 4].copy_from_slice(&r);
            j += 4;
        }
        for (jj, o) in trow.iter_mut().enumerate().skip(j) {
            *o = dots::<1>(xr, [wrow(jj)])[0];
        }
    }
    t
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` on host memory, summed in f32 (the module's order),
/// rounded once to `O`. x and w must share a dtype and out be x's or f32
/// ([`super::check_dtypes`]); the slices must hold exactly `m·k`, `n·k`, `m·n` elements.
/// `k = 0` writes zeros. Batch-invariant: row i of out depends on row i of x and on w only.
pub fn gemm_host<X: Element, W: Element, O: Element>(
    x: &[X],
    w: &[W],
    out: &mut [O],
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), GemmError> {
    check_dtypes(X::DTYPE, W::DTYPE, O::DTYPE)?;
    check_lens([x.len(), w.len(), out.len()], m, n, k)?;
    if out.is_empty() {
        return Ok(());
    }
    let xf: Vec<f32> = x.iter().map(|&v| widen(v)).collect();
    let blocks = n.div_ceil(NB);
    for (pass, out_rows) in out.chunks_mut(MB * n).enumerate() {
        let rows = out_rows.len() / n;
        let xs = &xf[pass * MB * k..][..rows * k];
        let tiles: Vec<Vec<f32>> = (0..blocks)
            .into_par_iter()
            .map(|b| tile(xs, w, rows, n, k, b))
            .collect();
        for (b, t) in tiles.iter().enumerate() {
            let nb = t.len() / rows;
            for (orow, trow) in out_rows.chunks_exact_mut(n).zip(t.chunks_exact(nb)) {
                for (o, &v) in orow[b * NB..b * NB + nb].iter_mut().zip(trow) {
                    *o = narrow(v);
                }
            }
        }
    }
    Ok(())
}

/// The slow, obviously correct reference: `x · wᵀ` in f64 (products of the widened
/// values are exact in f64), row-major `[m, n]`. Any element types; lengths as
/// [`gemm_host`]'s.
pub fn gemm_host_ref<X: Element, W: Element>(
    x: &[X],
    w: &[W],
    m: usize,
    n: usize,
    k: usize,
) -> Result<Vec<f64>, GemmError> {
    let mn = m.saturating_mul(n); // an overflow is refused by check_lens
    check_lens([x.len(), w.len(), mn], m, n, k)?;
    let mut out = vec![0.0f64; mn];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            for t in 0..k {
                s += f64::from(widen(x[i * k + t])) * f64::from(widen(w[j * k + t]));
            }
            out[i * n + j] = s;
        }
    }
    Ok(out)
}
