//! Activations and row reductions: SwiGLU's `silu(gate) * up`, argmax, softmax and
//! log-softmax.

use crate::error::{check_len, KernelError};
use rayon::prelude::*;

/// `out = silu(gate) * up`, elementwise, where `silu(x) = x / (1 + e^-x)`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    check_len("up", up.len(), gate.len())?;
    check_len("out", out.len(), gate.len())?;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
    Ok(())
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
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
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
