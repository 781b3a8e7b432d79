//! What goes into and comes out of the LLM engine.

use pagoda_core::{FinishReason, PromptLogprob, StopReason, TokenLogprobs};

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
        }
    }
}
