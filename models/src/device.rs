//! The decoder forward pass on a device (`cuda:N`, or `emu` in tests): weights
//! uploaded once in the compute dtype (bf16 by default, f16 or f32), every op a
//! kernel of core's [`ModelOps`] (so this crate knows no CUDA), attention through
//! the planned backends on the device's KV cache.
//!
//! Per step, vLLM's sequence of fused kernels: the embedding gather into the f32
//! residual stream; RMSNorm (fused with the residual add after the first layer);
//! the fused QKV GEMM; RoPE fused with writing K/V into the paged cache by slot
//! mapping; attention; o_proj; add + norm; the fused gate/up GEMM; SiLU-mul; down;
//! and, after the last layer, the residual add, final norm and LM head on the rows
//! whose logits are needed only. The residual stream stays f32 (as the CPU path), the
//! activations that feed GEMMs are of the compute dtype, the logits f32.
//!
//! Buffers ([`DeviceScratch`]) grow to the largest step seen and are reused, so a
//! warm step allocates no device memory.
//!
//! Families: what Llama, Mistral and Qwen2 need (Q/K/V biases, sliding windows in the
//! backend, tied embeddings, Llama-3 RoPE scaling); Q/K norms, post-norms, soft caps
//! and MoE layers are refused at construction with the reason.

use crate::arch::{Activation, AttnKind};
use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::layer::{check_mat, check_vec};
use crate::weights::{LlamaWeights, Mat};
use pagoda_core::{
    AttentionBackend, AttentionConfig, BatchDescriptor, CoreError, DType, DeviceRuntime, GatedAct,
    HostSlice, KvCache, LayerIo, ModelOps, RopeShape, Shape, StepInputs, Storage, TensorMut,
    TensorRef,
};
use pagoda_kernels::{Llama3Scaling, RopeCache};
use std::ops::DerefMut;
use std::sync::Arc;

mod graphs;
pub use graphs::{capture_sizes, DecodeGraphs};

fn dev(e: CoreError) -> ModelError {
    ModelError::Forward {
        message: e.to_string(),
    }
}

fn config_err(message: String) -> ModelError {
    ModelError::Config { message }
}

/// Host f32 values as `dtype` elements, uploaded into a new buffer of `shape`.
fn upload(
    rt: &dyn DeviceRuntime,
    dtype: DType,
    dims: &[usize],
    data: &[f32],
) -> Result<Storage, ModelError> {
    let shape = Shape::new(dims).map_err(dev)?;
    let mut s = rt.alloc_zeroed(dtype, shape).map_err(dev)?;
    match dtype {
        DType::F32 => rt.upload(s.view_mut(), HostSlice::F32(data)),
        DType::BF16 => {
            let v: Vec<half::bf16> = data.iter().map(|&x| half::bf16::from_f32(x)).collect();
            rt.upload(s.view_mut(), HostSlice::BF16(&v))
        }
        DType::F16 => {
            let v: Vec<half::f16> = data.iter().map(|&x| half::f16::from_f32(x)).collect();
            rt.upload(s.view_mut(), HostSlice::F16(&v))
        }
        DType::F8E4M3 => Err(pagoda_core::CoreError::UnsupportedDType {
            what: "device model weights",
            dtype,
            reason: "fp8 is a KV cache dtype only",
        }),
    }
    .map_err(dev)?;
    Ok(s)
}

/// Rows of several matrices stacked (`[wq; wk; wv]`, `[w_gate; w_up]`) as one.
fn stack(rt: &dyn DeviceRuntime, dtype: DType, mats: &[&Mat]) -> Result<Storage, ModelError> {
    let cols = mats[0].cols;
    let rows: usize = mats.iter().map(|m| m.rows).sum();
    let mut data = Vec::with_capacity(rows * cols);
    for m in mats {
        data.extend_from_slice(&m.values()?);
    }
    upload(rt, dtype, &[rows, cols], &data)
}

/// One layer's weights on the device.
struct DeviceLayer {
    attn_norm: Storage,
    /// `[q + 2 kv, hidden]`
    wqkv: Storage,
    /// `[q + 2 kv]` f32 (Qwen2).
    qkv_bias: Option<Storage>,
    /// `[hidden, q]`
    wo: Storage,
    ffn_norm: Storage,
    /// `[2 inter, hidden]`
    w_gate_up: Storage,
    /// `[hidden, inter]`
    w_down: Storage,
}

/// A decoder model whose weights live on a device.
pub struct DeviceLlama {
    config: LlamaConfig,
    dtype: DType,
    attn_kinds: Vec<AttnKind>,
    kind_of_layer: Vec<usize>,
    /// `[vocab, hidden]`
    embed: Storage,
    /// `None`: tied to `embed`.
    lm_head: Option<Storage>,
    layers: Vec<DeviceLayer>,
    norm: Storage,
    /// RoPE tables `[max_pos, head_dim / 2]` f32.
    cos: Storage,
    sin: Storage,
    act: GatedAct,
    embed_scale: f32,
    weight_bytes: usize,
}

/// Why `config` cannot run on a device yet, if it cannot.
pub fn device_unsupported(config: &LlamaConfig) -> Option<String> {
    let a = &config.arch;
    let mut missing = Vec::new();
    if a.qk_norm {
        missing.push("Q/K norms");
    }
    if a.post_norms {
        missing.push("post-norms");
    }
    if a.attn_logit_softcap.is_some() || a.final_logit_softcap.is_some() {
        missing.push("logit soft caps");
    }
    if a.moe.is_some() {
        missing.push("MoE layers");
    }
    if missing.is_empty() {
        None
    } else {
        Some(format!(
            "{} needs {}, which the device forward does not run yet (use --device cpu)",
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
        let (q_dim, kv_dim, inter) = (c.num_heads * hd, c.num_kv_heads * hd, c.intermediate_size);
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
        let mut count = |s: Storage| {
            weight_bytes += s.size_bytes();
            s
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        for (i, l) in weights.layers.iter().enumerate() {
            let name = |w: &str| format!("blk.{i}.{w}");
            check_vec(name("attn_norm"), &l.attn_norm, hidden)?;
            check_vec(name("ffn_norm"), &l.ffn_norm, hidden)?;
            check_mat(name("attn_q"), &l.wq, q_dim, hidden)?;
            check_mat(name("attn_k"), &l.wk, kv_dim, hidden)?;
            check_mat(name("attn_v"), &l.wv, kv_dim, hidden)?;
            check_mat(name("attn_output"), &l.wo, hidden, q_dim)?;
            check_mat(name("ffn_gate"), &l.w_gate, inter, hidden)?;
            check_mat(name("ffn_up"), &l.w_up, inter, hidden)?;
            check_mat(name("ffn_down"), &l.w_down, hidden, inter)?;
            let e = &l.extra;
            let qkv_bias = match (&e.q_bias, &e.k_bias, &e.v_bias) {
                (None, None, None) => None,
                (q, k, v) => {
                    let mut b = Vec::with_capacity(q_dim + 2 * kv_dim);
                    for (part, len) in [(q, q_dim), (k, kv_dim), (v, kv_dim)] {
                        match part {
                            Some(x) => {
                                check_vec(name("attn_bias"), x, len)?;
                                b.extend_from_slice(x);
                            }
                            None => b.resize(b.len() + len, 0.0),
                        }
                    }
                    Some(count(upload(rt, DType::F32, &[b.len()], &b)?))
                }
            };
            layers.push(DeviceLayer {
                attn_norm: count(upload(rt, DType::F32, &[hidden], &l.attn_norm)?),
                wqkv: count(stack(rt, dtype, &[&l.wq, &l.wk, &l.wv])?),
                qkv_bias,
                wo: count(upload(rt, dtype, &[hidden, q_dim], &l.wo.values()?)?),
                ffn_norm: count(upload(rt, DType::F32, &[hidden], &l.ffn_norm)?),
                w_gate_up: count(stack(rt, dtype, &[&l.w_gate, &l.w_up])?),
                w_down: count(upload(rt, dtype, &[hidden, inter], &l.w_down.values()?)?),
            });
            progress(i + 1, c.num_layers);
        }
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
    /// f32 on the host) or their greedy ids. One planned backend per attention kind, as
    /// [`crate::llama::Llama::forward_kinds`].
    #[allow(clippy::too_many_arguments)]
    pub fn forward_kinds<B, A>(
        &self,
        ops: &mut dyn ModelOps,
        input_ids: &[u32],
        positions: &[u32],
        batch: &BatchDescriptor,
        attn: &mut [B],
        kv: &mut KvCache,
        logits_rows: &[usize],
        mut out: DeviceOutput<'_>,
        s: &mut DeviceScratch,
    ) -> Result<(), ModelError>
    where
        B: DerefMut<Target = A>,
        A: AttentionBackend + ?Sized,
    {
        out.clear();
        self.check_step(input_ids, positions, batch, attn.len(), kv, logits_rows)?;
        let (n, r) = (input_ids.len(), logits_rows.len());
        if n == 0 {
            return Ok(());
        }
        s.reserve(ops.runtime().as_ref(), &self.config, self.dtype, n)?;
        self.begin_step(
            ops,
            input_ids,
            positions,
            batch.slot_mapping(),
            logits_rows,
            s,
        )?;
        self.launch(ops, n, r, attn, kv, s)?;
        self.finish(ops, n, r, out, s)
    }

    /// The checks of a step's inputs (before anything reaches the device).
    fn check_step(
        &self,
        input_ids: &[u32],
        positions: &[u32],
        batch: &BatchDescriptor,
        num_backends: usize,
        kv: &KvCache,
        logits_rows: &[usize],
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
            input_ids,
            positions,
            batch,
            kv,
            logits_rows,
        )
    }

    /// Hands the step's integer inputs to the device (one copy).
    fn begin_step(
        &self,
        ops: &mut dyn ModelOps,
        input_ids: &[u32],
        positions: &[u32],
        slot_mapping: &[i64],
        logits_rows: &[usize],
        s: &mut DeviceScratch,
    ) -> Result<(), ModelError> {
        s.rows_u32.clear();
        s.rows_u32.extend(logits_rows.iter().map(|&x| x as u32));
        ops.begin_step(&StepInputs {
            input_ids,
            positions,
            slot_mapping,
            logits_rows: &s.rows_u32,
        })
        .map_err(dev)
    }

    /// Every kernel of a step of `n` tokens and `r` logits rows, the step's inputs
    /// already on the device and the backends planned: the launch sequence a graph
    /// captures. Waits for nothing and allocates nothing.
    fn launch<B, A>(
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
        let (hidden, hd, eps) = (c.hidden_size, c.head_dim, c.rms_norm_eps);
        let q_dim = c.num_heads * hd;
        let inter = c.intermediate_size;
        let rope = RopeShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: hd,
        };
        let b = &mut s.bufs;
        ops.embed(
            self.embed.view(),
            self.embed_scale,
            rows(&mut b.h, n, hidden)?,
        )
        .map_err(dev)?;
        let last = self.layers.len().saturating_sub(1);
        for (l, layer) in self.layers.iter().enumerate() {
            if l == 0 {
                ops.rms_norm(
                    rows_ref(&b.h, n, hidden)?,
                    layer.attn_norm.view(),
                    0.0,
                    eps,
                    rows(&mut b.xn, n, hidden)?,
                )
                .map_err(dev)?;
            }
            ops.linear(
                rows_ref(&b.xn, n, hidden)?,
                layer.wqkv.view(),
                rows(&mut b.qkv, n, rope.qkv_dim())?,
            )
            .map_err(dev)?;
            let pools = &mut kv.layers[l];
            {
                let (k_pool, v_pool) = pools.views_mut();
                ops.rope_write_kv(
                    rows_ref(&b.qkv, n, rope.qkv_dim())?,
                    layer.qkv_bias.as_ref().map(|x| x.view()),
                    self.cos.view(),
                    self.sin.view(),
                    rope,
                    rows(&mut b.q, n, q_dim)?,
                    k_pool,
                    v_pool,
                )
                .map_err(dev)?;
            }
            let (k_cache, v_cache) = pools.views();
            let backend = &mut *attn[self.kind_of_layer[l]];
            backend.run(LayerIo {
                q: lead_ref(&b.q, &[n, c.num_heads, hd])?,
                k_cache,
                v_cache,
                out: lead(&mut b.attn, &[n, c.num_heads, hd])?,
                lse: None,
            })?;
            ops.linear(
                rows_ref(&b.attn, n, q_dim)?,
                layer.wo.view(),
                rows(&mut b.proj, n, hidden)?,
            )
            .map_err(dev)?;
            ops.add_rms_norm(
                rows(&mut b.h, n, hidden)?,
                rows_ref(&b.proj, n, hidden)?,
                layer.ffn_norm.view(),
                0.0,
                eps,
                rows(&mut b.xn, n, hidden)?,
            )
            .map_err(dev)?;
            ops.linear(
                rows_ref(&b.xn, n, hidden)?,
                layer.w_gate_up.view(),
                rows(&mut b.gate_up, n, 2 * inter)?,
            )
            .map_err(dev)?;
            ops.gated_act(
                self.act,
                rows_ref(&b.gate_up, n, 2 * inter)?,
                rows(&mut b.act, n, inter)?,
            )
            .map_err(dev)?;
            ops.linear(
                rows_ref(&b.act, n, inter)?,
                layer.w_down.view(),
                rows(&mut b.proj, n, hidden)?,
            )
            .map_err(dev)?;
            if l < last {
                ops.add_rms_norm(
                    rows(&mut b.h, n, hidden)?,
                    rows_ref(&b.proj, n, hidden)?,
                    self.layers[l + 1].attn_norm.view(),
                    0.0,
                    eps,
                    rows(&mut b.xn, n, hidden)?,
                )
                .map_err(dev)?;
            }
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
            ops.gather_logits_rows(
                rows_ref(&b.proj, n, hidden)?,
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
        .map_err(dev)
    }

    /// Hands the step's `r` logits rows to the host: copied, or reduced to their greedy
    /// ids on the device; chunk by chunk of the buffers' rows when `r` exceeds them (the
    /// first chunk was computed by `launch`).
    fn finish(
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

/// The leading `dims.iter().product()` elements of a buffer, seen as `dims` (a step
/// uses the first rows of buffers sized for the largest step).
fn lead<'a>(s: &'a mut Storage, dims: &[usize]) -> Result<TensorMut<'a>, ModelError> {
    let shape = Shape::new(dims).map_err(dev)?;
    let (head, _) = s.view_mut().split_at(shape.numel()).map_err(dev)?;
    head.reshape(shape).map_err(dev)
}

fn lead_ref<'a>(s: &'a Storage, dims: &[usize]) -> Result<TensorRef<'a>, ModelError> {
    let shape = Shape::new(dims).map_err(dev)?;
    let (head, _) = s.view().split_at(shape.numel()).map_err(dev)?;
    head.reshape(shape).map_err(dev)
}

/// The first `n` rows of width `w`, as `[n, w]`.
fn rows(s: &mut Storage, n: usize, w: usize) -> Result<TensorMut<'_>, ModelError> {
    lead(s, &[n, w])
}

fn rows_ref(s: &Storage, n: usize, w: usize) -> Result<TensorRef<'_>, ModelError> {
    lead_ref(s, &[n, w])
}

/// The device buffers of a step.
struct Bufs {
    /// Residual stream `[tokens, hidden]` f32.
    h: Storage,
    /// Normed activations `[tokens, hidden]`.
    xn: Storage,
    qkv: Storage,
    q: Storage,
    attn: Storage,
    /// o_proj / down_proj output `[tokens, hidden]`.
    proj: Storage,
    gate_up: Storage,
    act: Storage,
    /// The logits rows' residual (f32), last projection and final norm output.
    sel_h: Storage,
    sel_p: Storage,
    sel_n: Storage,
    /// `[rows, vocab]` f32.
    logits: Storage,
}

/// Device buffers of [`DeviceLlama::forward_kinds`], for up to `tokens` tokens and an
/// LM head over `rows` logits rows at a time: they grow (allocating) only when a step
/// has more tokens; a step with more logits rows (prompt log-probabilities) runs the
/// LM head chunk by chunk.
pub struct DeviceScratch {
    tokens: usize,
    rows: usize,
    bufs: Bufs,
    rows_u32: Vec<u32>,
    /// Times the buffers were (re)allocated: steady state means no change.
    num_allocations: usize,
}

impl DeviceScratch {
    /// Buffers for steps of up to `tokens` tokens, the LM head `rows` rows at a time
    /// (the engine: `--max-num-batched-tokens` and `--max-num-seqs`).
    pub fn new(
        rt: &Arc<dyn DeviceRuntime>,
        config: &LlamaConfig,
        dtype: DType,
        tokens: usize,
        rows: usize,
    ) -> Result<Self, ModelError> {
        let (tokens, rows) = (tokens.max(1), rows.max(1));
        Ok(DeviceScratch {
            tokens,
            rows,
            bufs: Bufs::new(rt.as_ref(), config, dtype, tokens, rows)?,
            rows_u32: Vec::with_capacity(rows),
            num_allocations: 1,
        })
    }

    /// How many times the buffers were allocated (1 after construction).
    pub fn num_allocations(&self) -> usize {
        self.num_allocations
    }

    /// Bytes of device memory the buffers take.
    pub fn size_bytes(&self) -> usize {
        let b = &self.bufs;
        [
            &b.h, &b.xn, &b.qkv, &b.q, &b.attn, &b.proj, &b.gate_up, &b.act, &b.sel_h, &b.sel_p,
            &b.sel_n, &b.logits,
        ]
        .iter()
        .map(|s| s.size_bytes())
        .sum()
    }

    fn reserve(
        &mut self,
        rt: &dyn DeviceRuntime,
        config: &LlamaConfig,
        dtype: DType,
        tokens: usize,
    ) -> Result<(), ModelError> {
        if tokens <= self.tokens {
            return Ok(());
        }
        self.tokens = tokens.next_power_of_two();
        self.bufs = Bufs::new(rt, config, dtype, self.tokens, self.rows)?;
        self.num_allocations += 1;
        Ok(())
    }
}

impl Bufs {
    fn new(
        rt: &dyn DeviceRuntime,
        c: &LlamaConfig,
        dtype: DType,
        n: usize,
        r: usize,
    ) -> Result<Self, ModelError> {
        let hd = c.head_dim;
        let (q_dim, kv_dim) = (c.num_heads * hd, c.num_kv_heads * hd);
        let (hidden, inter) = (c.hidden_size, c.intermediate_size);
        let a = |dt: DType, len: usize| {
            rt.alloc_zeroed(dt, Shape::flat(len)).map_err(|e| {
                config_err(format!(
                    "allocating {len} activation elements on {}: {e}",
                    rt.device()
                ))
            })
        };
        Ok(Bufs {
            h: a(DType::F32, n * hidden)?,
            xn: a(dtype, n * hidden)?,
            qkv: a(dtype, n * (q_dim + 2 * kv_dim))?,
            q: a(dtype, n * q_dim)?,
            attn: a(dtype, n * q_dim)?,
            proj: a(dtype, n * hidden)?,
            gate_up: a(dtype, n * 2 * inter)?,
            act: a(dtype, n * inter)?,
            sel_h: a(DType::F32, r * hidden)?,
            sel_p: a(dtype, r * hidden)?,
            sel_n: a(dtype, r * hidden)?,
            logits: a(DType::F32, r * c.vocab_size)?,
        })
    }
}
