//! The decoder on the CPU in f32: [`Llama`] is `crate::decoder`'s one forward pass
//! (every family; the config's [`crate::arch::ArchConfig`] switches on what each
//! adds) run with the host's ops (`crate::cpu`), through the pluggable attention
//! backend and the paged KV cache.
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

use crate::config::LlamaConfig;
use crate::cpu::{Cpu, CpuOps, CpuPlace, CpuScratch};
use crate::decoder::{build_decoder, check_step_inputs, forward_layers, head, Bufs, Decoder};
use crate::decoder::{Mlp, Weights};
use crate::error::ModelError;
use crate::linear::{Linear, WeightDtype};
use crate::weights::LlamaWeights;
use pagoda_core::{AttentionBackend, AttentionConfig, KvCache, StepBatch};
use std::ops::DerefMut;

/// A decoder model ready to run on the CPU (any supported family: see the module docs).
pub struct Llama {
    dec: Decoder<Cpu>,
    dtype: WeightDtype,
}

impl std::fmt::Debug for Llama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llama")
            .field("config", &self.dec.config)
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

/// Reusable buffers for [`Llama::forward`]; they grow to the largest batch seen and
/// are then reused without allocation.
#[derive(Debug, Default)]
pub struct ForwardScratch {
    bufs: Bufs<Vec<f32>>,
    cpu: CpuScratch,
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
        let dec = build_decoder(config, weights, &mut CpuPlace { dtype })?;
        Ok(Llama { dec, dtype })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.dec.config
    }

    /// The attention configurations (CPU, f32) the layers need, one per distinct
    /// kind: [`Llama::forward_kinds`] takes one backend per entry, in this order.
    /// Most models have one; Gemma 2 has two (sliding and global layers).
    pub fn attention_configs(&self, block_size: usize) -> Vec<AttentionConfig> {
        self.dec.config.attention_configs(block_size)
    }

    /// How the linear-layer weights were asked to be stored.
    pub fn weight_dtype(&self) -> WeightDtype {
        self.dtype
    }

    /// Each distinct (storage, kernel) of the linear layers with its bytes, e.g.
    /// `("Q4_1 avx2", 63_700_000)`: what a decode step reads and what runs it.
    pub fn weight_summary(&self) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = Vec::new();
        let d = &self.dec;
        let head = d.lm_head.as_ref().or(Cpu::tied_head(&d.embed));
        let mut lins: Vec<&Linear> = Vec::new();
        for l in &d.layers {
            lins.extend([&l.wqkv, &l.wo]);
            match &l.mlp {
                Mlp::Dense(e) => lins.extend([&e.w_gate_up, &e.w_down]),
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
        let c = &self.dec.config;
        let max_position = self.dec.rope.max_position();
        check_step_inputs(
            c,
            max_position,
            step.input_ids,
            step.positions,
            step.batch,
            kv,
            step.logits_rows,
        )?;
        crate::decoder::check_backends(&self.dec.attn_kinds, attn.len())?;
        // The logits are the head's output buffer: the caller's vector, lent.
        std::mem::swap(logits, &mut scratch.bufs.logits);
        // Run the whole step on a rayon worker: the kernels' parallel loops then
        // start from inside the pool (cheap local splits) instead of handing each
        // of the ~150 kernel calls of a step over from this thread (a wake-up and a
        // global-queue push every time). Inline when already on a worker.
        let r = rayon::scope(|_| self.forward_in_pool(step, attn, kv, scratch));
        std::mem::swap(logits, &mut scratch.bufs.logits);
        if r.is_err() || step.logits_rows.is_empty() {
            logits.clear();
        }
        r
    }

    fn forward_in_pool<B, A>(
        &self,
        step: &StepBatch<'_>,
        attn: &mut [B],
        kv: &mut KvCache,
        s: &mut ForwardScratch,
    ) -> Result<(), ModelError>
    where
        B: DerefMut<Target = A>,
        A: AttentionBackend + ?Sized,
    {
        let (n, r) = (step.num_tokens(), step.logits_rows.len());
        if n == 0 {
            return Ok(());
        }
        let mut ops = CpuOps {
            step,
            device: kv.device(),
            s: &mut s.cpu,
        };
        let pruned = forward_layers(&self.dec, &mut ops, (n, r), attn, kv, &mut s.bufs)?;
        if r > 0 {
            head(&self.dec, &mut ops, (0, r), pruned, &mut s.bufs)?;
        }
        Ok(())
    }
}
