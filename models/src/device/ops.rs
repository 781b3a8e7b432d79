//! The decoder's operations on a device ([`DeviceOps`]): each one kernel of core's
//! [`ModelOps`] (the `model.cu` kernels on `cuda:N` or `emu`, GEMMs through cuBLAS or
//! the host), on views of the step's first rows of buffers sized for the largest step.
//! RoPE is fused with the paged K/V write (`rope_write_kv`, the Q/K/V bias added
//! inside it); the MoE MLP runs in fixed shapes so a decode step stays one captured
//! graph: the router GEMM (f32 scores), the routing kernel (softmax, top-k,
//! renormalised: the CPU's `moe::route`, into a dense `[tokens, experts]` weight
//! matrix, 0 for the experts not picked), then every expert on every token of the
//! step, each output added into an f32 accumulator weighted by its column (rows of
//! weight 0 are skipped, so the sum is the CPU's: routed experts only, in expert
//! order).
//!
//! Why every expert on every token: which tokens an expert gets is known only on the
//! device, and a GEMM over only those rows would need their count on the host (a wait,
//! which a graph cannot hold) or a grouped GEMM that reads the counts on the device.
//! So this simple, correct version costs `experts / top_k` times the FLOPs of the routed
//! experts (4x for Mixtral 8x7B's top 2); a grouped GEMM is the follow-up.

use super::bufs::{dev, lead, lead_ref, need, rows, rows_ref, MoeBufs};
use super::weights::Dev;
use crate::arch::Activation;
use crate::decoder::{Dims, MlpDims, Moe, Ops, RopeIn, Tail};
use crate::error::ModelError;
use pagoda_core::{
    AttentionBackend, GatedAct, LayerIo, LayerKv, ModelOps, RopeIo, RopeShape, Storage,
};

/// The decoder's operations on a device for one step (its inputs already handed over
/// by [`ModelOps::begin_step`]).
pub(crate) struct DeviceOps<'a> {
    pub(crate) ops: &'a mut dyn ModelOps,
    /// The MoE layers' buffers (Mixtral), if the model has them.
    pub(crate) moe: &'a mut Option<MoeBufs>,
    /// The step's tokens (the rows the logits rows index).
    pub(crate) n: usize,
    /// Whether the last layer runs past its attention on the logits rows alone: when
    /// they are fewer than the tokens and the LM head's buffers hold them all (a step
    /// asking for more, prompt log-probabilities, runs every row and its head in
    /// chunks). A graph-captured step never prunes: it samples every row.
    pub(crate) prune: bool,
}

fn gated(act: Activation) -> GatedAct {
    match act {
        Activation::Silu => GatedAct::Silu,
        Activation::GeluTanh => GatedAct::GeluTanh,
    }
}

/// A gated MLP of `t.xn` (a dense layer's, or one expert's) into `out`.
fn mlp(
    ops: &mut dyn ModelOps,
    (w_gate_up, w_down): (&Storage, &Storage),
    t: &mut Tail<Storage>,
    (m, dims): (usize, MlpDims),
    out: &mut Storage,
) -> Result<(), ModelError> {
    let (hidden, inter) = (dims.hidden, dims.inter);
    let xn = rows_ref(&t.xn, m, hidden)?;
    let gate_up = rows(&mut t.gate_up, m, 2 * inter)?;
    ops.linear(xn, w_gate_up.view(), gate_up).map_err(dev)?;
    let gate_up = rows_ref(&t.gate_up, m, 2 * inter)?;
    let act = rows(&mut t.act, m, inter)?;
    ops.gated_act(gated(dims.act), gate_up, act).map_err(dev)?;
    let act = rows_ref(&t.act, m, inter)?;
    ops.linear(act, w_down.view(), rows(out, m, hidden)?)
        .map_err(dev)
}

impl Ops for DeviceOps<'_> {
    type W = Dev;
    type Buf = Storage;

    fn prunes_last_layer(&self) -> bool {
        self.prune
    }

    fn embed(
        &mut self,
        table: &Storage,
        scale: f32,
        d: Dims,
        out: &mut Storage,
    ) -> Result<(), ModelError> {
        let out = rows(out, d.rows, d.width)?;
        self.ops.embed(table.view(), scale, out).map_err(dev)
    }

    fn rms_norm(
        &mut self,
        x: &Storage,
        w: &Storage,
        eps: f32,
        d: Dims,
        out: &mut Storage,
    ) -> Result<(), ModelError> {
        let (x, out) = (rows_ref(x, d.rows, d.width)?, rows(out, d.rows, d.width)?);
        self.ops.rms_norm(x, w.view(), 0.0, eps, out).map_err(dev)
    }

    fn add_rms_norm(
        &mut self,
        h: &mut Storage,
        x: &Storage,
        w: &Storage,
        eps: f32,
        d: Dims,
        out: &mut Storage,
    ) -> Result<(), ModelError> {
        let h = rows(h, d.rows, d.width)?;
        let (x, out) = (rows_ref(x, d.rows, d.width)?, rows(out, d.rows, d.width)?);
        self.ops
            .add_rms_norm(h, x, w.view(), 0.0, eps, out)
            .map_err(dev)
    }

    fn linear(
        &mut self,
        x: &Storage,
        w: &Storage,
        d: Dims,
        n: usize,
        out: &mut Storage,
    ) -> Result<(), ModelError> {
        let (x, out) = (rows_ref(x, d.rows, d.width)?, rows(out, d.rows, n)?);
        self.ops.linear(x, w.view(), out).map_err(dev)
    }

    fn add_bias(&mut self, _x: &mut Storage, _b: &Storage, _d: Dims) -> Result<(), ModelError> {
        // `device_unsupported` refuses such a model before any step.
        Err(ModelError::Forward {
            message: "a Q/K/V bias before Q/K norms does not run on a device (use --device cpu)"
                .into(),
        })
    }

    fn qk_norm(
        &mut self,
        qkv: &mut Storage,
        (qn, kn): (&Storage, &Storage),
        eps: f32,
        shape: RopeShape,
        n: usize,
    ) -> Result<(), ModelError> {
        let qkv = rows(qkv, n, shape.qkv_dim())?;
        self.ops
            .qk_norm(qkv, qn.view(), kn.view(), eps, shape)
            .map_err(dev)
    }

    fn rope_write_kv<A: AttentionBackend + ?Sized>(
        &mut self,
        qkv: &Storage,
        r: RopeIn<'_, Dev>,
        pools: &mut LayerKv,
        _backend: &mut A,
        q: &mut Storage,
    ) -> Result<(), ModelError> {
        let shape = r.shape;
        let qkv = rows_ref(qkv, r.n, shape.qkv_dim())?;
        let q = rows(q, r.n, shape.num_heads * shape.head_dim)?;
        let (k_pool, v_pool) = pools.views_mut();
        let io = RopeIo {
            qkv,
            bias: r.bias.map(|b| b.view()),
            cos: r.rope.cos.view(),
            sin: r.rope.sin.view(),
            shape,
            q_out: q,
            k_pool,
            v_pool,
        };
        self.ops.rope_write_kv(io).map_err(dev)
    }

    fn attend<A: AttentionBackend + ?Sized>(
        &mut self,
        q: &Storage,
        pools: &LayerKv,
        backend: &mut A,
        shape: RopeShape,
        n: usize,
        out: &mut Storage,
    ) -> Result<(), ModelError> {
        let dims = [n, shape.num_heads, shape.head_dim];
        let (k_cache, v_cache) = pools.views();
        backend.run(LayerIo {
            q: lead_ref(q, &dims)?,
            k_cache,
            v_cache,
            out: lead(out, &dims)?,
            lse: None,
        })?;
        Ok(())
    }

    fn gated_act(
        &mut self,
        act: Activation,
        gate_up: &Storage,
        d: Dims,
        out: &mut Storage,
    ) -> Result<(), ModelError> {
        let gate_up = rows_ref(gate_up, d.rows, 2 * d.width)?;
        let out = rows(out, d.rows, d.width)?;
        self.ops.gated_act(gated(act), gate_up, out).map_err(dev)
    }

    fn moe(
        &mut self,
        moe: &Moe<Dev>,
        t: &mut Tail<Storage>,
        n: usize,
        dims: MlpDims,
    ) -> Result<(), ModelError> {
        let hidden = dims.hidden;
        let experts = moe.experts.len();
        let ops = &mut *self.ops;
        let m = need(self.moe, "MoE buffers")?;
        let scores = rows(&mut m.logits, n, experts)?;
        ops.linear(rows_ref(&t.xn, n, hidden)?, moe.router.view(), scores)
            .map_err(dev)?;
        let weights = rows(&mut m.weights, n, experts)?;
        ops.moe_route(rows_ref(&m.logits, n, experts)?, moe.top_k, weights)
            .map_err(dev)?;
        for (e, w) in moe.experts.iter().enumerate() {
            mlp(ops, (&w.w_gate_up, &w.w_down), t, (n, dims), &mut m.y)?;
            let last = e + 1 == experts;
            let out = if last {
                Some(rows(&mut t.proj, n, hidden)?)
            } else {
                None
            };
            ops.moe_accumulate(
                rows_ref(&m.y, n, hidden)?,
                rows_ref(&m.weights, n, experts)?,
                e,
                e == 0,
                rows(&mut m.acc, n, hidden)?,
                out,
            )
            .map_err(dev)?;
        }
        Ok(())
    }

    fn gather_rows(
        &mut self,
        x: &Storage,
        width: usize,
        first: usize,
        count: usize,
        out: &mut Storage,
    ) -> Result<(), ModelError> {
        let x = rows_ref(x, self.n, width)?;
        let out = rows(out, count, width)?;
        self.ops
            .gather_logits_rows(x, width, first, out)
            .map_err(dev)
    }

    fn soft_cap(&mut self, x: &mut Storage, len: usize, cap: f32) -> Result<(), ModelError> {
        let x = lead(x, &[len])?;
        self.ops.soft_cap(x, cap).map_err(dev)
    }
}
