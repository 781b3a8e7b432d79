//! [`DeviceLlama`]: the device forward's model (see the `device` module docs): its
//! weights on the device, the step's checks and inputs, the launch sequence (the
//! layers' launches are `layer.rs`'), the LM head and the hand-back of logits or ids.

use super::bufs::DeviceScratch;
use super::bufs::{config_err, dev, residual_input, rows, rows_ref, upload};
use super::weights::DeviceLayer;
use crate::arch::{Activation, AttnKind};
use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::layer::{check_mat, check_vec};
use crate::weights::LlamaWeights;
use pagoda_core::{
    AttentionBackend, AttentionConfig, DType, DeviceRuntime, GatedAct, KvCache, ModelOps,
    StepBatch, StepInputs, Storage, MOE_MAX_TOP_K,
};
use pagoda_kernels::{Llama3Scaling, RopeCache};
use std::ops::DerefMut;

/// What a device step runs on, beside the model and the step's inputs: the device's
/// model kernels, one planned backend per attention kind (in the order of
/// [`DeviceLlama::attention_configs`]), the KV cache and the activation buffers.
/// The runner builds it once per step from what it owns (and a graph capture from
/// the same parts, which must then outlive the graphs unmoved).
pub struct DeviceRun<'a, B> {
    pub ops: &'a mut dyn ModelOps,
    pub attn: &'a mut [B],
    pub kv: &'a mut KvCache,
    pub scratch: &'a mut DeviceScratch,
}

impl<B> DeviceRun<'_, B> {
    /// Its parts, reborrowed: the kernels, the backends, the KV cache, the scratch.
    pub fn parts(
        &mut self,
    ) -> (
        &mut dyn ModelOps,
        &mut [B],
        &mut KvCache,
        &mut DeviceScratch,
    ) {
        (
            &mut *self.ops,
            &mut *self.attn,
            &mut *self.kv,
            &mut *self.scratch,
        )
    }
}

/// A decoder model whose weights live on a device.
pub struct DeviceLlama {
    pub(super) config: LlamaConfig,
    pub(super) dtype: DType,
    pub(super) attn_kinds: Vec<AttnKind>,
    pub(super) kind_of_layer: Vec<usize>,
    /// `[vocab, hidden]`
    pub(super) embed: Storage,
    /// `None`: tied to `embed`.
    pub(super) lm_head: Option<Storage>,
    pub(super) layers: Vec<DeviceLayer>,
    pub(super) norm: Storage,
    /// RoPE tables `[max_pos, head_dim / 2]` f32.
    pub(super) cos: Storage,
    pub(super) sin: Storage,
    pub(super) act: GatedAct,
    pub(super) embed_scale: f32,
    pub(super) weight_bytes: usize,
}

/// Why `config` cannot run on a device, if it cannot (see the module docs).
pub fn device_unsupported(config: &LlamaConfig) -> Option<String> {
    let a = &config.arch;
    let mut missing = Vec::new();
    if a.qk_norm && a.qkv_bias {
        missing.push("Q/K norms together with a Q/K/V bias".to_string());
    }
    if let Some(m) = a.moe.filter(|m| m.top_k > MOE_MAX_TOP_K) {
        missing.push(format!(
            "MoE routing to {} experts per token (the routing kernel keeps at most \
             {MOE_MAX_TOP_K})",
            m.top_k
        ));
    }
    if missing.is_empty() {
        None
    } else {
        Some(format!(
            "{} needs {}, which the device forward does not run (use --device cpu)",
            a.architecture.hf_name(),
            missing.join(", ")
        ))
    }
}

impl DeviceLlama {
    /// Checks the weights against `config` and uploads them to `rt`'s device as
    /// `dtype` (norms, biases and RoPE tables as f32). `progress` is called after
    /// each layer with (layers done, layers).
    pub fn new(
        config: LlamaConfig,
        weights: LlamaWeights,
        dtype: DType,
        rt: &dyn DeviceRuntime,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Self, ModelError> {
        crate::llama::validate_config(&config)?;
        if let Some(why) = device_unsupported(&config) {
            return Err(config_err(why));
        }
        let c = &config;
        let (hidden, hd) = (c.hidden_size, c.head_dim);
        check_mat("token_embd".into(), &weights.embed, c.vocab_size, hidden)?;
        check_vec("output_norm".into(), &weights.norm, hidden)?;
        if weights.layers.len() != c.num_layers {
            return Err(config_err(format!(
                "{} layers in weights, config says {}",
                weights.layers.len(),
                c.num_layers
            )));
        }
        let mut weight_bytes = 0;
        let mut layers = Vec::with_capacity(c.num_layers);
        for (i, l) in weights.layers.iter().enumerate() {
            layers.push(DeviceLayer::upload(i, l, c, dtype, rt, &mut weight_bytes)?);
            progress(i + 1, c.num_layers);
        }
        let mut count = |s: Storage| {
            weight_bytes += s.size_bytes();
            s
        };
        let embed = count(upload(
            rt,
            dtype,
            &[c.vocab_size, hidden],
            &weights.embed.values()?,
        )?);
        let lm_head = match &weights.lm_head {
            Some(h) => {
                check_mat("lm_head".into(), h, c.vocab_size, hidden)?;
                Some(count(upload(
                    rt,
                    dtype,
                    &[c.vocab_size, hidden],
                    &h.values()?,
                )?))
            }
            None => None,
        };
        let norm = count(upload(rt, DType::F32, &[hidden], &weights.norm)?);
        let scaling = c.rope_scaling.map(|s| Llama3Scaling {
            factor: s.factor,
            low_freq_factor: s.low_freq_factor,
            high_freq_factor: s.high_freq_factor,
            original_max_position_embeddings: s.original_max_position_embeddings,
        });
        let rope = RopeCache::with_freq_factors(
            hd,
            c.max_position_embeddings,
            c.rope_theta,
            scaling.as_ref(),
            c.rope_freq_factors.as_deref(),
        )
        .map_err(|e| config_err(format!("rope: {e}")))?;
        let (cos_h, sin_h) = rope.tables();
        let dims = [c.max_position_embeddings, hd / 2];
        let cos = count(upload(rt, DType::F32, &dims, cos_h)?);
        let sin = count(upload(rt, DType::F32, &dims, sin_h)?);
        let act = match c.arch.activation {
            Activation::Silu => GatedAct::Silu,
            Activation::GeluTanh => GatedAct::GeluTanh,
        };
        let embed_scale = if c.arch.scale_embedding {
            (hidden as f32).sqrt()
        } else {
            1.0
        };
        let (attn_kinds, kind_of_layer) = config.attention_kinds();
        Ok(DeviceLlama {
            config,
            dtype,
            attn_kinds,
            kind_of_layer,
            embed,
            lm_head,
            layers,
            norm,
            cos,
            sin,
            act,
            embed_scale,
            weight_bytes,
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The compute dtype (weights and activations).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of device memory the weights take.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// The attention configurations the layers need, one per distinct kind, with
    /// queries of the compute dtype (device and KV dtype are the engine's to set).
    pub fn attention_configs(&self, block_size: usize) -> Vec<AttentionConfig> {
        let mut v = self.config.attention_configs(block_size);
        for c in &mut v {
            c.q_dtype = self.dtype;
        }
        v
    }

    /// One step on the device: `out` gets the logits rows (`[logits_rows.len(), vocab]`
    /// f32 on the host) or their greedy ids. The step's inputs are the CPU decoder's
    /// ([`crate::llama::Llama::forward_kinds`]), the backends already planned.
    pub fn forward_kinds<B, A>(
        &self,
        step: &StepBatch<'_>,
        run: &mut DeviceRun<'_, B>,
        mut out: DeviceOutput<'_>,
    ) -> Result<(), ModelError>
    where
        B: DerefMut<Target = A>,
        A: AttentionBackend + ?Sized,
    {
        out.clear();
        let (ops, attn, kv, s) = run.parts();
        self.check_step(step, attn.len(), kv)?;
        let (n, r) = (step.num_tokens(), step.logits_rows.len());
        if n == 0 {
            return Ok(());
        }
        s.reserve(ops.runtime().as_ref(), &self.config, self.dtype, n)?;
        self.begin_step(ops, step, s)?;
        self.launch(ops, n, r, attn, kv, s)?;
        self.finish(ops, n, r, out, s)
    }

    /// The checks of a step's inputs (before anything reaches the device).
    pub(super) fn check_step(
        &self,
        step: &StepBatch<'_>,
        num_backends: usize,
        kv: &KvCache,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        if num_backends != self.attn_kinds.len() {
            return Err(ModelError::Forward {
                message: format!(
                    "the model's layers need {} attention backends, got {num_backends}",
                    self.attn_kinds.len(),
                ),
            });
        }
        crate::llama::check_step_inputs(
            c,
            c.max_position_embeddings,
            step.input_ids,
            step.positions,
            step.batch,
            kv,
            step.logits_rows,
        )
    }

    /// Hands the step's integer inputs to the device (one copy).
    pub(super) fn begin_step(
        &self,
        ops: &mut dyn ModelOps,
        step: &StepBatch<'_>,
        s: &mut DeviceScratch,
    ) -> Result<(), ModelError> {
        s.rows_u32.clear();
        s.rows_u32
            .extend(step.logits_rows.iter().map(|&x| x as u32));
        ops.begin_step(&StepInputs {
            input_ids: step.input_ids,
            positions: step.positions,
            slot_mapping: step.batch.slot_mapping(),
            logits_rows: &s.rows_u32,
        })
        .map_err(dev)
    }

    /// Every kernel of a step of `n` tokens and `r` logits rows, the step's inputs
    /// already on the device and the backends planned: the launch sequence a graph
    /// captures. Waits for nothing and allocates nothing.
    pub(super) fn launch<B, A>(
        &self,
        ops: &mut dyn ModelOps,
        n: usize,
        r: usize,
        attn: &mut [B],
        kv: &mut KvCache,
        s: &mut DeviceScratch,
    ) -> Result<(), ModelError>
    where
        B: DerefMut<Target = A>,
        A: AttentionBackend + ?Sized,
    {
        let c = &self.config;
        let (hidden, eps) = (c.hidden_size, c.rms_norm_eps);
        let b = &mut s.bufs;
        ops.embed(
            self.embed.view(),
            self.embed_scale,
            rows(&mut b.h, n, hidden)?,
        )
        .map_err(dev)?;
        if let Some(first) = self.layers.first() {
            ops.rms_norm(
                rows_ref(&b.h, n, hidden)?,
                first.attn_norm.view(),
                0.0,
                eps,
                rows(&mut b.xn, n, hidden)?,
            )
            .map_err(dev)?;
        }
        for l in 0..self.layers.len() {
            self.layer(ops, l, n, attn, kv, b)?;
        }
        // The first chunk of logits rows (all of them, unless a step asks for more
        // than the buffers hold: prompt log-probabilities); `finish` does the rest.
        self.head(ops, n, 0, r.min(s.rows), s)
    }

    /// The last residual add, the final norm and the LM head for the step's logits rows
    /// `first..first + count` (`count <= s.rows`), into the first `count` rows of the
    /// logits buffer.
    fn head(
        &self,
        ops: &mut dyn ModelOps,
        n: usize,
        first: usize,
        count: usize,
        s: &mut DeviceScratch,
    ) -> Result<(), ModelError> {
        if count == 0 {
            return Ok(());
        }
        let c = &self.config;
        let (hidden, eps, vocab) = (c.hidden_size, c.rms_norm_eps, c.vocab_size);
        let b = &mut s.bufs;
        ops.gather_logits_rows(
            rows_ref(&b.h, n, hidden)?,
            hidden,
            first,
            rows(&mut b.sel_h, count, hidden)?,
        )
        .map_err(dev)?;
        if self.layers.is_empty() {
            ops.rms_norm(
                rows_ref(&b.sel_h, count, hidden)?,
                self.norm.view(),
                0.0,
                eps,
                rows(&mut b.sel_n, count, hidden)?,
            )
            .map_err(dev)?;
        } else {
            let mlp_out = residual_input(&b.proj, &b.post, c.arch.post_norms)?;
            ops.gather_logits_rows(
                rows_ref(mlp_out, n, hidden)?,
                hidden,
                first,
                rows(&mut b.sel_p, count, hidden)?,
            )
            .map_err(dev)?;
            ops.add_rms_norm(
                rows(&mut b.sel_h, count, hidden)?,
                rows_ref(&b.sel_p, count, hidden)?,
                self.norm.view(),
                0.0,
                eps,
                rows(&mut b.sel_n, count, hidden)?,
            )
            .map_err(dev)?;
        }
        let lm_head = self.lm_head.as_ref().unwrap_or(&self.embed);
        ops.linear(
            rows_ref(&b.sel_n, count, hidden)?,
            lm_head.view(),
            rows(&mut b.logits, count, vocab)?,
        )
        .map_err(dev)?;
        match c.arch.final_logit_softcap {
            Some(cap) => ops
                .soft_cap(rows(&mut b.logits, count, vocab)?, cap)
                .map_err(dev),
            None => Ok(()),
        }
    }

    /// Hands the step's `r` logits rows to the host: copied, or reduced to their greedy
    /// ids on the device; chunk by chunk of the buffers' rows when `r` exceeds them (the
    /// first chunk was computed by `launch`).
    pub(super) fn finish(
        &self,
        ops: &mut dyn ModelOps,
        n: usize,
        r: usize,
        mut out: DeviceOutput<'_>,
        s: &mut DeviceScratch,
    ) -> Result<(), ModelError> {
        let vocab = self.config.vocab_size;
        let cap = s.rows;
        match &mut out {
            DeviceOutput::Logits(v) => {
                v.clear();
                v.resize(r * vocab, 0.0);
            }
            DeviceOutput::Greedy(ids) => {
                ids.clear();
                ids.resize(r, 0);
            }
        }
        let mut first = 0;
        while first < r {
            let count = cap.min(r - first);
            if first > 0 {
                self.head(ops, n, first, count, s)?;
            }
            let logits = rows_ref(&s.bufs.logits, count, vocab)?;
            match &mut out {
                DeviceOutput::Logits(v) => {
                    ops.download_f32(logits, &mut v[first * vocab..(first + count) * vocab])
                }
                DeviceOutput::Greedy(ids) => ops.argmax(logits, &mut ids[first..first + count]),
            }
            .map_err(dev)?;
            first += count;
        }
        Ok(())
    }
}

/// What a device step hands back to the host for its logits rows.
#[derive(Debug)]
pub enum DeviceOutput<'a> {
    /// `[rows, vocab]` f32 logits, copied once: the CPU sampler's input (any
    /// sampling parameters, log-probabilities, grammars).
    Logits(&'a mut Vec<f32>),
    /// Each row's greedy id (first maximum, NaN skipped), computed on the device:
    /// `rows` ids come back instead of `rows x vocab` floats.
    Greedy(&'a mut Vec<u32>),
}

impl DeviceOutput<'_> {
    fn clear(&mut self) {
        match self {
            DeviceOutput::Logits(v) => v.clear(),
            DeviceOutput::Greedy(v) => v.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{Architecture, MoeConfig};

    fn config() -> LlamaConfig {
        LlamaConfig {
            vocab_size: 16,
            hidden_size: 8,
            intermediate_size: 8,
            num_layers: 1,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 4,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            rope_scaling: None,
            rope_freq_factors: None,
            max_position_embeddings: 32,
            tie_word_embeddings: true,
            arch: Default::default(),
        }
    }

    /// Every family's switches run on a device; only the two combinations the kernels
    /// cannot express are refused, with a reason naming them.
    #[test]
    fn only_what_the_kernels_cannot_express_is_refused() {
        let mut c = config();
        c.arch.qk_norm = true;
        c.arch.post_norms = true;
        c.arch.attn_logit_softcap = Some(50.0);
        c.arch.final_logit_softcap = Some(30.0);
        c.arch.moe = Some(MoeConfig {
            num_experts: 64,
            top_k: MOE_MAX_TOP_K,
        });
        assert_eq!(device_unsupported(&c), None);
        c.arch.architecture = Architecture::Qwen3;
        c.arch.qkv_bias = true;
        let why = device_unsupported(&c).unwrap();
        assert!(
            why.contains("Q/K norms together with a Q/K/V bias"),
            "{why}"
        );
        c.arch.qkv_bias = false;
        c.arch.moe = Some(MoeConfig {
            num_experts: 64,
            top_k: MOE_MAX_TOP_K + 1,
        });
        let why = device_unsupported(&c).unwrap();
        assert!(
            why.contains("33 experts per token") && why.contains("--device cpu"),
            "{why}"
        );
    }
}
