//! RMS normalisation over rows, plain and fused with the residual add.

use crate::error::{check_len, KernelError};
use rayon::prelude::*;

/// Rows × dim above which rows are normalised in parallel.
const PARALLEL_MIN_ELEMS: usize = 1 << 15;

fn check(x_len: usize, weight: &[f32], out_len: usize) -> Result<usize, KernelError> {
    let dim = weight.len();
    if dim == 0 {
        return Err(KernelError::InvalidArgument {
            name: "weight",
            message: "empty norm weight".into(),
        });
    }
    if !x_len.is_multiple_of(dim) {
        return Err(KernelError::ShapeMismatch {
            name: "x",
            expected: x_len / dim * dim,
            actual: x_len,
        });
    }
    check_len("out", out_len, x_len)?;
    Ok(dim)
}

#[inline(always)]
fn sum_squares(x: &[f32]) -> f32 {
    // Eight independent partial sums so the loop vectorises.
    let mut acc = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            acc[l] += c[l] * c[l];
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn norm_row(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let inv = 1.0 / (sum_squares(x) / x.len() as f32 + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv * g;
    }
}

/// `out[r] = x[r] / sqrt(mean(x[r]²) + eps) * weight` for each row of `x` (`[rows, weight.len()]`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<(), KernelError> {
    let dim = check(x.len(), weight, out.len())?;
    if x.len() >= PARALLEL_MIN_ELEMS {
        out.par_chunks_mut(dim)
            .zip(x.par_chunks(dim))
            .for_each(|(o, r)| norm_row(r, weight, eps, o));
    } else {
        out.chunks_mut(dim)
            .zip(x.chunks(dim))
            .for_each(|(o, r)| norm_row(r, weight, eps, o));
    }
    Ok(())
}

/// Fused residual add and norm: `residual += x`, then `out = rms_norm(residual)`.
pub fn add_rms_norm(
    residual: &mut [f32],
    x: &[f32],
    weight: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let dim = check(residual.len(), weight, out.len())?;
    check_len("x", x.len(), residual.len())?;
    let body = |(o, (r, d)): (&mut [f32], (&mut [f32], &[f32]))| {
        for (a, b) in r.iter_mut().zip(d) {
            *a += b;
        }
        norm_row(r, weight, eps, o);
    };
    if x.len() >= PARALLEL_MIN_ELEMS {
        out.par_chunks_mut(dim)
            .zip(residual.par_chunks_mut(dim).zip(x.par_chunks(dim)))
            .for_each(body);
    } else {
        out.chunks_mut(dim)
            .zip(residual.chunks_mut(dim).zip(x.chunks(dim)))
            .for_each(body);
    }
    Ok(())
}

/// Slow reference of [`rms_norm`] with f64 arithmetic.
pub fn rms_norm_ref(
    x: &[f32],
    weight: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let dim = check(x.len(), weight, out.len())?;
    for r in 0..x.len() / dim {
        let row = &x[r * dim..(r + 1) * dim];
        let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for c in 0..dim {
            out[r * dim + c] = (row[c] as f64 * inv * weight[c] as f64) as f32;
        }
    }
    Ok(())
}
