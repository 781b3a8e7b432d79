//! The sparse MoE MLP of Mixtral-style models: a router scores every expert per
//! token, the `top_k` best are kept and their softmax weights renormalised to sum
//! to one, and each expert runs once per step on the rows routed to it (gathered
//! into one GEMM per expert, not one GEMV per token), its output added back into
//! those rows scaled by their weights.
//!
//! Experts are summed in expert order, as transformers' Mixtral block does
//! (`index_add_` per expert), so f32 results stay close to the reference's.

use crate::arch::Activation;
use crate::decoder::{Moe, Weights};
use crate::error::kernel;
use crate::error::ModelError;
use crate::linear::Linear;
use pagoda_kernels::{gelu_tanh_mul_fused, silu_mul_fused};

/// Reusable buffers of [`forward`].
#[derive(Debug, Default)]
pub(crate) struct MoeScratch {
    router_logits: Vec<f32>,
    /// Per token: its `top_k` (expert, weight) pairs.
    routes: Vec<(usize, f32)>,
    rows: Vec<usize>,
    weights: Vec<f32>,
    x: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    y: Vec<f32>,
}

/// The top `k` of `logits` after a softmax, renormalised: `(expert, weight)` by
/// descending logit (the first index on ties, as `torch.topk` on CPU). Appends to
/// `out` without allocating.
pub(crate) fn route(logits: &[f32], k: usize, out: &mut Vec<(usize, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let total: f32 = logits.iter().map(|&x| (x - max).exp()).sum();
    let start = out.len();
    for _ in 0..k {
        let mut best: Option<usize> = None;
        for e in 0..logits.len() {
            if out[start..].iter().any(|&(x, _)| x == e) {
                continue;
            }
            if best.is_none_or(|b| logits[e] > logits[b]) {
                best = Some(e);
            }
        }
        if let Some(e) = best {
            out.push((e, (logits[e] - max).exp() / total));
        }
    }
    // Renormalise the kept weights (Mixtral's `norm_topk_prob`).
    let kept: f32 = out[start..].iter().map(|&(_, w)| w).sum();
    for r in &mut out[start..] {
        r.1 /= kept;
    }
}

/// `out[m, hidden]` = the MoE MLP `moe` (its matrices host [`Linear`]s) of `x[m, hidden]`.
pub(crate) fn forward<W: Weights<Mat = Linear>>(
    moe: &Moe<W>,
    (x, m): (&[f32], usize),
    (hidden, inter, activation): (usize, usize, Activation),
    out: &mut [f32],
    s: &mut MoeScratch,
) -> Result<(), ModelError> {
    let n_exp = moe.experts.len();
    s.router_logits.resize(m * n_exp, 0.0);
    moe.router
        .matmul(x, &mut s.router_logits, m, hidden, n_exp)
        .map_err(kernel)?;
    s.routes.clear();
    for t in 0..m {
        route(
            &s.router_logits[t * n_exp..(t + 1) * n_exp],
            moe.top_k,
            &mut s.routes,
        );
    }
    out[..m * hidden].fill(0.0);
    for (e, expert) in moe.experts.iter().enumerate() {
        s.rows.clear();
        s.weights.clear();
        for t in 0..m {
            let r = &s.routes[t * moe.top_k..(t + 1) * moe.top_k];
            if let Some(&(_, w)) = r.iter().find(|&&(x, _)| x == e) {
                s.rows.push(t);
                s.weights.push(w);
            }
        }
        let n = s.rows.len();
        if n == 0 {
            continue;
        }
        s.x.resize(n * hidden, 0.0);
        for (i, &t) in s.rows.iter().enumerate() {
            s.x[i * hidden..(i + 1) * hidden].copy_from_slice(&x[t * hidden..(t + 1) * hidden]);
        }
        s.gate_up.resize(n * 2 * inter, 0.0);
        s.act.resize(n * inter, 0.0);
        s.y.resize(n * hidden, 0.0);
        expert
            .w_gate_up
            .matmul(&s.x, &mut s.gate_up, n, hidden, 2 * inter)
            .map_err(kernel)?;
        match activation {
            Activation::Silu => silu_mul_fused(&s.gate_up, inter, &mut s.act),
            Activation::GeluTanh => gelu_tanh_mul_fused(&s.gate_up, inter, &mut s.act),
        }
        .map_err(kernel)?;
        expert
            .w_down
            .matmul(&s.act, &mut s.y, n, inter, hidden)
            .map_err(kernel)?;
        for (i, (&t, &w)) in s.rows.iter().zip(&s.weights).enumerate() {
            let dst = &mut out[t * hidden..(t + 1) * hidden];
            for (o, &y) in dst.iter_mut().zip(&s.y[i * hidden..(i + 1) * hidden]) {
                *o += y * w;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn route_keeps_the_top_k_renormalised() {
        let mut r = Vec::new();
        route(&[0.0, 2.0, 1.0, 2.0], 2, &mut r);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!((r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6);
        r.clear();
        route(&[0.0, (3.0f32).ln()], 1, &mut r);
        assert_eq!(r, vec![(1, 1.0)]);
    }
}
