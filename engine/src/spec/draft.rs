//! Draft-model proposals (vLLM's `"method": "draft_model"`): a smaller model with
//! the target's vocabulary runs greedily `k` times over the proposing requests,
//! batched, and its argmax tokens are the drafts.
//!
//! The draft keeps its own paged KV cache (its own layer count and heads, so not
//! the target's pools; as many blocks of the target's block size as the target's
//! cache, so it never runs out first) and, per request, the tokens its cache holds.
//! Each proposal first catches the draft up: the longest prefix its cache shares
//! with the request's tokens stays, the rest (the prompt at first, later the kept
//! tokens after a verification) is fed as one chunk; then one decode step per
//! further draft. Rejected drafts need no rollback: the next proposal's shared
//! prefix ends before them and their slots are written over. A request's blocks
//! are freed when it leaves the runner ([`DraftProposer::forget`]).
//!
//! The target verifies with vLLM's rejection sampler, which is exact for any
//! proposal that does not depend on the target's own sampling (here: a
//! deterministic function of the tokens), so outputs are distributed as without
//! speculation and greedy outputs are identical.

use crate::EngineError;
use pagoda_core::{
    AttentionBackend, BatchDescriptor, DType, Device, HostRuntime, KvCache, KvCacheSpec, ReqHandle,
    StepBatch,
};
use pagoda_models::{ForwardScratch, Llama, LlamaConfig, WeightDtype};
use std::collections::HashMap;
use std::path::Path;

/// What one request's draft cache holds.
#[derive(Debug, Default)]
struct DraftSeq {
    /// The tokens whose K/V are in the cache, in position order.
    tokens: Vec<u32>,
    /// Physical blocks of the draft cache, in position order.
    blocks: Vec<u32>,
}

/// One request asking for drafts.
pub struct DraftRequest<'a> {
    pub handle: ReqHandle,
    /// Prompt and outputs so far (at least one token).
    pub tokens: &'a [u32],
    /// Most drafts wanted.
    pub limit: usize,
}

/// The draft model, its cache and the requests' state in it.
pub struct DraftProposer {
    model: Llama,
    scratch: ForwardScratch,
    attn: Vec<Box<dyn AttentionBackend>>,
    kv: KvCache,
    block_size: usize,
    /// Free blocks of the draft cache (block 0, the null block, is never handed out).
    free: Vec<u32>,
    seqs: HashMap<ReqHandle, DraftSeq>,
    k: usize,
    // Reused step buffers.
    input_ids: Vec<u32>,
    positions: Vec<u32>,
    logits_rows: Vec<usize>,
    logits: Vec<f32>,
    batch: BatchDescriptor,
}

fn err(message: String) -> EngineError {
    EngineError::invalid("speculative_config", message)
}

impl DraftProposer {
    /// Loads the draft at `path` for a target of `target` config, proposing `k`
    /// tokens per step into a cache of `num_blocks` blocks of `block_size`.
    pub fn load(
        path: &Path,
        target: &LlamaConfig,
        target_eos: &[u32],
        k: usize,
        block_size: usize,
        num_blocks: usize,
        weight_dtype: WeightDtype,
    ) -> Result<Self, EngineError> {
        let loaded = pagoda_models::load_model(path)
            .map_err(|e| err(format!("draft model {}: {e}", path.display())))?;
        if loaded.config.vocab_size != target.vocab_size || loaded.eos_token_ids != target_eos {
            return Err(err(format!(
                "draft model {} does not share the target's vocabulary (vocab {} vs {}, EOS ids {:?} vs {:?})",
                path.display(),
                loaded.config.vocab_size,
                target.vocab_size,
                loaded.eos_token_ids,
                target_eos
            )));
        }
        let config = loaded.config.clone();
        let mut attn_configs = config.attention_configs(block_size);
        for c in &mut attn_configs {
            c.device = Device::Cpu;
            c.q_dtype = DType::F32;
            c.kv_dtype = DType::F32;
        }
        let merged = pagoda_models::merge_attention_configs(&attn_configs);
        let selection = pagoda_selector::select(&merged, &Default::default())
            .map_err(|e| err(format!("draft model attention: {e}")))?;
        let attn = attn_configs
            .iter()
            .map(|c| selection.build(c))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| err(format!("draft model attention: {e}")))?;
        let spec = KvCacheSpec {
            num_layers: config.num_layers,
            num_blocks,
            block_size,
            num_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
            dtype: merged.kv_dtype,
        };
        let runtime = HostRuntime::new(Device::Cpu).map_err(EngineError::from)?;
        let kv = KvCache::allocate(spec, &runtime).map_err(EngineError::from)?;
        let model = Llama::new_with_dtype(config, loaded.weights, weight_dtype)
            .map_err(|e| err(format!("draft model {}: {e}", path.display())))?;
        tracing::info!(
            "speculative decoding: draft model {} ({} layers, attention {selection}), \
             its KV cache {} blocks ({:.1} MiB)",
            loaded.name,
            spec.num_layers,
            num_blocks,
            (num_blocks * spec.bytes_per_block()) as f64 / (1 << 20) as f64
        );
        Ok(DraftProposer {
            model,
            scratch: ForwardScratch::default(),
            attn,
            kv,
            block_size,
            free: (1..num_blocks as u32).rev().collect(),
            seqs: HashMap::new(),
            k,
            input_ids: Vec::new(),
            positions: Vec::new(),
            logits_rows: Vec::new(),
            logits: Vec::new(),
            batch: BatchDescriptor::default(),
        })
    }

    /// Frees a request's draft cache (it finished, was aborted or preempted).
    pub fn forget(&mut self, handle: ReqHandle) {
        if let Some(seq) = self.seqs.remove(&handle) {
            self.free.extend(seq.blocks);
        }
    }

    /// Gives `seq` blocks for `len` positions; false when the cache is full.
    fn reserve(&mut self, handle: ReqHandle, len: usize) -> bool {
        let seq = self.seqs.entry(handle).or_default();
        let need = len.div_ceil(self.block_size);
        while seq.blocks.len() < need {
            match self.free.pop() {
                Some(b) => seq.blocks.push(b),
                None => return false,
            }
        }
        true
    }

    /// Drafts for every request (empty where it gets none), in `reqs` order.
    pub fn propose(&mut self, reqs: &[DraftRequest<'_>]) -> Result<Vec<Vec<u32>>, EngineError> {
        let mut drafts = vec![Vec::new(); reqs.len()];
        // Requests that draft, with the first token the draft must feed.
        let mut active: Vec<(usize, usize)> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let k = self.k.min(r.limit);
            if k == 0 || r.tokens.is_empty() || !self.reserve(r.handle, r.tokens.len() + k - 1) {
                continue;
            }
            let seq = self.seqs.get_mut(&r.handle).expect("reserved above");
            let shared = seq
                .tokens
                .iter()
                .zip(r.tokens)
                .take_while(|(a, b)| a == b)
                .count();
            // At least the last token is fed: its logits give the first draft.
            let from = shared.min(r.tokens.len() - 1);
            seq.tokens.truncate(from);
            active.push((i, from));
        }
        // Decode rows (one new token) first, as a batch must have them.
        active.sort_by_key(|&(i, from)| reqs[i].tokens.len() - from > 1);
        let mut step: Vec<(usize, usize, usize)> = active
            .iter()
            .map(|&(i, from)| (i, from, reqs[i].tokens.len()))
            .collect();
        for d in 0.. {
            step.retain(|&(i, _, _)| d < self.k.min(reqs[i].limit));
            if step.is_empty() {
                break;
            }
            let ids = self.forward(reqs, &drafts, &step)?;
            for (&(i, _, _), id) in step.iter().zip(ids) {
                drafts[i].push(id);
            }
            // Next: each request feeds its newest draft at the next position.
            for s in step.iter_mut() {
                s.1 = s.2;
                s.2 += 1;
            }
        }
        Ok(drafts)
    }

    /// One draft forward: request `i` feeds its tokens `from..end` (its own tokens,
    /// then its drafts), returns the argmax at each row's last position.
    fn forward(
        &mut self,
        reqs: &[DraftRequest<'_>],
        drafts: &[Vec<u32>],
        step: &[(usize, usize, usize)],
    ) -> Result<Vec<u32>, EngineError> {
        self.input_ids.clear();
        self.positions.clear();
        self.logits_rows.clear();
        let (mut query_lens, mut seq_lens) = (Vec::new(), Vec::new());
        for &(i, from, end) in step {
            let r = &reqs[i];
            let seq = self.seqs.get_mut(&r.handle).expect("reserved");
            for p in from..end {
                let t = match r.tokens.get(p) {
                    Some(&t) => t,
                    None => drafts[i][p - r.tokens.len()],
                };
                self.input_ids.push(t);
                self.positions.push(p as u32);
                seq.tokens.push(t);
            }
            query_lens.push(end - from);
            seq_lens.push(end);
            self.logits_rows.push(self.input_ids.len() - 1);
        }
        let rows: Vec<&[u32]> = step
            .iter()
            .map(|&(i, _, _)| self.seqs[&reqs[i].handle].blocks.as_slice())
            .collect();
        self.batch
            .rebuild(self.block_size, &query_lens, &seq_lens, &rows)
            .map_err(EngineError::from)?;
        for a in self.attn.iter_mut() {
            a.plan(&self.batch).map_err(EngineError::from)?;
        }
        self.model.forward_kinds(
            &StepBatch {
                input_ids: &self.input_ids,
                positions: &self.positions,
                batch: &self.batch,
                logits_rows: &self.logits_rows,
            },
            &mut self.attn,
            &mut self.kv,
            &mut self.logits,
            &mut self.scratch,
        )?;
        let vocab = self.model.config().vocab_size;
        Ok(self
            .logits
            .chunks_exact(vocab)
            .map(|row| argmax(row) as u32)
            .collect())
    }
}

/// The first index of the largest value (NaN never wins).
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}
