//! The families' extra kernels of `cu/model.cu` on the `emu` device, on host slices:
//! Qwen3's per-head Q/K norms ([`qk_norm`]), Gemma 2's final-logit soft cap
//! ([`soft_cap`]), and Mixtral's MoE routing ([`moe_route`]) and weighted expert sum
//! ([`moe_accumulate`]).
//!
//! As [`crate::emu_model`], every function checks all lengths and scalars before
//! launching (the kernels trust their inputs as on the GPU): bad input is
//! [`Error::Invalid`], never a panic. Semantics are the CPU decoder's
//! (`models/src/llama.rs`, `models/src/moe.rs`), f32 math.

use crate::emu::{checked_mul, expect_len, to_i32};
use crate::emu_model::{finite, positive, status};
use crate::params::{MoeAccParams, MoeRouteParams, QkNormParams, SoftCapParams, MOE_MAX_TOP_K};
use crate::{ffi, graph, invalid, Element, Error};
use std::ptr;

/// Heads of the fused QKV rows [`qk_norm`] normalises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkShape {
    /// Query heads.
    pub num_heads: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Head dim (the norm's row).
    pub head_dim: usize,
}

/// Per-head RMSNorm in place of the q heads (by `q_weight`) and k heads (by `k_weight`)
/// of `qkv` `[tokens, (num_heads + 2 num_kv_heads) head_dim]`; v untouched. Each head is
/// `rms_norm`'s row: `x / sqrt(mean(x²) + eps) * w`.
pub fn qk_norm<T: Element>(
    qkv: &mut [T],
    q_weight: &[f32],
    k_weight: &[f32],
    shape: QkShape,
    eps: f32,
) -> Result<(), Error> {
    let d = positive("head_dim", shape.head_dim)?;
    positive("num_heads", shape.num_heads)?;
    positive("num_kv_heads", shape.num_kv_heads)?;
    expect_len("q_weight", q_weight.len(), shape.head_dim)?;
    expect_len("k_weight", k_weight.len(), shape.head_dim)?;
    finite("eps", eps)?;
    if eps < 0.0 {
        return Err(invalid("eps", format!("{eps} is negative")));
    }
    let heads = checked_mul("heads", shape.num_kv_heads, 2)?
        .checked_add(shape.num_heads)
        .ok_or_else(|| invalid("heads", "count overflows"))?;
    let width = checked_mul("qkv row", heads, shape.head_dim)?;
    to_i32("qkv row", width)?;
    if !qkv.len().is_multiple_of(width) {
        return Err(invalid(
            "qkv",
            format!(
                "{} elements is not a whole number of rows of {width}",
                qkv.len()
            ),
        ));
    }
    let tokens = qkv.len() / width;
    if tokens == 0 {
        return Ok(());
    }
    let p = QkNormParams {
        qkv: qkv.as_mut_ptr().cast(),
        q_weight: q_weight.as_ptr(),
        k_weight: k_weight.as_ptr(),
        num_tokens: to_i32("tokens", tokens)?,
        num_heads: to_i32("num_heads", shape.num_heads)?,
        num_kv_heads: to_i32("num_kv_heads", shape.num_kv_heads)?,
        head_dim: d,
        eps,
        pad: 0,
    };
    let t = T::DTYPE as i32;
    // SAFETY: qkv holds `tokens` rows of `width`, each weight `head_dim` values.
    let rc = graph::launch("qk_norm", move || unsafe { ffi::pg_emu_qk_norm(&p, t) });
    status("qk_norm", rc, T::DTYPE)
}

/// `x = cap * tanh(x / cap)` in place; `cap` positive and finite.
pub fn soft_cap(x: &mut [f32], cap: f32) -> Result<(), Error> {
    if !(cap.is_finite() && cap > 0.0) {
        return Err(invalid("cap", format!("{cap} must be positive and finite")));
    }
    if x.is_empty() {
        return Ok(());
    }
    let p = SoftCapParams {
        x: x.as_mut_ptr(),
        n: i64::try_from(x.len()).map_err(|_| invalid("x", "length does not fit in i64"))?,
        cap,
        pad: 0,
    };
    // SAFETY: x holds n f32s.
    let rc = graph::launch("soft_cap", move || unsafe {
        ffi::pg_emu_soft_cap(&p, crate::Dtype::F32 as i32)
    });
    status("soft_cap", rc, crate::Dtype::F32)
}

/// Mixtral's routing of each row of `logits` (`[tokens, num_experts]`): softmax, the
/// `top_k` largest (the smaller index on ties), renormalised to sum to 1, into the dense
/// `weights` (same shape; 0 for the experts not picked). `top_k` in `1..=min(num_experts,
/// 32)`.
pub fn moe_route(
    logits: &[f32],
    num_experts: usize,
    top_k: usize,
    weights: &mut [f32],
) -> Result<(), Error> {
    let e = positive("num_experts", num_experts)?;
    if top_k == 0 || top_k > num_experts || top_k > MOE_MAX_TOP_K {
        return Err(invalid(
            "top_k",
            format!("{top_k} outside 1..={}", num_experts.min(MOE_MAX_TOP_K)),
        ));
    }
    if !logits.len().is_multiple_of(num_experts) {
        return Err(invalid(
            "logits",
            format!(
                "{} elements is not a whole number of rows of {num_experts}",
                logits.len()
            ),
        ));
    }
    expect_len("weights", weights.len(), logits.len())?;
    let tokens = logits.len() / num_experts;
    if tokens == 0 {
        return Ok(());
    }
    let p = MoeRouteParams {
        logits: logits.as_ptr(),
        weights: weights.as_mut_ptr(),
        num_tokens: to_i32("tokens", tokens)?,
        num_experts: e,
        top_k: to_i32("top_k", top_k)?,
        pad: 0,
    };
    // SAFETY: logits and weights hold `tokens` rows of `num_experts`.
    let rc = graph::launch("moe_route", move || unsafe {
        ffi::pg_emu_moe_route(&p, crate::Dtype::F32 as i32)
    });
    status("moe_route", rc, crate::Dtype::F32)
}

/// The tensors of one [`moe_accumulate`].
#[derive(Debug)]
pub struct MoeAccIo<'a, T> {
    /// `[tokens, hidden]`: the expert's output for every token.
    pub y: &'a [T],
    /// `[tokens, num_experts]` (from [`moe_route`]).
    pub weights: &'a [f32],
    /// `[tokens, hidden]` f32, updated.
    pub acc: &'a mut [f32],
    /// `[tokens, hidden]`: the sum in `T` as well (the last expert), or none.
    pub out: Option<&'a mut [T]>,
}

/// `acc[t] = (first ? 0 : acc[t]) + w * y[t]` with `w = weights[t, expert]`, skipped where
/// `w` is 0; with `out`, `out = acc` in `T`.
pub fn moe_accumulate<T: Element>(
    io: MoeAccIo<'_, T>,
    hidden: usize,
    num_experts: usize,
    expert: usize,
    first: bool,
) -> Result<(), Error> {
    let h = positive("hidden", hidden)?;
    let e = positive("num_experts", num_experts)?;
    if expert >= num_experts {
        return Err(invalid(
            "expert",
            format!("{expert} outside 0..{num_experts}"),
        ));
    }
    if !io.weights.len().is_multiple_of(num_experts) {
        return Err(invalid(
            "weights",
            format!(
                "{} elements is not a whole number of rows of {num_experts}",
                io.weights.len()
            ),
        ));
    }
    let tokens = io.weights.len() / num_experts;
    let len = checked_mul("y", tokens, hidden)?;
    expect_len("y", io.y.len(), len)?;
    expect_len("acc", io.acc.len(), len)?;
    if let Some(o) = &io.out {
        expect_len("out", o.len(), len)?;
    }
    if tokens == 0 {
        return Ok(());
    }
    let p = MoeAccParams {
        y: io.y.as_ptr().cast(),
        weights: io.weights.as_ptr(),
        acc: io.acc.as_mut_ptr(),
        out: io.out.map_or(ptr::null_mut(), |o| o.as_mut_ptr().cast()),
        num_tokens: to_i32("tokens", tokens)?,
        hidden: h,
        num_experts: e,
        expert: to_i32("expert", expert)?,
        first: i32::from(first),
        pad: 0,
    };
    let t = T::DTYPE as i32;
    // SAFETY: y, acc (and out) hold `tokens` rows of `hidden`, weights `tokens` rows of
    // `num_experts`, expert < num_experts.
    let rc = graph::launch("moe_accumulate", move || unsafe {
        ffi::pg_emu_moe_acc(&p, t)
    });
    status("moe_accumulate", rc, T::DTYPE)
}
