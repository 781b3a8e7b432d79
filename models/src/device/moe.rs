//! Mixtral's sparse MoE MLP on the device, in fixed shapes so a decode step stays one
//! captured graph: the router GEMM (f32 scores), the routing kernel (softmax, top-k,
//! renormalised: the CPU's `moe::route`, into a dense `[tokens, experts]` weight matrix,
//! 0 for the experts not picked), then every expert on every token of the step, each
//! output added into an f32 accumulator weighted by its column (rows of weight 0 are
//! skipped, so the sum is the CPU's: routed experts only, in expert order).
//!
//! Why every expert on every token: which tokens an expert gets is known only on the
//! device, and a GEMM over only those rows would need their count on the host (a wait,
//! which a graph cannot hold) or a grouped GEMM that reads the counts on the device.
//! So this simple, correct version costs `experts / top_k` times the FLOPs of the routed
//! experts (4x for Mixtral 8x7B's top 2); a grouped GEMM is the follow-up.

use super::bufs::{dev, need, rows, rows_ref, Bufs};
use super::layer::MlpOut;
use super::model::DeviceLlama;
use super::weights::DeviceMoe;
use crate::error::ModelError;
use pagoda_core::ModelOps;

impl DeviceLlama {
    /// The MoE MLP of `b.xn` into `b.proj`.
    pub(super) fn moe(
        &self,
        ops: &mut dyn ModelOps,
        n: usize,
        moe: &DeviceMoe,
        b: &mut Bufs,
    ) -> Result<(), ModelError> {
        let hidden = self.config.hidden_size;
        let experts = moe.experts.len();
        {
            let m = need(&mut b.moe, "MoE buffers")?;
            ops.linear(
                rows_ref(&b.xn, n, hidden)?,
                moe.router.view(),
                rows(&mut m.logits, n, experts)?,
            )
            .map_err(dev)?;
            ops.moe_route(
                rows_ref(&m.logits, n, experts)?,
                moe.top_k,
                rows(&mut m.weights, n, experts)?,
            )
            .map_err(dev)?;
        }
        for (e, w) in moe.experts.iter().enumerate() {
            self.mlp(ops, n, &w.w_gate_up, &w.w_down, b, MlpOut::ExpertY)?;
            let m = need(&mut b.moe, "MoE buffers")?;
            let last = e + 1 == experts;
            let out = if last {
                Some(rows(&mut b.proj, n, hidden)?)
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
}
