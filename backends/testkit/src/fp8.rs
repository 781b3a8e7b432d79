//! An fp8 (E4M3) KV cache against the f32 cache it rounds: the looser of the two
//! fp8 tolerances. (The tight one is the conformance suite's: a backend reading an
//! fp8 cache is held to [`crate::Tolerance::F32`] against `naive` on the SAME
//! fp8-rounded values, since widening is exact.)
//!
//! Rounding to E4M3 (3 mantissa bits, scale 1.0) moves each K/V element by at most
//! `U·|x| + S`, `U = 2⁻⁴` (half an ulp relative) and `S = 2⁻¹⁰` (half the subnormal
//! step; no clamping at ±448 for the values used here). For one output row (query
//! token, head) over visible keys `j`, with `q` the query:
//!
//! * each score `s_j = scale·q·k_j` moves by at most
//!   `Δ_j = scale·Σ_i |q_i|·(U·|k_ji| + S)` (a logits soft-cap `c·tanh(s/c)` is
//!   1-Lipschitz, so no more after it); let `Δ = max_j Δ_j`;
//! * so every softmax weight changes by a factor within `e^{±2Δ}`:
//!   `Σ_j |p̃_j - p_j| ≤ e^{2Δ} - 1`;
//! * output element `e` is `Σ_j p_j v_je`; since the weights sum to 1 on both sides,
//!   `|õ_e - o_e| ≤ max_j (U·|v_je| + S) + (e^{2Δ} - 1)·(max_j v_je - min_j v_je) / 2`.
//!
//! [`f32_cache_bound`] evaluates that bound per output element (in f64), and
//! [`check_against_f32_cache`] holds a backend's fp8 output to it plus twice
//! [`crate::Tolerance::F32`] (the f32 arithmetic of the backend and of the
//! reference). The bound is data-dependent but a priori: it uses the f32 values and
//! the format's rounding error only, never the rounded values.

use crate::case::Case;
use crate::direct::{reference, run_layer};
use crate::error::{KitError, Tolerance};
use pagoda_core::{AttentionBackend, DType};

/// E4M3's unit roundoff: half an ulp relative to the value (3 mantissa bits).
pub const UNIT_ROUNDOFF: f64 = 1.0 / 16.0;
/// Half the subnormal step of E4M3 (2⁻⁹): the absolute rounding error near zero.
pub const SUBNORMAL_HALF_STEP: f64 = 1.0 / 1024.0;

fn elem_err(x: f32) -> f64 {
    UNIT_ROUNDOFF * (x as f64).abs() + SUBNORMAL_HALF_STEP
}

/// Per element of `case`'s layer-0 output (`[tokens, heads, head_dim]`), the bound
/// on `|out over the fp8-rounded cache - out over the f32 cache|` derived in the
/// module docs, from the case's f32 values (`case.cfg.kv_dtype` must be f32, so
/// `case.full` holds them unrounded). Walks the keys as `naive` does.
pub fn f32_cache_bound(case: &Case) -> Result<Vec<f64>, KitError> {
    let cfg = &case.cfg;
    if cfg.kv_dtype != DType::F32 {
        return Err(KitError::Protocol {
            check: "fp8 bound",
            message: format!(
                "the bound needs the f32 values, the case holds {}",
                cfg.kv_dtype
            ),
        });
    }
    let (h, kvh, d, bs) = (
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.block_size,
    );
    let group = h / kvh;
    let (kc, vc) = (&case.full.layers[0].k, &case.full.layers[0].v);
    let q = &case.q[0];
    let b = &case.batch;
    let mut bound = vec![0.0f64; case.out_elems()];
    for r in 0..b.num_reqs() {
        let blocks = b.blocks(r);
        let ctx = b.context_len(r);
        for i in 0..b.query_len(r) {
            let t = b.tokens(r).start + i;
            let pos = ctx + i;
            let lo = cfg
                .sliding_window
                .map_or(0, |w| (pos + 1).saturating_sub(w));
            for head in 0..h {
                let kv_head = head / group;
                let q0 = (t * h + head) * d;
                let off = |p: usize| {
                    let blk = blocks[p / bs] as usize;
                    ((blk * bs + p % bs) * kvh + kv_head) * d
                };
                let delta = (lo..=pos)
                    .map(|p| {
                        let k0 = off(p);
                        (0..d)
                            .map(|e| (q[q0 + e] as f64).abs() * elem_err(kc[k0 + e]))
                            .sum::<f64>()
                            * cfg.scale as f64
                    })
                    .fold(0.0, f64::max);
                let spread = (2.0 * delta).exp() - 1.0;
                for e in 0..d {
                    let (mut lo_v, mut hi_v, mut err) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
                    for p in lo..=pos {
                        let x = vc[off(p) + e];
                        lo_v = lo_v.min(x as f64);
                        hi_v = hi_v.max(x as f64);
                        err = err.max(elem_err(x));
                    }
                    bound[q0 + e] = err + spread * (hi_v - lo_v).max(0.0) / 2.0;
                }
            }
        }
    }
    Ok(bound)
}

/// Runs `be` (configured for an fp8 cache, like `case_f32.cfg` but with
/// `kv_dtype = F8E4M3`) on `case_f32` with its cache rounded to fp8, and `naive` on
/// the f32 cache; fails unless every output element is within
/// [`f32_cache_bound`] + twice [`Tolerance::F32`] of the reference. Returns the
/// largest error and the largest bound seen (for the caller's own sanity checks).
pub fn check_against_f32_cache(
    be: &mut dyn AttentionBackend,
    case_f32: &Case,
) -> Result<(f64, f64), KitError> {
    let bound = f32_cache_bound(case_f32)?;
    let (want, _) = reference(case_f32)?;
    let mut fp8 = case_f32.clone();
    fp8.cfg.kv_dtype = DType::F8E4M3;
    // `run_layer` uploads the pools in the config's dtype: rounded to fp8 here.
    let (got, _) = run_layer(be, &fp8, false, 1).map_err(|source| KitError::Backend {
        backend: be.name().to_string(),
        stage: "run",
        source,
    })?;
    let slack = Tolerance::F32;
    let (mut max_err, mut max_bound) = (0.0f64, 0.0f64);
    for (i, ((&g, &w), &bnd)) in got.iter().zip(&want).zip(&bound).enumerate() {
        let err = (g as f64 - w as f64).abs();
        let allowed = bnd + 2.0 * (slack.atol + slack.rtol * (w as f64).abs());
        if err.is_nan() || err > allowed {
            let (h, d) = (case_f32.cfg.num_heads, case_f32.cfg.head_dim);
            return Err(KitError::Protocol {
                check: "fp8 against the f32 cache",
                message: format!(
                    "out differs at token {}, head {}, dim {}: got {g}, f32 cache gives {w}, \
                     |err| {err:e} > bound {allowed:e}",
                    i / (h * d),
                    i / d % h,
                    i % d
                ),
            });
        }
        max_err = max_err.max(err);
        max_bound = max_bound.max(bnd);
    }
    Ok((max_err, max_bound))
}
