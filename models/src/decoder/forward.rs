//! The forward pass of every family, once: the embedding, each layer's attention and
//! MLP with their norms and residual adds, the last layer on the logits rows alone
//! (where the device allows it), then the final norm, the LM head and the soft cap on
//! those rows.

use super::{check_backends, Decoder, Dims, Layer, Mlp, Ops, RopeIn, Weights};
use crate::error::ModelError;
use pagoda_core::{AttentionBackend, KvCache};
use std::ops::DerefMut;

/// The buffers of the part of a layer after attention (o_proj, residual, MLP).
#[derive(Debug, Default)]
pub(crate) struct Tail<B> {
    /// Normed input of the next projection `[tokens, hidden]` (also the next layer's
    /// attention input, and after the last layer the final norm's output).
    pub(crate) xn: B,
    /// o_proj's / down_proj's output `[tokens, hidden]`.
    pub(crate) proj: B,
    /// The post-norm of `proj` (Gemma 2): what the residual adds there.
    pub(crate) post: B,
    pub(crate) gate_up: B,
    pub(crate) act: B,
}

/// A step's activation buffers.
#[derive(Debug, Default)]
pub(crate) struct Bufs<B> {
    /// Residual stream `[tokens, hidden]` (f32 on every device).
    pub(crate) h: B,
    /// Fused QKV output `[tokens, q + 2 kv]`.
    pub(crate) qkv: B,
    /// Rotated queries `[tokens, q]`.
    pub(crate) q: B,
    /// Attention output `[tokens, q]`.
    pub(crate) attn: B,
    /// The logits rows' attention output and residual, gathered for a pruned last
    /// layer.
    pub(crate) sel_attn: B,
    pub(crate) sel_h: B,
    /// The logits rows' final norm output: the LM head's input.
    pub(crate) sel_n: B,
    /// `[rows, vocab]` f32.
    pub(crate) logits: B,
    pub(crate) t: Tail<B>,
}

/// Every layer of a step of `n` tokens of which `r` need logits, the step's inputs
/// already with `ops`, each backend planned: afterwards the final norm's output of
/// the logits rows is ready for [`head`]. Returns whether the last layer ran on the
/// logits rows alone (then `b.sel_n` holds them, in order; otherwise `b.t.xn` holds
/// every row).
pub(crate) fn forward_layers<O, B, A>(
    d: &Decoder<O::W>,
    ops: &mut O,
    (n, r): (usize, usize),
    attn: &mut [B],
    kv: &mut KvCache,
    b: &mut Bufs<O::Buf>,
) -> Result<bool, ModelError>
where
    O: Ops,
    B: DerefMut<Target = A>,
    A: AttentionBackend + ?Sized,
{
    check_backends(&d.attn_kinds, attn.len())?;
    let c = &d.config;
    let (hidden, eps) = (c.hidden_size, c.rms_norm_eps);
    let q_dim = c.num_heads * c.head_dim;
    let rows = Dims::new(n, hidden);
    ops.embed(&d.embed, d.embed_scale, rows, &mut b.h)?;
    let Some(first) = d.layers.first() else {
        ops.rms_norm(&b.h, &d.norm, eps, rows, &mut b.t.xn)?;
        return Ok(false);
    };
    ops.rms_norm(&b.h, &first.attn_norm, eps, rows, &mut b.t.xn)?;
    // Past the last layer's attention only the logits rows matter.
    let prune = r < n && ops.prunes_last_layer();
    for (l, layer) in d.layers.iter().enumerate() {
        let backend = &mut *attn[d.kind_of_layer[l]];
        attention(d, ops, l, n, backend, kv, b)?;
        match d.layers.get(l + 1) {
            Some(next) => {
                let norm = &next.attn_norm;
                finish_layer(
                    d,
                    ops,
                    layer,
                    (n, norm),
                    (&b.attn, &mut b.h),
                    &mut b.t,
                    None,
                )?;
            }
            None if prune => {
                ops.gather_rows(&b.attn, q_dim, 0, r, &mut b.sel_attn)?;
                ops.gather_rows(&b.h, hidden, 0, r, &mut b.sel_h)?;
                let out = Some(&mut b.sel_n);
                let io = (&b.sel_attn, &mut b.sel_h);
                finish_layer(d, ops, layer, (r, &d.norm), io, &mut b.t, out)?;
            }
            None => {
                finish_layer(
                    d,
                    ops,
                    layer,
                    (n, &d.norm),
                    (&b.attn, &mut b.h),
                    &mut b.t,
                    None,
                )?;
            }
        }
    }
    Ok(prune)
}

/// The LM head (and the final soft cap) on the logits rows `first..first + count`,
/// into the first `count` rows of `b.logits`; `pruned` as [`forward_layers`] returned
/// (then the one chunk is every row: `first == 0`).
pub(crate) fn head<O: Ops>(
    d: &Decoder<O::W>,
    ops: &mut O,
    (first, count): (usize, usize),
    pruned: bool,
    b: &mut Bufs<O::Buf>,
) -> Result<(), ModelError> {
    let c = &d.config;
    let (hidden, vocab) = (c.hidden_size, c.vocab_size);
    if !pruned {
        ops.gather_rows(&b.t.xn, hidden, first, count, &mut b.sel_n)?;
    }
    let w = match &d.lm_head {
        Some(h) => h,
        None => <O::W as Weights>::tied_head(&d.embed).ok_or_else(|| ModelError::Forward {
            message: "the model has neither an LM head nor an embedding tied to one".into(),
        })?,
    };
    ops.linear(&b.sel_n, w, Dims::new(count, hidden), vocab, &mut b.logits)?;
    match c.arch.final_logit_softcap {
        Some(cap) => ops.soft_cap(&mut b.logits, count * vocab, cap),
        None => Ok(()),
    }
}

/// Layer `l`'s QKV projection of `b.t.xn`, the bias and Q/K norms, RoPE and its K/V
/// into the cache, attention into `b.attn`, for every token of the step.
fn attention<O: Ops, A: AttentionBackend + ?Sized>(
    d: &Decoder<O::W>,
    ops: &mut O,
    l: usize,
    n: usize,
    backend: &mut A,
    kv: &mut KvCache,
    b: &mut Bufs<O::Buf>,
) -> Result<(), ModelError> {
    let c = &d.config;
    let layer = &d.layers[l];
    let shape = d.rope_shape();
    let qkv = Dims::new(n, shape.qkv_dim());
    let x = Dims::new(n, c.hidden_size);
    ops.linear(&b.t.xn, &layer.wqkv, x, qkv.width, &mut b.qkv)?;
    let mut bias = layer.qkv_bias.as_ref();
    if let Some((qn, kn)) = &layer.qk_norm {
        // The bias comes before the norms (no family has both; the CPU runs it).
        if let Some(bias) = bias.take() {
            ops.add_bias(&mut b.qkv, bias, qkv)?;
        }
        ops.qk_norm(&mut b.qkv, (qn, kn), c.rms_norm_eps, shape, n)?;
    }
    let pools = &mut kv.layers[l];
    let r = RopeIn {
        rope: &d.rope,
        bias,
        shape,
        n,
    };
    ops.rope_write_kv(&b.qkv, r, pools, backend, &mut b.q)?;
    ops.attend(&b.q, pools, backend, shape, n, &mut b.attn)
}

/// The rest of a layer on `m` rows: o_proj of `attn`, the post-attention norm, the
/// residual add into `h` fused with the MLP's input norm, the MLP, the
/// post-feedforward norm, and the residual add fused with `norm` (the next layer's
/// input norm, or the final norm) into `out` (`t.xn` when `None`).
fn finish_layer<O: Ops>(
    d: &Decoder<O::W>,
    ops: &mut O,
    layer: &Layer<O::W>,
    (m, norm): (usize, &<O::W as Weights>::Vec),
    (attn, h): (&O::Buf, &mut O::Buf),
    t: &mut Tail<O::Buf>,
    out: Option<&mut O::Buf>,
) -> Result<(), ModelError> {
    let c = &d.config;
    let eps = c.rms_norm_eps;
    let rows = Dims::new(m, c.hidden_size);
    let q_dim = c.num_heads * c.head_dim;
    ops.linear(
        attn,
        &layer.wo,
        Dims::new(m, q_dim),
        rows.width,
        &mut t.proj,
    )?;
    post_norm(ops, layer.post_attn_norm.as_ref(), eps, rows, t)?;
    let (x, xn) = split_tail(t, layer.post_attn_norm.is_some());
    ops.add_rms_norm(h, x, &layer.ffn_norm, eps, rows, xn)?;
    let dims = d.mlp_dims();
    match &layer.mlp {
        Mlp::Dense(w) => {
            let gu = Dims::new(m, 2 * dims.inter);
            ops.linear(&t.xn, &w.w_gate_up, rows, gu.width, &mut t.gate_up)?;
            ops.gated_act(dims.act, &t.gate_up, Dims::new(m, dims.inter), &mut t.act)?;
            ops.linear(
                &t.act,
                &w.w_down,
                Dims::new(m, dims.inter),
                rows.width,
                &mut t.proj,
            )?;
        }
        Mlp::Moe(moe) => ops.moe(moe, t, m, dims)?,
    }
    post_norm(ops, layer.post_ffn_norm.as_ref(), eps, rows, t)?;
    let (x, xn) = split_tail(t, layer.post_ffn_norm.is_some());
    ops.add_rms_norm(h, x, norm, eps, rows, out.unwrap_or(xn))
}

/// The residual's input (`t.post` when `post`, else `t.proj`) and `t.xn`, borrowed
/// together (the norm fused with the add writes `t.xn`).
fn split_tail<B>(t: &mut Tail<B>, post: bool) -> (&B, &mut B) {
    let x = if post { &t.post } else { &t.proj };
    (x, &mut t.xn)
}

/// With a post-norm weight (Gemma 2), `t.post = rms_norm(t.proj)`.
fn post_norm<O: Ops>(
    ops: &mut O,
    w: Option<&<O::W as Weights>::Vec>,
    eps: f32,
    rows: Dims,
    t: &mut Tail<O::Buf>,
) -> Result<(), ModelError> {
    match w {
        Some(w) => ops.rms_norm(&t.proj, w, eps, rows, &mut t.post),
        None => Ok(()),
    }
}
