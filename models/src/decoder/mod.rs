//! The one decoder: every family's forward pass written once ([`forward`]), over the
//! operations of a device ([`Ops`]), on weights placed for that device ([`Weights`],
//! built by `build.rs` after the same shape checks for every device).
//!
//! What a family adds is a switch here, never a second implementation: Q/K/V biases
//! (Qwen2), per-head Q/K norms (Qwen3), sliding windows and attention soft caps (in
//! the attention backends the layer's kind selects), Gemma 2's scaled embedding,
//! post-norms, tanh-GELU and final-logit soft cap, Mixtral's sparse MoE MLP, tied
//! embeddings. Two implementations of [`Ops`] exist: the CPU's (`crate::cpu_ops`:
//! the fused f32 kernels and the packed and quantized GEMMs, bit for bit what this
//! crate ran before the decoders were merged) and the device's (`crate::device`:
//! core's `ModelOps`, i.e. the `model.cu` kernels on `cuda:N` or `emu`). An op is
//! a unit a device implements as one kernel (or one fused sequence, as the MoE MLP);
//! the order of the ops, which weights they take and where their outputs go is this
//! module's alone.
//!
//! Why generic and not `dyn`: the CPU's activations are host `Vec<f32>`s and its
//! weights packed panels, a device's are `Storage`s; monomorphised, the CPU pays
//! nothing for the abstraction (BENCHMARKS.md, "One decoder").

mod build;
mod forward;
mod step;

pub(crate) use build::{build_decoder, Place};
pub(crate) use forward::{forward_layers, head, Bufs, Tail};
pub(crate) use step::{check_step_inputs, validate_config};

use crate::arch::{Activation, AttnKind};
use crate::config::LlamaConfig;
use crate::error::ModelError;
use pagoda_core::{AttentionBackend, LayerKv, RopeShape};

/// What a device's weights are: the types [`Decoder`] holds.
pub(crate) trait Weights {
    /// A linear layer's matrix `[n, k]` (`nn.Linear` layout).
    type Mat;
    /// A norm weight or a bias (f32).
    type Vec;
    /// The RoPE tables.
    type Rope;
    /// The token embedding table.
    type Embed;

    /// The LM head an embedding tied to it serves as, if it can.
    fn tied_head(embed: &Self::Embed) -> Option<&Self::Mat>;
}

/// A gated MLP's projections: a dense layer's, or one expert's.
pub(crate) struct Expert<W: Weights> {
    /// `[2 * intermediate, hidden]`: rows of w_gate, then w_up.
    pub(crate) w_gate_up: W::Mat,
    /// `[hidden, intermediate]`
    pub(crate) w_down: W::Mat,
}

/// A Mixtral-style sparse MLP: the router and the experts.
pub(crate) struct Moe<W: Weights> {
    /// `[experts, hidden]`: its output scores pick the experts.
    pub(crate) router: W::Mat,
    pub(crate) experts: Vec<Expert<W>>,
    pub(crate) top_k: usize,
}

/// The MLP of a layer.
pub(crate) enum Mlp<W: Weights> {
    Dense(Expert<W>),
    Moe(Moe<W>),
}

/// One decoder layer, its projections fused (`[wq; wk; wv]`, `[w_gate; w_up]`).
pub(crate) struct Layer<W: Weights> {
    pub(crate) attn_norm: W::Vec,
    /// `[(num_heads + 2 * num_kv_heads) * head_dim, hidden]`
    pub(crate) wqkv: W::Mat,
    /// `[q | k | v]` bias of the fused projection (Qwen2).
    pub(crate) qkv_bias: Option<W::Vec>,
    /// Per-head norm weights of Q and K, `[head_dim]` each (Qwen3).
    pub(crate) qk_norm: Option<(W::Vec, W::Vec)>,
    /// `[hidden, num_heads * head_dim]`
    pub(crate) wo: W::Mat,
    /// Norm of the attention output before its residual add (Gemma 2).
    pub(crate) post_attn_norm: Option<W::Vec>,
    /// The MLP's input norm.
    pub(crate) ffn_norm: W::Vec,
    pub(crate) mlp: Mlp<W>,
    /// Norm of the MLP output before its residual add (Gemma 2).
    pub(crate) post_ffn_norm: Option<W::Vec>,
}

/// A decoder model's weights on one device, with what its forward pass needs of the
/// config.
pub(crate) struct Decoder<W: Weights> {
    pub(crate) config: LlamaConfig,
    /// The distinct attention kinds of the layers and each layer's kind: layer `l`
    /// runs on backend `attn[kind_of_layer[l]]`.
    pub(crate) attn_kinds: Vec<AttnKind>,
    pub(crate) kind_of_layer: Vec<usize>,
    pub(crate) embed: W::Embed,
    pub(crate) layers: Vec<Layer<W>>,
    pub(crate) norm: W::Vec,
    /// `None`: tied to `embed`.
    pub(crate) lm_head: Option<W::Mat>,
    pub(crate) rope: W::Rope,
    /// Gemma's `sqrt(hidden)` on the embeddings, 1 otherwise.
    pub(crate) embed_scale: f32,
}

impl<W: Weights> Decoder<W> {
    /// The heads and dims of the fused QKV rows.
    pub(crate) fn rope_shape(&self) -> RopeShape {
        let c = &self.config;
        RopeShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        }
    }

    /// The MLP's dims and activation.
    pub(crate) fn mlp_dims(&self) -> MlpDims {
        let c = &self.config;
        MlpDims {
            hidden: c.hidden_size,
            inter: c.intermediate_size,
            act: c.arch.activation,
        }
    }
}

/// `rows` rows of `width` elements: the part of a buffer an op reads or writes (a
/// step uses the first rows of buffers that may be larger).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dims {
    pub(crate) rows: usize,
    pub(crate) width: usize,
}

impl Dims {
    pub(crate) fn new(rows: usize, width: usize) -> Self {
        Dims { rows, width }
    }

    pub(crate) fn len(&self) -> usize {
        self.rows * self.width
    }
}

/// A gated MLP's dims.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MlpDims {
    pub(crate) hidden: usize,
    pub(crate) inter: usize,
    pub(crate) act: Activation,
}

/// What RoPE and the K/V write of one layer take beside the QKV rows.
pub(crate) struct RopeIn<'a, W: Weights> {
    pub(crate) rope: &'a W::Rope,
    /// The fused Q/K/V bias, added before RoPE.
    pub(crate) bias: Option<&'a W::Vec>,
    pub(crate) shape: RopeShape,
    /// Tokens.
    pub(crate) n: usize,
}

/// The operations of a decoder forward pass on one device, for one step: every
/// method reads the step's inputs (ids, positions, slots, logits rows) from the
/// implementation, which was built for that step. Outputs are sized by the op (a
/// CPU buffer grows; a device buffer must already hold them: an error otherwise).
pub(crate) trait Ops {
    type W: Weights;
    /// An activation buffer.
    type Buf;

    /// Whether the last layer runs on the logits rows alone when the step needs
    /// fewer rows than it has tokens (a prompt's last layer is then one row per
    /// request): always on the CPU; on a device when its LM-head buffers hold the
    /// logits rows (a graph-captured step samples every row, so never prunes).
    fn prunes_last_layer(&self) -> bool;

    /// `out[t] = scale * table[input_ids[t]]`, rows of `hidden`.
    fn embed(
        &mut self,
        table: &<Self::W as Weights>::Embed,
        scale: f32,
        d: Dims,
        out: &mut Self::Buf,
    ) -> Result<(), ModelError>;

    /// `out = rms_norm(x) * w`.
    fn rms_norm(
        &mut self,
        x: &Self::Buf,
        w: &<Self::W as Weights>::Vec,
        eps: f32,
        d: Dims,
        out: &mut Self::Buf,
    ) -> Result<(), ModelError>;

    /// `h += x`, then `out = rms_norm(h) * w`.
    fn add_rms_norm(
        &mut self,
        h: &mut Self::Buf,
        x: &Self::Buf,
        w: &<Self::W as Weights>::Vec,
        eps: f32,
        d: Dims,
        out: &mut Self::Buf,
    ) -> Result<(), ModelError>;

    /// `out[m, n] = x[m, k] · wᵀ`; `d` is `(m, k)`, `n` the output width.
    fn linear(
        &mut self,
        x: &Self::Buf,
        w: &<Self::W as Weights>::Mat,
        d: Dims,
        n: usize,
        out: &mut Self::Buf,
    ) -> Result<(), ModelError>;

    /// `x[t] += bias` on every row (a bias that must come before the Q/K norms).
    fn add_bias(
        &mut self,
        x: &mut Self::Buf,
        bias: &<Self::W as Weights>::Vec,
        d: Dims,
    ) -> Result<(), ModelError>;

    /// Per-head RMSNorm in place on the q and k heads of the fused QKV rows.
    fn qk_norm(
        &mut self,
        qkv: &mut Self::Buf,
        w: (&<Self::W as Weights>::Vec, &<Self::W as Weights>::Vec),
        eps: f32,
        shape: RopeShape,
        n: usize,
    ) -> Result<(), ModelError>;

    /// RoPE on the fused QKV rows (plus the bias): rotated q into `q`, rotated k and
    /// v into this layer's pools at the step's slots (through `backend`'s writer or
    /// the device's own kernel).
    fn rope_write_kv<A: AttentionBackend + ?Sized>(
        &mut self,
        qkv: &Self::Buf,
        r: RopeIn<'_, Self::W>,
        pools: &mut LayerKv,
        backend: &mut A,
        q: &mut Self::Buf,
    ) -> Result<(), ModelError>;

    /// Attention of the step's `n` queries on `backend` (planned for the step) over
    /// this layer's pools, into `out` `[n, num_heads * head_dim]`.
    fn attend<A: AttentionBackend + ?Sized>(
        &mut self,
        q: &Self::Buf,
        pools: &LayerKv,
        backend: &mut A,
        shape: RopeShape,
        n: usize,
        out: &mut Self::Buf,
    ) -> Result<(), ModelError>;

    /// `out[t] = act(gate_up[t][..inter]) * gate_up[t][inter..]`; `d` is `(rows, inter)`.
    fn gated_act(
        &mut self,
        act: Activation,
        gate_up: &Self::Buf,
        d: Dims,
        out: &mut Self::Buf,
    ) -> Result<(), ModelError>;

    /// The sparse MLP of `t.xn` (`m` rows) into `t.proj`, `t`'s other buffers free
    /// to use.
    fn moe(
        &mut self,
        moe: &Moe<Self::W>,
        t: &mut Tail<Self::Buf>,
        m: usize,
        dims: MlpDims,
    ) -> Result<(), ModelError>;

    /// `out[i] = x[logits_rows[first + i]]` for `count` rows of `width`.
    fn gather_rows(
        &mut self,
        x: &Self::Buf,
        width: usize,
        first: usize,
        count: usize,
        out: &mut Self::Buf,
    ) -> Result<(), ModelError>;

    /// `x = cap * tanh(x / cap)` on the first `len` elements.
    fn soft_cap(&mut self, x: &mut Self::Buf, len: usize, cap: f32) -> Result<(), ModelError>;
}

/// The forward error of a model whose layers got the wrong number of backends.
pub(crate) fn check_backends(kinds: &[AttnKind], got: usize) -> Result<(), ModelError> {
    if got == kinds.len() {
        return Ok(());
    }
    Err(ModelError::Forward {
        message: format!(
            "the model's layers need {} attention backends (one per kind: {kinds:?}), got {got}",
            kinds.len()
        ),
    })
}
