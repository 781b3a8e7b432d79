//! [`DeviceLlama`]: the decoder (`crate::decoder`, the forward pass every device
//! runs) with its weights on a device (see the `device` module docs): the step's
//! checks and inputs, the launch sequence through [`DeviceOps`], and the hand-back
//! of logits or ids.

use super::bufs::DeviceScratch;
use super::bufs::{config_err, dev, rows_ref};
use super::ops::DeviceOps;
use super::weights::{Dev, DevPlace};
use crate::config::LlamaConfig;
use crate::decoder::Decoder;
use crate::decoder::{build_decoder, check_backends, check_step_inputs, forward_layers, head};
use crate::error::ModelError;
use crate::weights::LlamaWeights;
use pagoda_core::{
    AttentionBackend, AttentionConfig, DType, DeviceRuntime, KvCache, ModelOps, StepBatch,
    StepInputs, MOE_MAX_TOP_K,
};
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
    pub(super) dec: Decoder<Dev>,
    pub(super) dtype: DType,
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
        progress: impl FnMut(usize, usize),
    ) -> Result<Self, ModelError> {
        if let Some(why) = device_unsupported(&config) {
            return Err(config_err(why));
        }
        let mut place = DevPlace {
            rt,
            dtype,
            bytes: 0,
            progress,
        };
        let dec = build_decoder(config, weights, &mut place)?;
        Ok(DeviceLlama {
            dec,
            dtype,
            weight_bytes: place.bytes,
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.dec.config
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
        let mut v = self.dec.config.attention_configs(block_size);
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
        s.reserve(ops.runtime().as_ref(), &self.dec.config, self.dtype, n)?;
        self.begin_step(ops, step, s)?;
        self.launch(ops, n, r, attn, kv, s)?;
        self.finish(ops, (n, r), out, s)
    }

    /// The checks of a step's inputs (before anything reaches the device).
    pub(super) fn check_step(
        &self,
        step: &StepBatch<'_>,
        num_backends: usize,
        kv: &KvCache,
    ) -> Result<(), ModelError> {
        let c = &self.dec.config;
        check_backends(&self.dec.attn_kinds, num_backends)?;
        check_step_inputs(
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
        let mut ops = DeviceOps {
            ops,
            moe: &mut s.moe,
            n,
            prune: r < n && r <= s.rows,
        };
        let pruned = forward_layers(&self.dec, &mut ops, (n, r), attn, kv, &mut s.bufs)?;
        // The first chunk of logits rows (all of them, unless a step asks for more
        // than the buffers hold: prompt log-probabilities); `finish` does the rest.
        match r.min(s.rows) {
            0 => Ok(()),
            count => head(&self.dec, &mut ops, (0, count), pruned, &mut s.bufs),
        }
    }

    /// Hands the step's `r` logits rows to the host: copied, or reduced to their greedy
    /// ids on the device; chunk by chunk of the buffers' rows when `r` exceeds them (the
    /// first chunk was computed by `launch`).
    pub(super) fn finish(
        &self,
        ops: &mut dyn ModelOps,
        (n, r): (usize, usize),
        mut out: DeviceOutput<'_>,
        s: &mut DeviceScratch,
    ) -> Result<(), ModelError> {
        let vocab = self.dec.config.vocab_size;
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
                let mut ops = DeviceOps {
                    ops: &mut *ops,
                    moe: &mut s.moe,
                    n,
                    // More rows than one chunk: `launch` ran every row to the end.
                    prune: false,
                };
                head(&self.dec, &mut ops, (first, count), false, &mut s.bufs)?;
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
