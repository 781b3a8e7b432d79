//! What goes into and comes out of the LLM engine.

use pagoda_core::{FinishReason, PromptLogprob, StopReason, TokenLogprobs};
use std::time::{Duration, Instant};

/// A prompt as text or as token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// One step's news about one request: the new tokens and their text delta.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutput {
    pub request_id: String,
    pub new_token_ids: Vec<u32>,
    /// Text of the new tokens; never splits a UTF-8 character, never contains
    /// (a prefix of) a stop string that might still match.
    pub new_text: String,
    pub new_logprobs: Vec<TokenLogprobs>,
    pub finished: bool,
    pub finish_reason: Option<FinishReason>,
    pub stop_reason: Option<StopReason>,
    pub num_prompt_tokens: usize,
    pub num_cached_tokens: usize,
    pub num_output_tokens: usize,
    /// Why the request failed, when `finish_reason` is `Error` (a fault of this
    /// request alone; the engine goes on).
    pub error: Option<String>,
    /// With a request's first output, when it asked for `prompt_logprobs`: one
    /// entry per prompt token after the first.
    pub prompt_logprobs: Option<Vec<PromptLogprob>>,
    /// The request's timeline, on its final output (None before, and for aborts).
    pub metrics: Option<RequestMetrics>,
}

/// When a request passed each stage, as vLLM's engine records them (`queued_ts`,
/// `scheduled_ts`, `first_token_ts`, `last_token_ts`), plus the `max_tokens` it
/// ran under: what the per-request histograms of `/metrics` are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestMetrics {
    /// Entered the engine's waiting queue.
    pub queued: Instant,
    /// First scheduled (a preemption does not move it).
    pub scheduled: Option<Instant>,
    /// The step that produced the first output token ended.
    pub first_token: Option<Instant>,
    /// The step that produced the latest output token ended.
    pub last_token: Option<Instant>,
    pub num_prompt_tokens: usize,
    pub num_generation_tokens: usize,
    /// The effective `max_tokens` (the request's, capped by the room left in the context).
    pub max_tokens: usize,
}

impl RequestMetrics {
    /// WAITING phase: queued until first scheduled (vLLM's `queued_time`).
    pub fn queue_time(&self) -> Option<Duration> {
        Some(self.scheduled?.saturating_duration_since(self.queued))
    }
    /// PREFILL phase: first scheduled until the first token (`prefill_time`).
    pub fn prefill_time(&self) -> Option<Duration> {
        Some(self.first_token?.saturating_duration_since(self.scheduled?))
    }
    /// DECODE phase: first token until the last one (`decode_time`).
    pub fn decode_time(&self) -> Option<Duration> {
        Some(
            self.last_token?
                .saturating_duration_since(self.first_token?),
        )
    }
    /// RUNNING phase: first scheduled until the last token (`inference_time`).
    pub fn inference_time(&self) -> Option<Duration> {
        Some(self.last_token?.saturating_duration_since(self.scheduled?))
    }
}

/// vLLM's `vllm:iteration_tokens_total` bucket bounds (tokens per engine step).
pub const ITERATION_TOKENS_BUCKETS: [u64; 13] = [
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
];

/// Histogram of tokens per engine step (vLLM's `iteration_tokens_total`: the
/// prompt tokens of requests that got their first token in the step plus the
/// tokens generated in it). Per-bucket counts, not cumulative; the last is +Inf.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IterationTokens {
    pub buckets: [u64; ITERATION_TOKENS_BUCKETS.len() + 1],
    pub sum: u64,
    pub count: u64,
}

impl IterationTokens {
    pub fn observe(&mut self, tokens: u64) {
        let i = ITERATION_TOKENS_BUCKETS.partition_point(|&b| b < tokens);
        self.buckets[i] += 1;
        self.sum += tokens;
        self.count += 1;
    }
}

/// Counters for logs and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    pub num_running: usize,
    pub num_waiting: usize,
    /// Fraction of KV blocks in use, 0..=1.
    pub kv_cache_usage: f64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub num_preemptions: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub num_steps: u64,
    pub iteration_tokens: IterationTokens,
    /// Speculative decoding's counters (`vllm:spec_decode_*`).
    pub spec_decoding: pagoda_scheduler::SpecDecodingStats,
}

impl EngineStats {
    /// Engine cores' counters as one server's: counts add up, and the KV-cache
    /// usage is the mean (the data-parallel ranks have equal caches).
    pub fn combine(ranks: &[EngineStats]) -> EngineStats {
        let Some((first, rest)) = ranks.split_first() else {
            return EngineStats::default();
        };
        let mut all = rest.iter().fold(first.clone(), |a, b| a.add(b));
        all.kv_cache_usage /= ranks.len() as f64;
        all
    }

    /// This engine's counters added to those of the engines it replaced (sleep
    /// level 2 rebuilds the engine core); the gauges are this engine's.
    pub(crate) fn after(&self, earlier: &EngineStats) -> EngineStats {
        EngineStats {
            num_running: self.num_running,
            num_waiting: self.num_waiting,
            kv_cache_usage: self.kv_cache_usage,
            ..earlier.add(self)
        }
    }

    /// Sums every field (the usage too: [`EngineStats::combine`] divides it).
    fn add(&self, other: &EngineStats) -> EngineStats {
        let mut it = self.iteration_tokens.clone();
        for (a, b) in it.buckets.iter_mut().zip(other.iteration_tokens.buckets) {
            *a += b;
        }
        it.sum += other.iteration_tokens.sum;
        it.count += other.iteration_tokens.count;
        let mut spec_decoding = self.spec_decoding.clone();
        spec_decoding.add(&other.spec_decoding);
        EngineStats {
            num_running: self.num_running + other.num_running,
            num_waiting: self.num_waiting + other.num_waiting,
            kv_cache_usage: self.kv_cache_usage + other.kv_cache_usage,
            prefix_cache_queries: self.prefix_cache_queries + other.prefix_cache_queries,
            prefix_cache_hits: self.prefix_cache_hits + other.prefix_cache_hits,
            num_preemptions: self.num_preemptions + other.num_preemptions,
            prompt_tokens: self.prompt_tokens + other.prompt_tokens,
            generation_tokens: self.generation_tokens + other.generation_tokens,
            num_steps: self.num_steps + other.num_steps,
            iteration_tokens: it,
            spec_decoding,
        }
    }
}

impl RequestOutput {
    /// The final output of a request aborted before it finished.
    pub fn aborted(request_id: &str) -> Self {
        RequestOutput {
            request_id: request_id.to_string(),
            new_token_ids: Vec::new(),
            new_text: String::new(),
            new_logprobs: Vec::new(),
            finished: true,
            finish_reason: Some(FinishReason::Abort),
            stop_reason: None,
            num_prompt_tokens: 0,
            num_cached_tokens: 0,
            num_output_tokens: 0,
            error: None,
            prompt_logprobs: None,
            metrics: None,
        }
    }
}
