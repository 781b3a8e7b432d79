//! The shared decoder forward pass on CPU in f32, through the pluggable attention
//! backend and the paged KV cache. [`Llama`] is plain Llama by default; the config's
//! [`crate::arch::ArchConfig`] switches on what the other families add (Q/K/V bias,
//! Q/K norms, sliding windows, Gemma 2's scaled embedding, post-norms, GeGLU and
//! soft caps, Mixtral's sparse MoE in `moe.rs`); the layers are built in
//! `layer.rs`.
//!
//! The linear-layer weights are [`Linear`]s, stored at construction as
//! [`WeightDtype`] says: packed f32 or bf16 panels, or quantized (a GGUF's blocks
//! as stored, or Q8_0 made at load), see `crate::linear`. Norms stay f32; the
//! embedding table stays as loaded unless it is tied to the LM head, in which case
//! the head's one packed copy serves both (a lookup gathers the row back out).
//!
//! At construction the per-layer projections are fused (`[wq; wk; wv]` and
//! `[w_gate; w_up]`) so each is one GEMM per step. A step runs every token of the
//! batch through the layers; the final norm and the LM head run only on the rows
//! whose logits the caller asks for (usually the last token of each request), since
//! the LM head is the largest matrix. All intermediate buffers live in a reusable
//! [`ForwardScratch`], so a warm decode step allocates nothing.

use crate::arch::{Activation, AttnKind};
use crate::config::LlamaConfig;
use crate::error::{kernel, ModelError};
use crate::layer::{check_mat, check_vec, FusedLayer, Mlp};
use crate::linear::{Linear, WeightDtype};
use crate::moe::MoeScratch;
use crate::weights::{LlamaWeights, Mat};
use pagoda_core::{
    AttentionBackend, AttentionConfig, BatchDescriptor, KvCache, LayerIo, StepBatch, TensorMut,
    TensorRef,
};
use pagoda_kernels::{
    add_rms_norm, gelu_tanh_mul_fused, rms_norm, silu_mul_fused, KernelError, Llama3Scaling,
    RopeCache,
};
use std::ops::DerefMut;

/// The token embedding table `[vocab, hidden]`.
#[derive(Debug, Clone)]
enum Embedding {
    /// Untied: the table as loaded.
    Table(Mat),
    /// Tied to the LM head: the head's packed matrix, shared (lookups gather a
    /// row back out of the panels, exactly as stored).
    Tied(Linear),
}

impl Embedding {
    fn row_into(&self, r: usize, dst: &mut [f32]) {
        match self {
            Embedding::Table(m) => dst.copy_from_slice(m.row(r)),
            // r < vocab (checked by forward's input validation), dst has k elements.
            Embedding::Tied(head) => {
                let _ = head.row_into(r, dst);
            }
        }
    }
}

/// A decoder model ready to run (any supported family: see the module docs).
#[derive(Debug, Clone)]
pub struct Llama {
    config: LlamaConfig,
    /// The distinct attention kinds of the layers and each layer's kind: the
    /// forward pass runs layer `l` on backend `attn[kind_of_layer[l]]`.
    attn_kinds: Vec<AttnKind>,
    kind_of_layer: Vec<usize>,
    /// `[vocab, hidden]`
    embed: Embedding,
    layers: Vec<FusedLayer>,
    norm: Vec<f32>,
    /// `None` when tied to `embed`.
    lm_head: Option<Linear>,
    rope: RopeCache,
    dtype: WeightDtype,
}

/// Reusable buffers for [`Llama::forward`]; they grow to the largest batch seen and
/// are then reused without allocation.
#[derive(Debug, Default)]
pub struct ForwardScratch {
    /// Residual stream `[tokens, hidden]`.
    h: Vec<f32>,
    /// Fused QKV output `[tokens, q + 2 kv]`.
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    mlp: LayerTail,
    /// Q/K per-head norm output (Qwen3).
    qk_tmp: Vec<f32>,
    /// The logits rows' attention output and residual, gathered for the last
    /// layer (which runs on those rows alone), then their final norm.
    sel_attn: Vec<f32>,
    sel: Vec<f32>,
    sel_norm: Vec<f32>,
}

/// Buffers of the part of a layer after attention (o_proj, residual, MLP).
#[derive(Debug, Default)]
struct LayerTail {
    /// Normed input of the next projection `[tokens, hidden]` (also the next
    /// layer's attention input).
    xn: Vec<f32>,
    /// Output of o_proj / down_proj `[tokens, hidden]`.
    proj: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    /// Post-norm output (Gemma 2).
    post: Vec<f32>,
    moe: MoeScratch,
}

/// With a post-norm weight, `x = rms_norm(x)` (through `tmp`); otherwise nothing.
fn post_norm(
    w: Option<&[f32]>,
    eps: f32,
    x: &mut Vec<f32>,
    tmp: &mut Vec<f32>,
) -> Result<(), ModelError> {
    if let Some(w) = w {
        size(tmp, x.len());
        rms_norm(x, w, eps, tmp).map_err(kernel)?;
        std::mem::swap(x, tmp);
    }
    Ok(())
}

/// Sets `v` to `len` elements, reusing its capacity (contents are overwritten by the caller).
fn size(v: &mut Vec<f32>, len: usize) {
    v.resize(len, 0.0);
}

/// `dst` = rows `rows` of `src` (rows of `width`), in that order.
fn gather_rows(src: &[f32], width: usize, rows: &[usize], dst: &mut Vec<f32>) {
    size(dst, rows.len() * width);
    for (i, &t) in rows.iter().enumerate() {
        dst[i * width..(i + 1) * width].copy_from_slice(&src[t * width..(t + 1) * width]);
    }
}

fn forward_err(message: String) -> ModelError {
    ModelError::Forward { message }
}

fn config_err(message: String) -> ModelError {
    ModelError::Config { message }
}

pub(crate) fn validate_config(c: &LlamaConfig) -> Result<(), ModelError> {
    let positive = [
        ("vocab_size", c.vocab_size),
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_heads", c.num_heads),
        ("num_kv_heads", c.num_kv_heads),
        ("head_dim", c.head_dim),
        ("max_position_embeddings", c.max_position_embeddings),
    ];
    for (name, v) in positive {
        if v == 0 {
            return Err(config_err(format!("{name} must be > 0")));
        }
    }
    if !c.num_heads.is_multiple_of(c.num_kv_heads) {
        return Err(config_err(format!(
            "{} heads are not a multiple of {} KV heads",
            c.num_heads, c.num_kv_heads
        )));
    }
    if !c.head_dim.is_multiple_of(2) {
        return Err(config_err(format!(
            "head_dim {} must be even for RoPE",
            c.head_dim
        )));
    }
    if c.vocab_size > u32::MAX as usize {
        return Err(config_err(format!(
            "vocab_size {} does not fit token ids",
            c.vocab_size
        )));
    }
    Ok(())
}

impl Llama {
    /// Checks every weight shape against `config`, fuses the projections and
    /// precomputes the RoPE tables for `max_position_embeddings` positions. The
    /// weights stay f32.
    pub fn new(config: LlamaConfig, weights: LlamaWeights) -> Result<Self, ModelError> {
        Self::new_with_dtype(config, weights, WeightDtype::F32)
    }

    /// [`Llama::new`], storing the linear layers (and a tied embedding/LM head) as
    /// `dtype`.
    pub fn new_with_dtype(
        config: LlamaConfig,
        weights: LlamaWeights,
        dtype: WeightDtype,
    ) -> Result<Self, ModelError> {
        validate_config(&config)?;
        let c = &config;
        let (hidden, hd) = (c.hidden_size, c.head_dim);
        check_mat("token_embd".into(), &weights.embed, c.vocab_size, hidden)?;
        if weights.layers.len() != c.num_layers {
            return Err(config_err(format!(
                "{} layers in weights, config says {}",
                weights.layers.len(),
                c.num_layers
            )));
        }
        check_vec("output_norm".into(), &weights.norm, hidden)?;
        if let Some(head) = &weights.lm_head {
            check_mat("lm_head".into(), head, c.vocab_size, hidden)?;
        }
        let mut layers = Vec::with_capacity(c.num_layers);
        for (i, l) in weights.layers.into_iter().enumerate() {
            layers.push(FusedLayer::build(i, l, c, dtype)?);
        }
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
        let (embed, lm_head) = match weights.lm_head {
            Some(head) => (
                Embedding::Table({
                    let mut e = weights.embed;
                    e.materialize()?;
                    e
                }),
                Some(Linear::from_parts("lm_head", vec![head], hidden, dtype)?),
            ),
            None => (
                Embedding::Tied(Linear::from_parts(
                    "token_embd",
                    vec![weights.embed],
                    hidden,
                    dtype,
                )?),
                None,
            ),
        };
        let (attn_kinds, kind_of_layer) = config.attention_kinds();
        Ok(Llama {
            config,
            attn_kinds,
            kind_of_layer,
            embed,
            layers,
            norm: weights.norm,
            lm_head,
            rope,
            dtype,
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The attention configurations (CPU, f32) the layers need, one per distinct
    /// kind: [`Llama::forward_kinds`] takes one backend per entry, in this order.
    /// Most models have one; Gemma 2 has two (sliding and global layers).
    pub fn attention_configs(&self, block_size: usize) -> Vec<AttentionConfig> {
        self.config.attention_configs(block_size)
    }

    /// How the linear-layer weights were asked to be stored.
    pub fn weight_dtype(&self) -> WeightDtype {
        self.dtype
    }

    /// Each distinct (storage, kernel) of the linear layers with its bytes, e.g.
    /// `("Q4_1 avx2", 63_700_000)`: what a decode step reads and what runs it.
    pub fn weight_summary(&self) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = Vec::new();
        let head = match (&self.lm_head, &self.embed) {
            (Some(h), _) | (None, Embedding::Tied(h)) => Some(h),
            _ => None,
        };
        let mut lins: Vec<&Linear> = Vec::new();
        for l in &self.layers {
            lins.extend([&l.wqkv, &l.wo]);
            match &l.mlp {
                Mlp::Dense { w_gate_up, w_down } => lins.extend([w_gate_up, w_down]),
                Mlp::Moe(moe) => {
                    lins.push(&moe.router);
                    for e in &moe.experts {
                        lins.extend([&e.w_gate_up, &e.w_down]);
                    }
                }
            }
        }
        for lin in lins.into_iter().chain(head) {
            let (name, bytes) = (lin.describe(), lin.num_bytes());
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, b)) => *b += bytes,
                None => out.push((name, bytes)),
            }
        }
        out
    }

    /// `out[m, vocab] = x[m, hidden] · headᵀ` (the embedding when tied).
    fn head_matmul(&self, x: &[f32], out: &mut [f32], m: usize) -> Result<(), KernelError> {
        let (k, n) = (self.config.hidden_size, self.config.vocab_size);
        match (&self.lm_head, &self.embed) {
            (Some(head), _) => head.matmul(x, out, m, k, n),
            (None, Embedding::Tied(head)) => head.matmul(x, out, m, k, n),
            // Not built: an untied embedding always comes with its own head.
            (None, Embedding::Table(e)) => pagoda_kernels::matmul_t_ref(x, &e.data, out, m, k, n),
        }
    }

    /// One engine step. `input_ids`/`positions` are the batch's tokens in
    /// `batch` order; the caller has already called `attn.plan(batch)`. New K/V go
    /// into `kv` at `batch.slot_mapping()`. `logits` becomes
    /// `[logits_rows.len(), vocab]`, row `i` for token index `logits_rows[i]`.
    ///
    /// `attn` serves every layer, so it must have been built for the model's one
    /// attention kind (`attention_configs(..)[0]`); a model with several kinds
    /// (Gemma 2) needs [`Llama::forward_kinds`].
    pub fn forward(
        &self,
        step: &StepBatch<'_>,
        attn: &mut dyn AttentionBackend,
        kv: &mut KvCache,
        logits: &mut Vec<f32>,
        scratch: &mut ForwardScratch,
    ) -> Result<(), ModelError> {
        self.forward_kinds(step, &mut [attn], kv, logits, scratch)
    }

    /// [`Llama::forward`] with one planned backend per attention kind, in the order
    /// of [`Llama::attention_configs`] (`&mut dyn` or `Box<dyn>` backends).
    pub fn forward_kinds<B, A>(
        &self,
        step: &StepBatch<'_>,
        attn: &mut [B],
        kv: &mut KvCache,
        logits: &mut Vec<f32>,
        scratch: &mut ForwardScratch,
    ) -> Result<(), ModelError>
    where
        B: DerefMut<Target = A> + Send,
        A: AttentionBackend + ?Sized,
    {
        self.check_inputs(
            step.input_ids,
            step.positions,
            step.batch,
            kv,
            step.logits_rows,
        )?;
        if attn.len() != self.attn_kinds.len() {
            return Err(forward_err(format!(
                "the model's layers need {} attention backends (one per kind: {:?}), got {}",
                self.attn_kinds.len(),
                self.attn_kinds,
                attn.len()
            )));
        }
        // Run the whole step on a rayon worker: the kernels' parallel loops then
        // start from inside the pool (cheap local splits) instead of handing each
        // of the ~150 kernel calls of a step over from this thread (a wake-up and a
        // global-queue push every time). Inline when already on a worker.
        rayon::scope(|_| self.forward_in_pool(step, attn, kv, logits, scratch))
    }

    fn forward_in_pool<B, A>(
        &self,
        step: &StepBatch<'_>,
        attn: &mut [B],
        kv: &mut KvCache,
        logits: &mut Vec<f32>,
        scratch: &mut ForwardScratch,
    ) -> Result<(), ModelError>
    where
        B: DerefMut<Target = A>,
        A: AttentionBackend + ?Sized,
    {
        let (input_ids, logits_rows) = (step.input_ids, step.logits_rows);
        let c = &self.config;
        let n = input_ids.len();
        let (hidden, q_dim) = (c.hidden_size, c.num_heads * c.head_dim);
        let s = scratch;
        size(&mut s.h, n * hidden);
        size(&mut s.mlp.xn, n * hidden);
        for (t, &id) in input_ids.iter().enumerate() {
            self.embed
                .row_into(id as usize, &mut s.h[t * hidden..(t + 1) * hidden]);
        }
        if c.arch.scale_embedding {
            // Gemma multiplies by sqrt(hidden) rounded to the activations' dtype.
            let k = (hidden as f32).sqrt();
            s.h.iter_mut().for_each(|x| *x *= k);
        }
        if n == 0 {
            logits.clear();
            return Ok(());
        }
        if let Some(first) = self.layers.first() {
            rms_norm(&s.h, &first.attn_norm, c.rms_norm_eps, &mut s.mlp.xn).map_err(kernel)?;
        }
        let r = logits_rows.len();
        // Past the last layer's attention only the logits rows matter: that layer
        // finishes on those rows alone, gathered into their own buffers.
        let prune = r < n;
        for (l, layer) in self.layers.iter().enumerate() {
            let backend = &mut *attn[self.kind_of_layer[l]];
            self.attention(l, layer, step, backend, kv, s)?;
            let next_norm = self.layers.get(l + 1).map(|x| &x.attn_norm);
            if next_norm.is_none() && prune {
                gather_rows(&s.attn, q_dim, logits_rows, &mut s.sel_attn);
                gather_rows(&s.h, hidden, logits_rows, &mut s.sel);
                self.finish_layer(layer, None, r, &s.sel_attn, &mut s.sel, &mut s.mlp)?;
            } else {
                self.finish_layer(layer, next_norm, n, &s.attn, &mut s.h, &mut s.mlp)?;
            }
        }
        if !prune || self.layers.is_empty() {
            gather_rows(&s.h, hidden, logits_rows, &mut s.sel);
        }
        // Final norm + LM head on the logits rows.
        logits.resize(r * c.vocab_size, 0.0);
        if r > 0 {
            size(&mut s.sel_norm, r * hidden);
            rms_norm(&s.sel, &self.norm, c.rms_norm_eps, &mut s.sel_norm).map_err(kernel)?;
            self.head_matmul(&s.sel_norm, logits, r).map_err(kernel)?;
            if let Some(cap) = c.arch.final_logit_softcap {
                logits.iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
            }
        }
        Ok(())
    }

    /// QKV projection of `xn`, RoPE, this layer's K/V into the cache, attention
    /// into `s.attn`, for every token of the batch.
    fn attention<A: AttentionBackend + ?Sized>(
        &self,
        l: usize,
        layer: &FusedLayer,
        step: &StepBatch<'_>,
        attn: &mut A,
        kv: &mut KvCache,
        s: &mut ForwardScratch,
    ) -> Result<(), ModelError> {
        let (positions, batch) = (step.positions, step.batch);
        let c = &self.config;
        let n = positions.len();
        let (hidden, hd) = (c.hidden_size, c.head_dim);
        let (q_dim, kv_dim) = (c.num_heads * hd, c.num_kv_heads * hd);
        let qkv_dim = q_dim + 2 * kv_dim;
        size(&mut s.qkv, n * qkv_dim);
        size(&mut s.q, n * q_dim);
        size(&mut s.k, n * kv_dim);
        size(&mut s.v, n * kv_dim);
        size(&mut s.attn, n * q_dim);
        layer
            .wqkv
            .matmul(&s.mlp.xn, &mut s.qkv, n, hidden, qkv_dim)
            .map_err(kernel)?;
        if let Some(b) = &layer.qkv_bias {
            for row in s.qkv.chunks_exact_mut(qkv_dim) {
                row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
            }
        }
        for t in 0..n {
            let row = &s.qkv[t * qkv_dim..(t + 1) * qkv_dim];
            s.q[t * q_dim..(t + 1) * q_dim].copy_from_slice(&row[..q_dim]);
            s.k[t * kv_dim..(t + 1) * kv_dim].copy_from_slice(&row[q_dim..q_dim + kv_dim]);
            s.v[t * kv_dim..(t + 1) * kv_dim].copy_from_slice(&row[q_dim + kv_dim..]);
        }
        if let Some((qn, kn)) = &layer.qk_norm {
            // Rows of head_dim: the norm weight's length makes each head a row.
            for (x, w) in [(&mut s.q, qn), (&mut s.k, kn)] {
                size(&mut s.qk_tmp, x.len());
                rms_norm(x, w, c.rms_norm_eps, &mut s.qk_tmp).map_err(kernel)?;
                std::mem::swap(x, &mut s.qk_tmp);
            }
        }
        self.rope
            .apply(&mut s.q, c.num_heads, positions)
            .map_err(kernel)?;
        self.rope
            .apply(&mut s.k, c.num_kv_heads, positions)
            .map_err(kernel)?;
        // Activations live in host memory; they are tagged with the cache's device
        // (cpu, or emu when the CUDA kernels run emulated on the host).
        let device = kv.device();
        let pools = &mut kv.layers[l];
        let (k_pool, v_pool) = pools.views_mut();
        attn.write_kv(
            k_pool,
            v_pool,
            TensorRef::host(device, &s.k)?,
            TensorRef::host(device, &s.v)?,
            batch.slot_mapping(),
            kv_dim,
        )?;
        let (k_cache, v_cache) = pools.views();
        attn.run(LayerIo {
            q: TensorRef::host(device, &s.q)?,
            k_cache,
            v_cache,
            out: TensorMut::host(device, &mut s.attn)?,
            lse: None,
        })?;
        Ok(())
    }

    /// The rest of a layer on `m` rows: o_proj of `attn`, residual add into `h`,
    /// the MLP, and its residual add fused with the next layer's input norm into
    /// `t.xn` (after the last layer, `next_norm` is None: just the add). Gemma 2's
    /// post-norms apply to o_proj's and the MLP's outputs before their adds.
    fn finish_layer(
        &self,
        layer: &FusedLayer,
        next_norm: Option<&Vec<f32>>,
        m: usize,
        attn: &[f32],
        h: &mut [f32],
        t: &mut LayerTail,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let (hidden, inter, eps) = (c.hidden_size, c.intermediate_size, c.rms_norm_eps);
        let q_dim = c.num_heads * c.head_dim;
        let (mh, mi) = (m * hidden, m * inter);
        size(&mut t.proj, mh);
        if t.xn.len() < mh {
            size(&mut t.xn, mh);
        }
        let h = &mut h[..mh];
        layer
            .wo
            .matmul(&attn[..m * q_dim], &mut t.proj, m, q_dim, hidden)
            .map_err(kernel)?;
        post_norm(
            layer.post_attn_norm.as_deref(),
            eps,
            &mut t.proj,
            &mut t.post,
        )?;
        add_rms_norm(h, &t.proj, &layer.ffn_norm, eps, &mut t.xn[..mh]).map_err(kernel)?;
        match &layer.mlp {
            Mlp::Dense { w_gate_up, w_down } => {
                size(&mut t.gate_up, 2 * mi);
                size(&mut t.act, mi);
                w_gate_up
                    .matmul(&t.xn[..mh], &mut t.gate_up, m, hidden, 2 * inter)
                    .map_err(kernel)?;
                match c.arch.activation {
                    Activation::Silu => silu_mul_fused(&t.gate_up, inter, &mut t.act),
                    Activation::GeluTanh => gelu_tanh_mul_fused(&t.gate_up, inter, &mut t.act),
                }
                .map_err(kernel)?;
                w_down
                    .matmul(&t.act, &mut t.proj, m, inter, hidden)
                    .map_err(kernel)?;
            }
            Mlp::Moe(moe) => moe.forward(
                &t.xn[..mh],
                m,
                hidden,
                inter,
                c.arch.activation,
                &mut t.proj,
                &mut t.moe,
            )?,
        }
        post_norm(
            layer.post_ffn_norm.as_deref(),
            eps,
            &mut t.proj,
            &mut t.post,
        )?;
        match next_norm {
            Some(norm) => add_rms_norm(h, &t.proj, norm, eps, &mut t.xn[..mh]).map_err(kernel)?,
            None => {
                for (a, b) in h.iter_mut().zip(&t.proj) {
                    *a += b;
                }
            }
        }
        Ok(())
    }

    fn check_inputs(
        &self,
        input_ids: &[u32],
        positions: &[u32],
        batch: &BatchDescriptor,
        kv: &KvCache,
        logits_rows: &[usize],
    ) -> Result<(), ModelError> {
        check_step_inputs(
            &self.config,
            self.rope.max_position(),
            input_ids,
            positions,
            batch,
            kv,
            logits_rows,
        )
    }
}

/// A step's inputs against the model (`c`, RoPE tables of `max_position`) and its KV
/// cache: lengths, token ids, positions, logits rows, the cache's shape and block size.
/// Shared by the CPU and the device forward.
pub(crate) fn check_step_inputs(
    c: &LlamaConfig,
    max_position: usize,
    input_ids: &[u32],
    positions: &[u32],
    batch: &BatchDescriptor,
    kv: &KvCache,
    logits_rows: &[usize],
) -> Result<(), ModelError> {
    let n = input_ids.len();
    if positions.len() != n {
        return Err(forward_err(format!(
            "{n} input ids but {} positions",
            positions.len()
        )));
    }
    if batch.num_tokens() != n || batch.slot_mapping().len() != n {
        return Err(forward_err(format!(
            "{n} input ids but the batch has {} tokens and {} slots",
            batch.num_tokens(),
            batch.slot_mapping().len()
        )));
    }
    if let Some((t, &id)) = input_ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= c.vocab_size)
    {
        return Err(forward_err(format!(
            "token {t}: id {id} is out of the vocabulary of {}",
            c.vocab_size
        )));
    }
    if let Some(&p) = positions.iter().find(|&&p| p as usize >= max_position) {
        return Err(forward_err(format!(
            "position {p} is beyond the model's {max_position} positions"
        )));
    }
    if let Some(&t) = logits_rows.iter().find(|&&t| t >= n) {
        return Err(forward_err(format!(
            "logits row {t} is out of range for {n} tokens"
        )));
    }
    let spec = &kv.spec;
    if spec.num_layers != c.num_layers
        || kv.layers.len() != c.num_layers
        || spec.num_kv_heads != c.num_kv_heads
        || spec.head_dim != c.head_dim
    {
        return Err(forward_err(format!(
                "KV cache ({} layers, {} kv heads, head dim {}) does not fit the model ({} layers, {} kv heads, head dim {})",
                kv.layers.len(),
                spec.num_kv_heads,
                spec.head_dim,
                c.num_layers,
                c.num_kv_heads,
                c.head_dim
            )));
    }
    if spec.block_size != batch.block_size() {
        return Err(forward_err(format!(
            "batch block size {} but cache block size {}",
            batch.block_size(),
            spec.block_size
        )));
    }
    Ok(())
}
