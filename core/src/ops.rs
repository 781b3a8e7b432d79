//! Model kernels on a device: the operations of a decoder forward pass other than
//! attention (embedding, RMSNorm fused with the residual add, the linear layers'
//! GEMM, RoPE fused with the paged K/V write, SiLU-mul, row gathers, greedy argmax,
//! and the families' extras: Qwen3's per-head Q/K norms, Gemma 2's final-logit soft
//! cap, Mixtral's MoE routing and weighted expert sum), as the trait a device crate
//! implements ([`ModelOps`]) and its registry ([`open_model_ops`]).
//!
//! The model crate runs its device forward through this trait, so it knows no CUDA;
//! the CUDA crate implements it for `cuda:N` (kernels on the GPU) and for `emu`
//! (the same `.cu` kernels compiled for the host, GEMMs on the CPU), and registers
//! both with [`register_model_ops!`](crate::register_model_ops).
//!
//! Integer inputs of a step (token ids, positions, slots, the rows whose logits are
//! needed) go to the device once per step in [`ModelOps::begin_step`], into buffers
//! the implementation owns at fixed addresses; the kernels after it read them from
//! there. That is what lets a decode step be replayed as a CUDA graph: only the
//! contents of those buffers change between replays. [`ModelOps::begin_capture`],
//! [`ModelOps::end_capture`] and [`ModelOps::replay`] are that graph interface: stream
//! capture on `cuda:N`, recorded launches on `emu`.

use crate::device::DeviceRuntime;
use crate::tensor::{Device, DeviceKind, TensorMut, TensorRef};
use crate::CoreError;
use std::sync::Arc;

/// The integer inputs of one step, in the batch's token order.
#[derive(Debug, Clone, Copy)]
pub struct StepInputs<'a> {
    /// `[num_tokens]` token ids.
    pub input_ids: &'a [u32],
    /// `[num_tokens]` positions.
    pub positions: &'a [u32],
    /// `[num_tokens]` cache slots (`block * block_size + offset`; negative = padding,
    /// no K/V written).
    pub slot_mapping: &'a [i64],
    /// The batch rows whose logits are computed, in output order.
    pub logits_rows: &'a [u32],
}

/// Heads and dims of [`ModelOps::rope_write_kv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl RopeShape {
    /// Width of one fused QKV row.
    pub fn qkv_dim(&self) -> usize {
        (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
    }
}

/// The most experts per token [`ModelOps::moe_route`] keeps (a device's routing kernel
/// holds its picks in registers); a model that routes to more is refused on a device.
pub const MOE_MAX_TOP_K: usize = 32;

/// The elementwise activation of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedAct {
    /// `silu(gate) * up` (Llama).
    Silu,
    /// `gelu_tanh(gate) * up` (Gemma).
    GeluTanh,
}

/// The views of one [`ModelOps::rope_write_kv`]: RoPE (rotate-half convention, tables
/// `cos`/`sin` `[max_pos, head_dim / 2]` f32 at the step's positions) on the fused
/// `qkv` rows (plus `bias`, if any): rotated q into `q_out` `[num_tokens, num_heads *
/// head_dim]`, rotated k and v into this layer's pools at the step's slots (negative
/// slots: q only). One value, because the kernel is one launch over all of them.
#[derive(Debug)]
pub struct RopeIo<'a> {
    pub qkv: TensorRef<'a>,
    pub bias: Option<TensorRef<'a>>,
    pub cos: TensorRef<'a>,
    pub sin: TensorRef<'a>,
    pub shape: RopeShape,
    pub q_out: TensorMut<'a>,
    pub k_pool: TensorMut<'a>,
    pub v_pool: TensorMut<'a>,
}

/// The non-attention kernels of a decoder forward pass on one device.
///
/// Buffers are views of this device's memory with their dtype and shape; every
/// method checks them (shapes, dtypes, devices) and returns an error on a mismatch,
/// never panics. Methods queue work on the device and do not wait for it, except
/// [`ModelOps::download_f32`] and [`ModelOps::argmax`], which return host values.
pub trait ModelOps: Send {
    /// The device the kernels run on.
    fn device(&self) -> Device;

    /// The device's memory owner (allocation, copies).
    fn runtime(&self) -> &Arc<dyn DeviceRuntime>;

    /// Copies the step's integer inputs to the device in one transfer.
    fn begin_step(&mut self, step: &StepInputs<'_>) -> Result<(), CoreError>;

    /// `out[t] = scale * table[input_ids[t]]`: `table` `[vocab, hidden]`, `out`
    /// `[num_tokens, hidden]` (the step's ids).
    fn embed(
        &mut self,
        table: TensorRef<'_>,
        scale: f32,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError>;

    /// `out[t] = x[t] / rms(x[t]) * (w + w_offset)`, rows of `w.len()`.
    fn rms_norm(
        &mut self,
        x: TensorRef<'_>,
        w: TensorRef<'_>,
        w_offset: f32,
        eps: f32,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError>;

    /// `residual += x`, then `out = rms_norm(residual)` (vLLM's fused add + norm).
    fn add_rms_norm(
        &mut self,
        residual: TensorMut<'_>,
        x: TensorRef<'_>,
        w: TensorRef<'_>,
        w_offset: f32,
        eps: f32,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError>;

    /// `out[m, n] = x[m, k] · w[n, k]^T` (f32 accumulation), shapes from the views.
    fn linear(
        &mut self,
        x: TensorRef<'_>,
        w: TensorRef<'_>,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError>;

    /// RoPE and the K/V write of one layer ([`RopeIo`]: what is read and written).
    fn rope_write_kv(&mut self, io: RopeIo<'_>) -> Result<(), CoreError>;

    /// `out[t] = act(gate_up[t][..i]) * gate_up[t][i..]`, `out` `[rows, i]`.
    fn gated_act(
        &mut self,
        act: GatedAct,
        gate_up: TensorRef<'_>,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError>;

    /// Per-head RMSNorm in place on the q and k heads of the fused `qkv` rows `[tokens,
    /// shape.qkv_dim()]` (Qwen3's Q/K norms, before RoPE): every q head by `q_weight`,
    /// every k head by `k_weight` (`[head_dim]` f32 each), as [`ModelOps::rms_norm`]
    /// with no offset; v untouched.
    fn qk_norm(
        &mut self,
        qkv: TensorMut<'_>,
        q_weight: TensorRef<'_>,
        k_weight: TensorRef<'_>,
        eps: f32,
        shape: RopeShape,
    ) -> Result<(), CoreError>;

    /// `x = cap * tanh(x / cap)` in place on f32 `x` (Gemma 2's final-logit soft cap);
    /// `cap` positive and finite.
    fn soft_cap(&mut self, x: TensorMut<'_>, cap: f32) -> Result<(), CoreError>;

    /// Mixtral's routing of `router_logits` `[tokens, experts]` f32: per token a softmax,
    /// the `top_k` largest (the smaller index on ties) renormalised to sum to 1, into
    /// the dense `weights` `[tokens, experts]` f32 (exactly 0 for the experts not
    /// picked); `top_k` in `1..=min(experts, MOE_MAX_TOP_K)`. The shapes are the
    /// step's, whatever the routing: a graph replays it.
    fn moe_route(
        &mut self,
        router_logits: TensorRef<'_>,
        top_k: usize,
        weights: TensorMut<'_>,
    ) -> Result<(), CoreError>;

    /// One expert's output `y` `[tokens, hidden]` into the f32 accumulator `acc` (same
    /// shape): `acc = (first ? 0 : acc) + weights[:, expert] * y`, rows whose weight is
    /// 0 unchanged (the expert was not picked for them); with `out` (the last expert),
    /// the sum also into `out` (`y`'s dtype). Experts added in expert order are the CPU's
    /// sum.
    fn moe_accumulate(
        &mut self,
        y: TensorRef<'_>,
        weights: TensorRef<'_>,
        expert: usize,
        first: bool,
        acc: TensorMut<'_>,
        out: Option<TensorMut<'_>>,
    ) -> Result<(), CoreError>;

    /// `out[i] = x[logits_rows[first + i]]` for the step's logits rows `first..first +
    /// out rows` (rows of `width`): the LM head runs over chunks of the logits rows
    /// when a step has more than its buffers hold (prompt log-probabilities).
    fn gather_logits_rows(
        &mut self,
        x: TensorRef<'_>,
        width: usize,
        first: usize,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError>;

    /// Waits for the queued work and copies `x` into host f32s (converting).
    fn download_f32(&mut self, x: TensorRef<'_>, out: &mut [f32]) -> Result<(), CoreError>;

    /// Greedy ids of the rows of `logits` `[rows, vocab]` (first maximum; NaN
    /// skipped), computed on the device; waits and returns them on the host.
    fn argmax(&mut self, logits: TensorRef<'_>, ids: &mut [u32]) -> Result<(), CoreError>;

    /// Sizes the step-input buffers of [`ModelOps::begin_step`] for every step of up
    /// to `max_tokens` tokens and `max_rows` logits rows. After it no step moves them
    /// (what a captured graph needs, as it reads them at their captured addresses); a
    /// larger step is an error.
    fn reserve_step(&mut self, max_tokens: usize, max_rows: usize) -> Result<(), CoreError> {
        let _ = (max_tokens, max_rows);
        Err(self.no_graphs())
    }

    /// Starts capturing: until [`ModelOps::end_capture`], the launches of this thread
    /// on this device (these kernels, and the attention backends' on the same device)
    /// are recorded into a graph instead of run. Nothing may wait for the device or
    /// allocate while capturing.
    fn begin_capture(&mut self) -> Result<(), CoreError> {
        Err(self.no_graphs())
    }

    /// Ends the capture and keeps the graph; its handle.
    fn end_capture(&mut self) -> Result<GraphId, CoreError> {
        Err(self.no_graphs())
    }

    /// Drops a capture in progress (after an error inside one); no-op otherwise.
    fn abort_capture(&mut self) {}

    /// Runs a captured graph: its launches with their captured arguments.
    ///
    /// # Safety
    /// Every buffer the captured launches use (weights, activations, the KV cache,
    /// the step inputs, the attention backends' metadata) must still be alive at its
    /// captured address and large enough, and this step's inputs must have been
    /// checked and handed over (`begin_step`, the backends' `plan_graph`) as for an
    /// eager step: the kernels trust them.
    unsafe fn replay(&mut self, graph: GraphId) -> Result<(), CoreError> {
        let _ = graph;
        Err(self.no_graphs())
    }

    /// The error of the graph methods a device does not implement.
    fn no_graphs(&self) -> CoreError {
        CoreError::GraphUnsupported {
            what: format!("the model kernels of {}", self.device()),
        }
    }
}

/// A graph kept by a [`ModelOps`] (index into its captures).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphId(pub usize);

/// How a device crate opens its model kernels on one device.
pub type OpenModelOps = fn(Arc<dyn DeviceRuntime>) -> Result<Box<dyn ModelOps>, CoreError>;

/// A device crate's model kernels for one device family.
pub struct ModelOpsRegistration {
    pub kind: DeviceKind,
    /// The crate that registered it (for messages).
    pub provider: &'static str,
    pub open: OpenModelOps,
}

inventory::collect!(ModelOpsRegistration);

/// Registers model kernels: `register_model_ops!(ModelOpsRegistration { .. });`
#[macro_export]
macro_rules! register_model_ops {
    ($reg:expr) => {
        $crate::inventory::submit! { $reg }
    };
}

/// Whether this binary links model kernels for `device`'s family.
pub fn has_model_ops(device: Device) -> bool {
    inventory::iter::<ModelOpsRegistration>
        .into_iter()
        .any(|r| r.kind == device.kind())
}

/// The model kernels of `runtime`'s device, or why there are none.
pub fn open_model_ops(runtime: Arc<dyn DeviceRuntime>) -> Result<Box<dyn ModelOps>, CoreError> {
    let device = runtime.device();
    let r = inventory::iter::<ModelOpsRegistration>
        .into_iter()
        .find(|r| r.kind == device.kind())
        .ok_or_else(|| CoreError::DeviceUnavailable {
            device,
            message: format!(
                "this binary links no model kernels for {} (pagoda-cuda provides cuda and emu)",
                device.kind()
            ),
        })?;
    (r.open)(runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_provider_opening_is_a_clear_error() {
        // core's own tests link no device crate.
        let rt = crate::open_device(Device::Emu).unwrap();
        assert!(!has_model_ops(Device::Emu));
        let e = open_model_ops(rt).err().unwrap();
        assert!(e.to_string().contains("no model kernels for emu"), "{e}");
    }

    #[test]
    fn qkv_width() {
        let s = RopeShape {
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
        };
        assert_eq!(s.qkv_dim(), 15 * 64);
    }
}
