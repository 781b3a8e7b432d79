//! The model runner's data: [`ModelRunner`]'s fields, the per-request state it keeps
//! between steps, and the per-step row records. The step's logic lives above, in
//! `runner` (inputs, forward, sampling) and `runner::spec_rows` (speculative rows);
//! both reach the data here and this module reaches neither, so the two halves of
//! the runner depend on one layer below them instead of on each other.

use crate::runner_model::RunnerModel;
use crate::sampler::{RowResult, Sampler, SamplerError};
use crate::structured::{MaskRow, Masks};
use pagoda_core::{
    AttentionBackend, BatchDescriptor, CheckedParams, KvCache, ReqHandle, RequestId,
};
use std::time::Duration;

/// Test-only fault injection, armed by `pagoda serve --debug-inject-fault` in
/// debug builds: a request whose prompt starts with one of these token sequences
/// has its row fail in the sampler (a per-request fault) or makes the runner panic
/// (an engine-wide fault), so tests can prove each is contained as it should be.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultInjection {
    /// Prompt prefix whose rows fail to sample.
    pub sampler_error: Option<Vec<u32>>,
    /// Prompt prefix that panics the runner.
    pub panic: Option<Vec<u32>>,
    /// Prompt prefix whose grammar masks take this much longer to compute (an
    /// expensive grammar, reproducibly).
    pub slow_mask: Option<(Vec<u32>, Duration)>,
}

impl FaultInjection {
    pub(super) fn apply(&self, tokens: &[u32], row: RowResult) -> RowResult {
        let hit = |p: &Option<Vec<u32>>| p.as_ref().is_some_and(|p| tokens.starts_with(p));
        if hit(&self.panic) {
            panic!("injected fault: the runner panics");
        }
        if hit(&self.sampler_error) {
            return Err(SamplerError::InvalidParam {
                row: 0,
                param: "fault_injection",
                message: "injected sampler fault".into(),
            });
        }
        row
    }
}

pub(super) struct ReqState {
    pub(super) handle: ReqHandle,
    /// The external id, for logs.
    pub(super) req_id: RequestId,
    pub(super) token_ids: Vec<u32>,
    pub(super) num_prompt_tokens: usize,
    pub(super) block_ids: Vec<u32>,
    pub(super) num_computed_tokens: usize,
    pub(super) params: CheckedParams,
    pub(super) seed: u64,
    /// `prompt_logprobs` still to compute: set for a request that asked and has no
    /// output yet (one resumed after preemption delivered them already).
    pub(super) prompt_logprobs: Option<usize>,
    /// Drafts at the end of `token_ids` during a step that verifies them.
    pub(super) num_drafts: usize,
}

/// The prompt rows of one request whose logits the step computes for prompt
/// logprobs: batch tokens `base..base + count`, prompt positions from `start`.
pub(super) struct PromptRows {
    pub(super) sched_index: usize,
    pub(super) start: usize,
    pub(super) base: usize,
    pub(super) count: usize,
    pub(super) k: usize,
}

/// Runs the model for scheduled batches.
pub struct ModelRunner {
    pub(super) model: RunnerModel,
    pub(super) kv: KvCache,
    /// One backend per attention kind of the model's layers
    /// ([`pagoda_models::Llama::attention_configs`]; two for Gemma 2's sliding and global layers).
    pub(super) attn: Vec<Box<dyn AttentionBackend>>,
    pub(super) sampler: Sampler,
    pub(super) eos_ids: Vec<u32>,
    /// Indexed by `ReqHandle::index`; the stored handle tells a stale entry.
    pub(super) requests: Vec<Option<ReqState>>,
    // Reused per-step buffers.
    pub(super) input_ids: Vec<u32>,
    pub(super) positions: Vec<u32>,
    pub(super) query_lens: Vec<usize>,
    pub(super) seq_lens: Vec<usize>,
    pub(super) logits_rows: Vec<usize>,
    pub(super) sample_rows: Vec<usize>,
    pub(super) prompt_rows: Vec<PromptRows>,
    pub(super) logits: Vec<f32>,
    /// The sampled rows' ids when the device computed them (plain greedy steps).
    pub(super) greedy_ids: Vec<u32>,
    pub(super) batch: BatchDescriptor,
    pub(super) faults: Option<FaultInjection>,
    /// Grammars of constrained requests and their masks in flight.
    pub(super) masks: Masks,
    /// This step's constrained rows (a reused buffer).
    pub(super) mask_rows: Vec<MaskRow>,
    /// Per sampled row: why its grammar failed this step.
    pub(super) grammar_errors: Vec<Option<String>>,
    /// Per sampled row: deferred to a later step (its mask was late).
    pub(super) deferred: Vec<bool>,
    /// `--speculative-config`: drafts are proposed after each step when set.
    pub(super) spec: Option<crate::spec::SpeculativeConfig>,
    /// This step's verify rows (a reused buffer).
    pub(super) spec_rows: Vec<SpecRow>,
    /// `"method": "draft_model"`: the draft model proposing the drafts.
    pub(super) draft: Option<Box<crate::spec::draft::DraftProposer>>,
}

/// One verify row of the step (speculative decoding).
pub(super) struct SpecRow {
    /// Index in the scheduler's batch order.
    pub sched_index: usize,
    /// First of its `num_drafts + 1` token rows in the step's input ids.
    pub base: usize,
    pub num_drafts: usize,
}

impl ModelRunner {
    pub(super) fn state(&self, h: ReqHandle) -> Option<&ReqState> {
        self.requests
            .get(h.index as usize)?
            .as_ref()
            .filter(|s| s.handle == h)
    }

    pub(super) fn state_mut(&mut self, h: ReqHandle) -> Option<&mut ReqState> {
        self.requests
            .get_mut(h.index as usize)?
            .as_mut()
            .filter(|s| s.handle == h)
    }
}
