//! One decoder layer's launches on the device, for every family: the fused QKV GEMM,
//! Qwen3's per-head Q/K norms (after any bias would be added on the CPU, before RoPE:
//! the device refuses a bias with them, see `device_unsupported`), RoPE fused with the
//! paged K/V write, attention on the layer's backend (its kind: sliding or global,
//! soft-capped or not), o_proj, Gemma 2's post-attention norm, the residual add fused
//! with the MLP's input norm, the MLP (dense, or Mixtral's MoE in `moe.rs`), Gemma 2's
//! post-feedforward norm, and the residual add fused with the next layer's input norm.

use super::bufs::{dev, lead, lead_ref, need, residual_input, rows, rows_ref, Bufs};
use super::model::DeviceLlama;
use super::weights::DeviceMlp;
use crate::error::ModelError;
use pagoda_core::{AttentionBackend, KvCache, LayerIo, ModelOps, RopeShape, Storage};
use std::ops::DerefMut;

/// Where [`DeviceLlama::mlp`] writes its output.
#[derive(Debug, Clone, Copy)]
pub(super) enum MlpOut {
    /// `b.proj` (a dense layer).
    Proj,
    /// The MoE buffers' `y` (one expert).
    ExpertY,
}

impl DeviceLlama {
    /// The heads and dims of the fused QKV rows.
    pub(super) fn rope_shape(&self) -> RopeShape {
        let c = &self.config;
        RopeShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        }
    }

    /// Layer `l` on the step's `n` tokens, its input norm already in `b.xn`: attention
    /// and MLP with their residual adds into `b.h`; then, unless it is the last layer,
    /// the next layer's input norm into `b.xn`. The last layer leaves its MLP output
    /// for `head` (where [`residual_input`] says).
    pub(super) fn layer<B, A>(
        &self,
        ops: &mut dyn ModelOps,
        l: usize,
        n: usize,
        attn: &mut [B],
        kv: &mut KvCache,
        b: &mut Bufs,
    ) -> Result<(), ModelError>
    where
        B: DerefMut<Target = A>,
        A: AttentionBackend + ?Sized,
    {
        let c = &self.config;
        let layer = &self.layers[l];
        let (hidden, eps) = (c.hidden_size, c.rms_norm_eps);
        let backend = &mut *attn[self.kind_of_layer[l]];
        self.attention(ops, l, n, backend, kv, b)?;
        ops.linear(
            rows_ref(&b.attn, n, c.num_heads * c.head_dim)?,
            layer.wo.view(),
            rows(&mut b.proj, n, hidden)?,
        )
        .map_err(dev)?;
        self.post_norm(ops, layer.post_attn_norm.as_ref(), n, b)?;
        let x = residual_input(&b.proj, &b.post, c.arch.post_norms)?;
        ops.add_rms_norm(
            rows(&mut b.h, n, hidden)?,
            rows_ref(x, n, hidden)?,
            layer.ffn_norm.view(),
            0.0,
            eps,
            rows(&mut b.xn, n, hidden)?,
        )
        .map_err(dev)?;
        match &layer.mlp {
            DeviceMlp::Dense(w) => {
                self.mlp(ops, n, &w.w_gate_up, &w.w_down, b, MlpOut::Proj)?;
            }
            DeviceMlp::Moe(moe) => self.moe(ops, n, moe, b)?,
        }
        self.post_norm(ops, layer.post_ffn_norm.as_ref(), n, b)?;
        if let Some(next) = self.layers.get(l + 1) {
            let x = residual_input(&b.proj, &b.post, c.arch.post_norms)?;
            ops.add_rms_norm(
                rows(&mut b.h, n, hidden)?,
                rows_ref(x, n, hidden)?,
                next.attn_norm.view(),
                0.0,
                eps,
                rows(&mut b.xn, n, hidden)?,
            )
            .map_err(dev)?;
        }
        Ok(())
    }

    /// Layer `l`'s QKV projection of `b.xn`, the Q/K norms, RoPE and its K/V into
    /// the cache, attention into `b.attn`.
    fn attention<A: AttentionBackend + ?Sized>(
        &self,
        ops: &mut dyn ModelOps,
        l: usize,
        n: usize,
        backend: &mut A,
        kv: &mut KvCache,
        b: &mut Bufs,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let layer = &self.layers[l];
        let rope = self.rope_shape();
        let (hidden, hd) = (c.hidden_size, c.head_dim);
        ops.linear(
            rows_ref(&b.xn, n, hidden)?,
            layer.wqkv.view(),
            rows(&mut b.qkv, n, rope.qkv_dim())?,
        )
        .map_err(dev)?;
        if let Some((qn, kn)) = &layer.qk_norm {
            ops.qk_norm(
                rows(&mut b.qkv, n, rope.qkv_dim())?,
                qn.view(),
                kn.view(),
                c.rms_norm_eps,
                rope,
            )
            .map_err(dev)?;
        }
        let pools = &mut kv.layers[l];
        {
            let (k_pool, v_pool) = pools.views_mut();
            ops.rope_write_kv(
                rows_ref(&b.qkv, n, rope.qkv_dim())?,
                layer.qkv_bias.as_ref().map(|x| x.view()),
                self.cos.view(),
                self.sin.view(),
                rope,
                rows(&mut b.q, n, c.num_heads * hd)?,
                k_pool,
                v_pool,
            )
            .map_err(dev)?;
        }
        let (k_cache, v_cache) = pools.views();
        backend.run(LayerIo {
            q: lead_ref(&b.q, &[n, c.num_heads, hd])?,
            k_cache,
            v_cache,
            out: lead(&mut b.attn, &[n, c.num_heads, hd])?,
            lse: None,
        })?;
        Ok(())
    }

    /// With a post-norm weight (Gemma 2), `b.post = rms_norm(b.proj)`.
    fn post_norm(
        &self,
        ops: &mut dyn ModelOps,
        w: Option<&Storage>,
        n: usize,
        b: &mut Bufs,
    ) -> Result<(), ModelError> {
        let Some(w) = w else { return Ok(()) };
        let (hidden, eps) = (self.config.hidden_size, self.config.rms_norm_eps);
        ops.rms_norm(
            rows_ref(&b.proj, n, hidden)?,
            w.view(),
            0.0,
            eps,
            rows(need(&mut b.post, "post-norm output")?, n, hidden)?,
        )
        .map_err(dev)
    }

    /// A gated MLP of `b.xn` (a dense layer's, or one expert's) into `out`: gate/up
    /// GEMM, the family's activation, down GEMM.
    pub(super) fn mlp(
        &self,
        ops: &mut dyn ModelOps,
        n: usize,
        w_gate_up: &Storage,
        w_down: &Storage,
        b: &mut Bufs,
        out: MlpOut,
    ) -> Result<(), ModelError> {
        let (hidden, inter) = (self.config.hidden_size, self.config.intermediate_size);
        ops.linear(
            rows_ref(&b.xn, n, hidden)?,
            w_gate_up.view(),
            rows(&mut b.gate_up, n, 2 * inter)?,
        )
        .map_err(dev)?;
        ops.gated_act(
            self.act,
            rows_ref(&b.gate_up, n, 2 * inter)?,
            rows(&mut b.act, n, inter)?,
        )
        .map_err(dev)?;
        let dst = match out {
            MlpOut::Proj => &mut b.proj,
            MlpOut::ExpertY => &mut need(&mut b.moe, "MoE buffers")?.y,
        };
        ops.linear(
            rows_ref(&b.act, n, inter)?,
            w_down.view(),
            rows(dst, n, hidden)?,
        )
        .map_err(dev)
    }
}
