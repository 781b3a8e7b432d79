//! Requests as the scheduler sees them: token ids, sampling parameters, status.
//!
//! Text never appears here; the LLM engine owns tokenization and stop strings.

use crate::CoreError;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub use crate::stop::StopStrings;

/// Request ids are caller-chosen strings (the server uses `cmpl-...`).
pub type RequestId = String;

/// Hash of one full KV block, chained through its parent (see the KV cache
/// manager). 128 bits so that collisions are not a practical concern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

/// Life cycle of a request inside the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RequestStatus {
    Waiting,
    Running,
    Preempted,
    FinishedStopped,
    FinishedLengthCapped,
    FinishedAborted,
    /// Refused at admission: the request can never fit (prompt longer than the
    /// model length or than the whole KV cache).
    FinishedIgnored,
    /// Ended by a fault of this request alone (a row that could not be sampled);
    /// the engine goes on with the others.
    FinishedError,
}

impl RequestStatus {
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            RequestStatus::FinishedStopped
                | RequestStatus::FinishedLengthCapped
                | RequestStatus::FinishedAborted
                | RequestStatus::FinishedIgnored
                | RequestStatus::FinishedError
        )
    }

    /// The OpenAI-style finish reason for a finished status.
    pub fn finish_reason(self) -> Option<FinishReason> {
        match self {
            RequestStatus::FinishedStopped => Some(FinishReason::Stop),
            RequestStatus::FinishedLengthCapped => Some(FinishReason::Length),
            RequestStatus::FinishedAborted => Some(FinishReason::Abort),
            RequestStatus::FinishedIgnored => Some(FinishReason::Length),
            RequestStatus::FinishedError => Some(FinishReason::Error),
            _ => None,
        }
    }
}

/// Why a request finished, as reported to API clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
    /// This request failed on its own (vLLM's `FinishReason.ERROR`).
    Error,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }
}

/// What exactly stopped a request that finished with [`FinishReason::Stop`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StopReason {
    Eos(u32),
    StopTokenId(u32),
    StopString(String),
}

/// Sampling and stopping parameters of one request (vLLM's `SamplingParams`).
///
/// The lists (and the constraint) are behind `Arc`s: the `n` samples of a request,
/// and every layer that keeps a copy (scheduler, runner, detokenizer), share one
/// allocation, so cloning the parameters costs the same whatever their size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// In (0, 1]; 1 disables nucleus filtering.
    pub top_p: f32,
    /// 0 (or negative) disables top-k.
    pub top_k: i32,
    /// In [0, 1]; 0 disables min-p.
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// 1 disables it; applies to prompt and output tokens, like vLLM.
    pub repetition_penalty: f32,
    /// Same seed, same output, whatever else is in the batch.
    pub seed: Option<u64>,
    /// None: as many as fit in the model length.
    pub max_tokens: Option<usize>,
    pub min_tokens: usize,
    #[serde(with = "shared")]
    pub stop_token_ids: Arc<[u32]>,
    /// Stop strings; detected by the LLM engine, which knows text.
    pub stop: StopStrings,
    pub include_stop_str_in_output: bool,
    pub ignore_eos: bool,
    /// Number of top log-probabilities to return per generated token.
    pub logprobs: Option<usize>,
    /// Log-probabilities of the prompt's tokens (vLLM's `prompt_logprobs`): each
    /// prompt token after the first, with this many most likely alternatives
    /// ([`ALL_PROMPT_LOGPROBS`]: the whole vocabulary). A request that asks for them
    /// does not read the prefix cache, whose tokens would have no logits.
    pub prompt_logprobs: Option<usize>,
    /// vLLM's `logprob_token_ids`: report the logprobs of exactly these tokens at
    /// each generated position (in [`crate::TokenLogprobs::top`], in this order),
    /// instead of the most likely ones.
    #[serde(with = "shared_opt")]
    pub logprob_token_ids: Option<Arc<[u32]>>,
    /// vLLM's `bad_words`, as token sequences: a sequence's last token is masked
    /// whenever the output so far ends with the rest of it.
    #[serde(with = "shared")]
    pub bad_words_token_ids: Arc<[Vec<u32>]>,
    /// Additive biases on logits, by token id.
    #[serde(with = "shared")]
    pub logit_bias: Arc<[(u32, f32)]>,
    /// Only these token ids may be sampled (vLLM's `allowed_token_ids`).
    #[serde(with = "shared_opt")]
    pub allowed_token_ids: Option<Arc<[u32]>>,
    pub skip_special_tokens: bool,
    /// The output must satisfy this constraint (vLLM's `structured_outputs`); the
    /// engine compiles it and masks the logits of every step.
    #[serde(with = "shared_so")]
    pub structured_outputs: Option<Arc<crate::StructuredOutputs>>,
}

/// Serde for the shared lists, as plain lists (serde's `rc` feature would do
/// the same, but switching it on rebuilds every crate that uses serde).
mod shared {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::sync::Arc;

    pub fn serialize<T: Serialize, S: Serializer>(v: &Arc<[T]>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter())
    }

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Arc<[T]>, D::Error> {
        Vec::<T>::deserialize(d).map(Arc::from)
    }
}

mod shared_opt {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::sync::Arc;

    pub fn serialize<T: Serialize, S: Serializer>(
        v: &Option<Arc<[T]>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        v.as_deref().serialize(s)
    }

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Arc<[T]>>, D::Error> {
        Ok(Option::<Vec<T>>::deserialize(d)?.map(Arc::from))
    }
}

mod shared_so {
    use crate::StructuredOutputs;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::sync::Arc;

    pub fn serialize<S: Serializer>(
        v: &Option<Arc<StructuredOutputs>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        v.as_deref().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Arc<StructuredOutputs>>, D::Error> {
        Ok(Option::<StructuredOutputs>::deserialize(d)?.map(Arc::new))
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            max_tokens: Some(16),
            min_tokens: 0,
            stop_token_ids: Arc::new([]),
            stop: StopStrings::default(),
            include_stop_str_in_output: false,
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            logprob_token_ids: None,
            bad_words_token_ids: Arc::new([]),
            logit_bias: Arc::new([]),
            allowed_token_ids: None,
            skip_special_tokens: true,
            structured_outputs: None,
        }
    }
}

/// Most top logprobs the engine computes per token: the ceiling of a server's
/// `--max-logprobs`, whose default is [`DEFAULT_MAX_LOGPROBS`].
pub const MAX_LOGPROBS: usize = 1024;
/// vLLM's default `--max-logprobs` (OpenAI allows 20 for chat).
pub const DEFAULT_MAX_LOGPROBS: usize = 20;

/// `prompt_logprobs` value for "every token of the vocabulary" (vLLM's `-1`).
pub const ALL_PROMPT_LOGPROBS: usize = usize::MAX;

/// Bounds on `repetition_penalty`. vLLM only asks for `> 0`; a penalty of 1e-38
/// divides a positive logit past `f32::MAX`, so Pagoda bounds it where it enters:
/// within `[0.01, 100]` a penalized logit stays within 100x of the model's, which
/// is finite, and every useful setting (vLLM's docs use 1.0-2.0) is kept.
pub const REPETITION_PENALTY_RANGE: (f32, f32) = (0.01, 100.0);
/// Bound on each `logit_bias` value, as OpenAI and vLLM (which clamps to it).
pub const MAX_ABS_LOGIT_BIAS: f32 = 100.0;
/// Bound on presence and frequency penalties (OpenAI's and vLLM's `[-2, 2]`).
pub const MAX_ABS_PENALTY: f32 = 2.0;

impl SamplingParams {
    /// Greedy decoding with a token limit.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams {
            temperature: 0.0,
            max_tokens: Some(max_tokens),
            ..Default::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature < 1e-5
    }

    /// Checks every field; the first bad one is reported by name.
    pub fn validate(&self) -> Result<(), CoreError> {
        fn bad(param: &'static str, message: String) -> Result<(), CoreError> {
            Err(CoreError::InvalidSamplingParam { param, message })
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(
                "temperature",
                format!("must be >= 0, got {}", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("must be in [0, 1], got {}", self.min_p));
        }
        let pen = -MAX_ABS_PENALTY..=MAX_ABS_PENALTY;
        if !pen.contains(&self.presence_penalty) {
            return bad(
                "presence_penalty",
                format!("must be in [-2, 2], got {}", self.presence_penalty),
            );
        }
        if !pen.contains(&self.frequency_penalty) {
            return bad(
                "frequency_penalty",
                format!("must be in [-2, 2], got {}", self.frequency_penalty),
            );
        }
        let (lo, hi) = REPETITION_PENALTY_RANGE;
        if !(lo..=hi).contains(&self.repetition_penalty) {
            return bad(
                "repetition_penalty",
                format!(
                    "must be in [{lo}, {hi}] (1 disables it), got {}",
                    self.repetition_penalty
                ),
            );
        }
        if self.max_tokens == Some(0) {
            return bad("max_tokens", "must be at least 1".into());
        }
        if let Some(max) = self.max_tokens {
            if self.min_tokens > max {
                return bad(
                    "min_tokens",
                    format!("{} exceeds max_tokens {}", self.min_tokens, max),
                );
            }
        }
        if let Some(n) = self.logprobs {
            if n > MAX_LOGPROBS {
                return bad(
                    "logprobs",
                    format!("must be at most {MAX_LOGPROBS}, got {n}"),
                );
            }
        }
        if let Some(n) = self.prompt_logprobs {
            if n > MAX_LOGPROBS && n != ALL_PROMPT_LOGPROBS {
                return bad(
                    "prompt_logprobs",
                    format!("must be at most {MAX_LOGPROBS} (or -1 for all), got {n}"),
                );
            }
        }
        if self
            .allowed_token_ids
            .as_ref()
            .is_some_and(|a| a.is_empty())
        {
            return bad(
                "allowed_token_ids",
                "allowed_token_ids is not allowed to be empty".into(),
            );
        }
        if self.bad_words_token_ids.iter().any(|w| w.is_empty()) {
            return bad(
                "bad_words",
                "a bad word must have at least one token".into(),
            );
        }
        if self
            .logprob_token_ids
            .as_ref()
            .is_some_and(|a| a.is_empty())
        {
            return bad(
                "logprob_token_ids",
                "logprob_token_ids must not be empty".into(),
            );
        }
        if let Some(so) = &self.structured_outputs {
            so.validate()?;
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return bad("stop", "stop strings must not be empty".into());
        }
        if let Some((t, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-MAX_ABS_LOGIT_BIAS..=MAX_ABS_LOGIT_BIAS).contains(b))
        {
            return bad(
                "logit_bias",
                format!("the bias of token {t} must be in [-100, 100], got {b}"),
            );
        }
        Ok(())
    }
}

/// Sampling parameters checked once, where a request enters the engine: they passed
/// [`SamplingParams::validate`] and every token id they name is inside the model's
/// vocabulary. The layers below (scheduler, runner, sampler) take this type and
/// never check again. Read the parameters through `Deref`.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedParams {
    params: SamplingParams,
    vocab_size: usize,
}

impl CheckedParams {
    /// The vocabulary size the ids were checked against.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn into_inner(self) -> SamplingParams {
        self.params
    }

    /// The engine's defaults for what the client left open, which keep the
    /// parameters valid: a seed, and `max_tokens` capped by the `room` left in the
    /// context (at least 1), `min_tokens` by `max_tokens`.
    pub fn fill_defaults(&mut self, seed: u64, room: usize) {
        let p = &mut self.params;
        p.seed.get_or_insert(seed);
        let room = room.max(1);
        p.max_tokens = Some(p.max_tokens.map_or(room, |m| m.min(room)));
        p.min_tokens = p.min_tokens.min(p.max_tokens.unwrap_or(0));
    }
}

impl std::ops::Deref for CheckedParams {
    type Target = SamplingParams;
    fn deref(&self) -> &SamplingParams {
        &self.params
    }
}

impl SamplingParams {
    /// [`Self::validate`], then every token id checked against `vocab_size`:
    /// the one check a request's parameters get (see [`CheckedParams`]).
    pub fn checked(self, vocab_size: usize) -> Result<CheckedParams, CoreError> {
        self.validate()?;
        let ids = self
            .stop_token_ids
            .iter()
            .map(|&t| ("stop_token_ids", t))
            .chain(
                self.allowed_token_ids
                    .iter()
                    .flat_map(|a| a.iter())
                    .map(|&t| ("allowed_token_ids", t)),
            )
            .chain(self.logit_bias.iter().map(|&(t, _)| ("logit_bias", t)))
            .chain(
                self.logprob_token_ids
                    .iter()
                    .flat_map(|a| a.iter())
                    .map(|&t| ("logprob_token_ids", t)),
            )
            .chain(
                self.bad_words_token_ids
                    .iter()
                    .flatten()
                    .map(|&t| ("bad_words", t)),
            );
        for (param, t) in ids {
            if t as usize >= vocab_size {
                return Err(CoreError::InvalidSamplingParam {
                    param,
                    message: format!("token id {t} is outside the vocabulary ({vocab_size})"),
                });
            }
        }
        Ok(CheckedParams {
            params: self,
            vocab_size,
        })
    }
}

/// One request inside the scheduler. Token ids only: prompt then outputs.
#[derive(Debug, Clone)]
pub struct Request {
    pub request_id: RequestId,
    /// Prompt followed by generated tokens.
    all_token_ids: Vec<u32>,
    num_prompt_tokens: usize,
    pub sampling_params: CheckedParams,
    /// Token ids that end the request unless `ignore_eos` (the model's EOS ids).
    pub eos_token_ids: Vec<u32>,
    pub status: RequestStatus,
    /// Tokens whose KV is in the cache (advanced at schedule time, like vLLM V1).
    pub num_computed_tokens: usize,
    /// Prompt tokens served from the prefix cache at first scheduling.
    pub num_cached_tokens: usize,
    pub num_preemptions: usize,
    /// Lower runs first when the scheduler uses priorities; FCFS otherwise.
    pub priority: i32,
    /// Monotonic arrival order, assigned by the scheduler.
    pub arrival_seq: u64,
    /// Mixed into the first block's hash so tenants do not share cache.
    pub cache_salt: Option<String>,
    /// The API request this one is a sample of (its `n` samples and prompts share
    /// it): the scheduler caps the seats one group holds while others wait.
    /// `None`: a group of its own.
    pub group: Option<u64>,
    /// Hashes of the full blocks of `all_token_ids`, maintained by the KV cache manager.
    pub block_hashes: Vec<BlockHash>,
    pub stop_reason: Option<StopReason>,
    /// Draft tokens proposed for the next step (speculative decoding, vLLM's
    /// `spec_token_ids`): not part of `all_token_ids`; the scheduler schedules them
    /// after the last known token and drops them once scheduled or on preemption.
    pub spec_token_ids: Vec<u32>,
}

impl Request {
    pub fn new(
        request_id: impl Into<RequestId>,
        prompt_token_ids: Vec<u32>,
        sampling_params: CheckedParams,
        eos_token_ids: Vec<u32>,
    ) -> Self {
        let num_prompt_tokens = prompt_token_ids.len();
        Request {
            request_id: request_id.into(),
            all_token_ids: prompt_token_ids,
            num_prompt_tokens,
            sampling_params,
            eos_token_ids,
            status: RequestStatus::Waiting,
            num_computed_tokens: 0,
            num_cached_tokens: 0,
            num_preemptions: 0,
            priority: 0,
            arrival_seq: 0,
            cache_salt: None,
            group: None,
            block_hashes: Vec::new(),
            stop_reason: None,
            spec_token_ids: Vec::new(),
        }
    }

    pub fn with_cache_salt(mut self, salt: Option<String>) -> Self {
        self.cache_salt = salt;
        self
    }

    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    pub fn with_group(mut self, group: Option<u64>) -> Self {
        self.group = group;
        self
    }

    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }
    pub fn num_tokens(&self) -> usize {
        self.all_token_ids.len()
    }
    pub fn num_output_tokens(&self) -> usize {
        self.all_token_ids.len() - self.num_prompt_tokens
    }
    pub fn all_token_ids(&self) -> &[u32] {
        &self.all_token_ids
    }
    pub fn prompt_token_ids(&self) -> &[u32] {
        &self.all_token_ids[..self.num_prompt_tokens]
    }
    pub fn output_token_ids(&self) -> &[u32] {
        &self.all_token_ids[self.num_prompt_tokens..]
    }
    pub fn append_output_token(&mut self, token: u32) {
        self.all_token_ids.push(token);
    }
    pub fn is_finished(&self) -> bool {
        self.status.is_finished()
    }
    /// The cap on this request's output tokens: `max_tokens`, or `usize::MAX`
    /// (only the model length bounds it) when that is None.
    pub fn max_tokens(&self) -> usize {
        self.sampling_params.max_tokens.unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_names_ids_outside_the_vocabulary() {
        for (p, field) in [
            (
                SamplingParams {
                    stop_token_ids: vec![3, 10].into(),
                    ..Default::default()
                },
                "stop_token_ids",
            ),
            (
                SamplingParams {
                    allowed_token_ids: Some(vec![10].into()),
                    ..Default::default()
                },
                "allowed_token_ids",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(12, 1.0)].into(),
                    ..Default::default()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    logprob_token_ids: Some(vec![0, 10].into()),
                    ..Default::default()
                },
                "logprob_token_ids",
            ),
            (
                SamplingParams {
                    bad_words_token_ids: vec![vec![1, 99]].into(),
                    ..Default::default()
                },
                "bad_words",
            ),
        ] {
            match p.clone().checked(10) {
                Err(CoreError::InvalidSamplingParam { param, .. }) => assert_eq!(param, field),
                other => panic!("{field}: unexpected {other:?}"),
            }
            assert!(p.checked(100).is_ok());
        }
        // validate() runs too.
        let bad = SamplingParams {
            top_p: 2.0,
            ..Default::default()
        };
        assert!(bad.checked(10).is_err());
    }

    #[test]
    fn fill_defaults_keeps_the_params_valid() {
        let mut c = SamplingParams {
            min_tokens: 50,
            max_tokens: None,
            ..Default::default()
        }
        .checked(10)
        .unwrap();
        c.fill_defaults(7, 20);
        assert_eq!(
            (c.seed, c.max_tokens, c.min_tokens),
            (Some(7), Some(20), 20)
        );
        assert!(c.validate().is_ok());
        let mut c = SamplingParams {
            seed: Some(1),
            max_tokens: Some(5),
            ..Default::default()
        }
        .checked(10)
        .unwrap();
        c.fill_defaults(7, 20);
        assert_eq!((c.seed, c.max_tokens), (Some(1), Some(5)));
    }

    #[test]
    fn validate_names_the_bad_field() {
        let p = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        match p.validate() {
            Err(CoreError::InvalidSamplingParam { param, .. }) => assert_eq!(param, "top_p"),
            other => panic!("unexpected {other:?}"),
        }
        let p = SamplingParams {
            temperature: -1.0,
            ..Default::default()
        };
        assert!(p.validate().is_err());
        assert!(SamplingParams::greedy(4).validate().is_ok());
    }

    /// Issue 29 D5: the `n` samples of a request (and every layer's copy) share
    /// its lists instead of copying them.
    #[test]
    fn clones_share_the_lists() {
        let p = SamplingParams {
            stop: (0..1000)
                .map(|i| format!("s{i}"))
                .collect::<Vec<_>>()
                .into(),
            stop_token_ids: (0..1000).collect::<Vec<u32>>().into(),
            bad_words_token_ids: vec![vec![1, 2]; 1000].into(),
            logit_bias: (0..1000).map(|t| (t, 1.0)).collect::<Vec<_>>().into(),
            allowed_token_ids: Some((0..1000).collect::<Vec<u32>>().into()),
            logprob_token_ids: Some((0..1000).collect::<Vec<u32>>().into()),
            structured_outputs: Some(Arc::new(crate::StructuredOutputs::new(
                crate::Constraint::Choice((0..1000).map(|i| i.to_string()).collect()),
            ))),
            ..Default::default()
        };
        let checked = p.clone().checked(2000).unwrap();
        let mut sample = checked.clone();
        sample.fill_defaults(3, 10);
        for q in [&p, &*sample] {
            assert!(q.stop.shares_with(&p.stop));
            assert!(Arc::ptr_eq(&q.stop_token_ids, &p.stop_token_ids));
            assert!(Arc::ptr_eq(&q.bad_words_token_ids, &p.bad_words_token_ids));
            assert!(Arc::ptr_eq(&q.logit_bias, &p.logit_bias));
            let same = |a: &Option<Arc<[u32]>>, b: &Option<Arc<[u32]>>| {
                Arc::ptr_eq(a.as_ref().unwrap(), b.as_ref().unwrap())
            };
            assert!(same(&q.allowed_token_ids, &p.allowed_token_ids));
            assert!(same(&q.logprob_token_ids, &p.logprob_token_ids));
            let (a, b) = (&q.structured_outputs, &p.structured_outputs);
            assert!(Arc::ptr_eq(a.as_ref().unwrap(), b.as_ref().unwrap()));
        }
        // The serde form is unchanged: plain lists.
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["stop"][1], "s1");
        assert_eq!(v["logit_bias"][2], serde_json::json!([2, 1.0]));
        let back: SamplingParams = serde_json::from_value(v).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn request_token_views() {
        let p = SamplingParams::greedy(4).checked(8).unwrap();
        let mut r = Request::new("a", vec![1, 2, 3], p, vec![0]);
        r.append_output_token(9);
        assert_eq!(r.prompt_token_ids(), &[1, 2, 3]);
        assert_eq!(r.output_token_ids(), &[9]);
        assert_eq!(r.num_tokens(), 4);
    }
}
