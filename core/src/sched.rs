//! What the scheduler hands the model runner for one step (vLLM V1's `SchedulerOutput`).
//!
//! The model runner keeps a persistent per-request state; this output only carries
//! what changed: new requests (full token ids and block ids), block ids appended
//! to running requests, how many tokens each request computes this step, and
//! which requests left (finished or preempted) so their state can be dropped.

use crate::request::{CheckedParams, RequestId};

/// A request's name inside the engine: the index of its scheduler entry and a
/// generation that changes whenever that entry is reused, so a stale handle never
/// names another request. Steps pass handles, not the external [`RequestId`]
/// (a string, which would be cloned and hashed per request per step); the id stays
/// at the edges (the scheduler's lookup by id, the engine's outputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqHandle {
    pub index: u32,
    pub generation: u32,
}

/// A request the runner has not seen, or one resumed after preemption (whose
/// state the runner dropped): everything it needs to start.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRequestData {
    pub handle: ReqHandle,
    /// The external id, for logs and errors.
    pub req_id: RequestId,
    /// Prompt plus any tokens generated before a preemption.
    pub token_ids: Vec<u32>,
    pub num_prompt_tokens: usize,
    /// Physical KV blocks, in logical order.
    pub block_ids: Vec<u32>,
    /// Tokens already in the cache (prefix hits) before this step.
    pub num_computed_tokens: usize,
    pub sampling_params: CheckedParams,
    /// How many tokens had been generated before (so seeded sampling resumes exactly).
    pub num_output_tokens: usize,
}

/// A request the runner already holds.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedRequestData {
    pub handle: ReqHandle,
    /// Blocks appended to the request's block table this step.
    pub new_block_ids: Vec<u32>,
    /// Tokens in the cache before this step.
    pub num_computed_tokens: usize,
}

/// The scheduler's decision for one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerOutput {
    pub scheduled_new_reqs: Vec<NewRequestData>,
    pub scheduled_cached_reqs: Vec<CachedRequestData>,
    /// Tokens computed this step per request, in batch order (running requests first, then
    /// newly admitted ones).
    pub num_scheduled_tokens: Vec<(ReqHandle, usize)>,
    pub total_num_scheduled_tokens: usize,
    /// Requests that finished (or were aborted) since the previous step.
    pub finished_reqs: Vec<ReqHandle>,
    /// Requests preempted in this step; their runner state must be dropped.
    pub preempted_reqs: Vec<ReqHandle>,
    /// Draft tokens scheduled this step after each listed request's last known token
    /// (vLLM's `scheduled_spec_decode_tokens`): such a row's scheduled tokens are
    /// that last token plus these drafts, and its logits are needed at all of them.
    pub scheduled_spec_decode_tokens: Vec<(ReqHandle, Vec<u32>)>,
}

impl SchedulerOutput {
    pub fn is_empty(&self) -> bool {
        self.total_num_scheduled_tokens == 0
    }

    /// The drafts scheduled for `handle` this step (empty: none).
    pub fn spec_tokens_of(&self, handle: ReqHandle) -> &[u32] {
        self.scheduled_spec_decode_tokens
            .iter()
            .find(|(h, _)| *h == handle)
            .map_or(&[], |(_, d)| d.as_slice())
    }

    pub fn num_scheduled_tokens_of(&self, handle: ReqHandle) -> Option<usize> {
        self.num_scheduled_tokens
            .iter()
            .find(|(h, _)| *h == handle)
            .map(|(_, n)| *n)
    }
}

/// One sampled token's log-probabilities (natural log, of the distribution the token
/// was sampled from, before temperature/top-k/top-p filtering, like vLLM's default).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token_id: u32,
    pub logprob: f32,
    /// The `n` most likely tokens, descending.
    pub top: Vec<(u32, f32)>,
}

/// One prompt token's log-probability given the tokens before it (vLLM's
/// `prompt_logprobs` entry): raw model distribution, no sampling parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    pub token_id: u32,
    pub logprob: f32,
    /// 1-based rank of `token_id` in the distribution (1 = most likely).
    pub rank: u32,
    /// The requested number of most likely tokens, descending.
    pub top: Vec<(u32, f32)>,
}

/// Prompt logprobs computed in one step for one request: `entries[i]` is for prompt
/// token `start + i` (the first prompt token, index 0, has none).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprobsChunk {
    pub start: usize,
    pub entries: Vec<PromptLogprob>,
}

/// What the model runner returns for a step: for each scheduled request, in batch
/// order, the sampled token (None for a prefill chunk that does not reach the end
/// of the known tokens).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelRunnerOutput {
    pub handles: Vec<ReqHandle>,
    pub sampled_token_ids: Vec<Option<u32>>,
    pub logprobs: Vec<Option<TokenLogprobs>>,
    /// Requests whose row could not be sampled (non-finite logits, every token
    /// masked...), with why. The scheduler finishes each with
    /// [`crate::FinishReason::Error`]; the rest of the batch goes on.
    pub failed: Vec<(ReqHandle, String)>,
    /// Prompt logprobs of this step's prefill chunks, for requests that asked.
    pub prompt_logprobs: Vec<(ReqHandle, PromptLogprobsChunk)>,
    /// Rows that reached their last token but were not sampled this step (a
    /// structured-output mask that was late): the scheduler steps each back one
    /// token, so the next step computes that token again and samples it.
    pub deferred: Vec<ReqHandle>,
    /// Rows that verified draft tokens (speculative decoding): their tokens are here,
    /// not in `sampled_token_ids` (which is `None` for them).
    pub spec_rows: Vec<SpecDecodeRow>,
    /// Drafts proposed for each listed request's next step (vLLM's `spec_token_ids`).
    pub spec_token_ids: Vec<(ReqHandle, Vec<u32>)>,
}

/// One verified row of a speculative step: of `num_draft_tokens` drafts, the first
/// `token_ids.len() - 1` were accepted, and the last token is the target model's own
/// (the correction at the first rejected position, or the bonus token after all).
#[derive(Debug, Clone, PartialEq)]
pub struct SpecDecodeRow {
    pub handle: ReqHandle,
    pub num_draft_tokens: usize,
    /// Accepted drafts then the target's token: never empty.
    pub token_ids: Vec<u32>,
    /// One entry per token of `token_ids` when the request asked for logprobs.
    pub logprobs: Vec<TokenLogprobs>,
}

impl SpecDecodeRow {
    pub fn num_accepted(&self) -> usize {
        self.token_ids.len().saturating_sub(1)
    }
    /// Drafts whose KV slots hold rejected tokens (rolled back by the scheduler).
    pub fn num_rejected(&self) -> usize {
        self.num_draft_tokens - self.num_accepted().min(self.num_draft_tokens)
    }
}

/// What the scheduler reports per request after a step: new tokens and, if it
/// finished, why.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineCoreOutput {
    pub handle: ReqHandle,
    pub new_token_ids: Vec<u32>,
    pub new_logprobs: Vec<TokenLogprobs>,
    pub finish_reason: Option<crate::FinishReason>,
    pub stop_reason: Option<crate::StopReason>,
    pub num_prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub num_cached_tokens: usize,
    /// Why the request failed, when `finish_reason` is `Error`.
    pub error: Option<String>,
    /// With the first output of a request that asked for them: one entry per
    /// prompt token after the first (set by the engine core, not the scheduler).
    pub prompt_logprobs: Option<Vec<PromptLogprob>>,
}
