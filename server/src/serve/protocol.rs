//! OpenAI (and vLLM-extension) request bodies, and their translation into the
//! engine's [`SamplingParams`]. Pure code: no I/O, no engine.
//!
//! Every field is optional and `null` means "not given", as OpenAI clients expect;
//! fields Pagoda does not implement are refused by name ([`fields`]).

pub mod fields;
pub mod structured;

use super::error::ApiError;
use pagoda_core::SamplingParams;
use serde::Deserialize;
use std::collections::HashMap;

/// Most samples one request may ask for with `n`.
pub const MAX_N: usize = 128;
/// Largest `logprobs` / `top_logprobs` (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: usize = pagoda_core::request::MAX_LOGPROBS;
/// `logprobs: -1`: the whole vocabulary (checked against `--max-logprobs` by the handlers).
pub const ALL_LOGPROBS: usize = usize::MAX;

/// A completions prompt: text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum StringOrList {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    /// With `include_usage`: every chunk carries its choice's usage so far (vLLM).
    pub continuous_usage_stats: Option<bool>,
}

/// Fields shared by `/v1/completions` and `/v1/chat/completions`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct CommonFields {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StringOrList>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    pub n: Option<i64>,
    /// Token id (as a string, per OpenAI) -> bias added to its logit.
    pub logit_bias: Option<HashMap<String, f64>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub cache_salt: Option<String>,
    pub include_stop_str_in_output: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    /// vLLM extension: logprob tokens as `token_id:N` instead of text.
    pub return_tokens_as_token_ids: Option<bool>,
    /// vLLM extension: lower is scheduled first (`--scheduling-policy priority`).
    pub priority: Option<i64>,
    /// vLLM extension: whether the tokenizer adds special tokens (BOS) to the
    /// prompt (completions: yes by default; chat: no, the template has them).
    pub add_special_tokens: Option<bool>,
    /// vLLM extension: keep only this many prompt tokens (-1: the context length).
    pub truncate_prompt_tokens: Option<i64>,
    /// Which end `truncate_prompt_tokens` keeps: `left` (default) drops the start.
    pub truncation_side: Option<String>,
    /// vLLM extension: only these token ids may be generated.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// vLLM extension: return prompt and output token ids beside the text.
    pub return_token_ids: Option<bool>,
    /// vLLM extension: logprobs of the prompt's tokens with this many alternatives
    /// (-1: the whole vocabulary).
    pub prompt_logprobs: Option<i64>,
    /// vLLM extension: words that must not be generated (tokenized by the server).
    pub bad_words: Option<Vec<String>>,
    /// vLLM extension: report the logprobs of exactly these tokens per position.
    pub logprob_token_ids: Option<Vec<u32>>,
    /// OpenAI: `{"type": "text" | "json_object" | "json_schema", ...}`.
    pub response_format: Option<serde_json::Value>,
    /// vLLM: `{"json" | "regex" | "choice" | "grammar" | "json_object": ..., options}`.
    pub structured_outputs: Option<serde_json::Value>,
}

impl CommonFields {
    /// The prompt length to truncate to, checked against the context length.
    pub fn truncation(&self, max_model_len: usize) -> Result<Option<(usize, bool)>, ApiError> {
        let left = match self.truncation_side.as_deref() {
            None | Some("left") => true,
            Some("right") => false,
            Some(other) => {
                return Err(ApiError::bad(
                    "truncation_side",
                    format!("truncation_side must be `left` or `right`, got `{other}`"),
                ))
            }
        };
        match self.truncate_prompt_tokens {
            None => Ok(None),
            Some(-1) => Ok(Some((max_model_len, left))),
            Some(k) if k >= 1 && (k as u64) <= max_model_len as u64 => Ok(Some((k as usize, left))),
            Some(k) => Err(ApiError::bad(
                "truncate_prompt_tokens",
                format!(
                    "truncate_prompt_tokens value ({k}) must be -1 or in [1, max_model_len = {max_model_len}]"
                ),
            )),
        }
    }
}

/// Token ids a field names must be in the vocabulary: a 400 naming the field
/// and every id outside it ("out of vocabulary", vLLM's words).
pub fn check_in_vocab(field: &str, ids: &[u32], vocab_size: usize) -> Result<(), ApiError> {
    let mut bad: Vec<u32> = ids
        .iter()
        .copied()
        .filter(|&t| t as usize >= vocab_size)
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    bad.sort_unstable();
    bad.dedup();
    let list: Vec<String> = bad.iter().map(u32::to_string).collect();
    Err(ApiError::bad(
        field,
        format!(
            "{field}: token id {} is out of vocabulary (vocabulary size {vocab_size})",
            list.join(", ")
        ),
    ))
}

/// `logit_bias` checked as a whole: one 400 naming the field and every bad
/// key (not a token id, out of vocabulary, or a bias outside [-100, 100]).
fn logit_bias(bias: &HashMap<String, f64>, vocab_size: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let (mut not_ids, mut oov, mut range) = (Vec::new(), Vec::new(), Vec::new());
    let mut v = Vec::with_capacity(bias.len());
    for (k, &b) in bias {
        match k.trim().parse::<u32>() {
            Err(_) => not_ids.push(format!("`{k}`")),
            Ok(id) if id as usize >= vocab_size => oov.push(id.to_string()),
            Ok(id) if !(-100.0..=100.0).contains(&b) => range.push(format!("{id} ({b})")),
            Ok(id) => v.push((id, b as f32)),
        }
    }
    let mut problems = Vec::new();
    for (list, what) in [
        (&mut not_ids, "are not token ids"),
        (
            &mut oov,
            "are out of vocabulary (vocabulary size {vocab_size})",
        ),
        (&mut range, "have a bias outside [-100, 100]"),
    ] {
        if !list.is_empty() {
            // HashMap order is random: sorted, so the message is stable.
            list.sort();
            let what = what.replace("{vocab_size}", &vocab_size.to_string());
            problems.push(format!("keys {} {what}", list.join(", ")));
        }
    }
    if !problems.is_empty() {
        return Err(ApiError::bad(
            "logit_bias",
            format!("logit_bias: {}", problems.join("; ")),
        ));
    }
    v.sort_by_key(|&(id, _)| id);
    Ok(v)
}

/// Keeps `k` tokens of `ids`: the last ones when `left` (the start is dropped).
pub fn truncate_ids(ids: &mut Vec<u32>, k: usize, left: bool) {
    if ids.len() > k {
        if left {
            ids.drain(..ids.len() - k);
        } else {
            ids.truncate(k);
        }
    }
}

impl CommonFields {
    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }
    /// vLLM's `continuous_usage_stats`, effective only with `include_usage`.
    pub fn continuous_usage(&self) -> bool {
        self.include_usage()
            && self
                .stream_options
                .as_ref()
                .and_then(|o| o.continuous_usage_stats)
                .unwrap_or(false)
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }
    /// The scheduling priority, checked: any value needs priority scheduling on,
    /// except 0 (the default), as in vLLM.
    pub fn priority(&self, enabled: bool) -> Result<i32, ApiError> {
        match self.priority {
            None | Some(0) => Ok(0),
            Some(p) if !enabled => Err(ApiError::bad(
                "priority",
                format!("Got priority {p} but Priority scheduling is not enabled (start the server with --scheduling-policy priority)."),
            )),
            Some(p) => i32::try_from(p).map_err(|_| {
                ApiError::bad("priority", format!("priority must fit in 32 bits, got {p}"))
            }),
        }
    }

    /// `prompt_logprobs`, checked with vLLM's rules and wording.
    pub fn prompt_logprobs(&self) -> Result<Option<usize>, ApiError> {
        let Some(k) = self.prompt_logprobs else {
            return Ok(None);
        };
        if self.stream() && (k > 0 || k == -1) {
            return Err(ApiError::bad(
                "prompt_logprobs",
                "`prompt_logprobs` are not available when `stream=True`.",
            ));
        }
        match k {
            -1 => Ok(Some(pagoda_core::ALL_PROMPT_LOGPROBS)),
            k if k < 0 => Err(ApiError::bad(
                "prompt_logprobs",
                "`prompt_logprobs` must be a positive value or -1.",
            )),
            k if k as u64 > MAX_LOGPROBS as u64 => Err(ApiError::bad(
                "prompt_logprobs",
                format!(
                    "Requested prompt logprobs of {k}, which is greater than max allowed: {MAX_LOGPROBS}"
                ),
            )),
            k => Ok(Some(k as usize)),
        }
    }

    /// Number of samples, checked.
    pub fn n(&self) -> Result<usize, ApiError> {
        match self.n {
            None => Ok(1),
            Some(n) if n >= 1 && n as usize <= MAX_N => Ok(n as usize),
            Some(n) => Err(ApiError::bad(
                "n",
                format!("n must be in [1, {MAX_N}], got {n}"),
            )),
        }
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: CommonFields,
    pub prompt: Option<PromptField>,
    pub echo: Option<bool>,
    /// Completions style: how many top logprobs per token (0 = just the sampled one).
    pub logprobs: Option<i64>,
}

/// A chat message's content: text or a list of typed parts (only text parts count).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// An assistant message's calls (`[{id, type, function: {name, arguments}}]`),
    /// checked and handed to the template by `chat::template_messages`.
    #[serde(default)]
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` message's answer to this call.
    #[serde(default)]
    pub tool_call_id: Option<serde_json::Value>,
    #[serde(default)]
    pub name: Option<serde_json::Value>,
    /// An earlier answer's reasoning (vLLM's field and its older name), for
    /// templates that show it.
    #[serde(default)]
    pub reasoning: Option<String>,
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

impl ChatMessageIn {
    /// The message text; non-text parts are an error rather than silently dropped.
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(MessageContent::Text(t)) => Ok(t.clone()),
            Some(MessageContent::Parts(parts)) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => out.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::bad(
                                "messages",
                                format!("unsupported content part type `{kind}`"),
                            ))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ChatRequest {
    #[serde(flatten)]
    pub common: CommonFields,
    pub messages: Option<Vec<ChatMessageIn>>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub add_generation_prompt: Option<bool>,
    /// vLLM: leave the final (assistant) message open and continue it.
    pub continue_final_message: Option<bool>,
    /// vLLM: prefix the answer with the final message when it is the assistant's.
    pub echo: Option<bool>,
    /// vLLM: extra variables for the chat template.
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Function tools (checked by `tools::choice::parse_tools`) and the choice.
    pub tools: Option<serde_json::Value>,
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    /// vLLM: `false` leaves the reasoning out of the answer.
    pub include_reasoning: Option<bool>,
}

impl ChatRequest {
    /// `max_completion_tokens` wins over the deprecated `max_tokens`.
    pub fn max_tokens(&self) -> Option<i64> {
        self.max_completion_tokens.or(self.common.max_tokens)
    }

    /// Chat style: `logprobs: bool` plus `top_logprobs: int`.
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        // -1 is vLLM's "the whole vocabulary" (then bounded by `--max-logprobs`).
        let top = match self.top_logprobs {
            None => None,
            Some(-1) => Some(ALL_LOGPROBS),
            Some(k) if k >= 0 => Some(usize::try_from(k).unwrap_or(ALL_LOGPROBS)),
            Some(k) => {
                return Err(ApiError::bad(
                    "top_logprobs",
                    format!("top_logprobs must be -1 or at least 0, got {k}"),
                ))
            }
        };
        match (self.logprobs.unwrap_or(false), top) {
            (true, top) => Ok(Some(top.unwrap_or(0))),
            (false, Some(k)) if k > 0 => Err(ApiError::bad(
                "top_logprobs",
                "top_logprobs requires logprobs to be true",
            )),
            (false, _) => Ok(None),
        }
    }
}

impl CompletionRequest {
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match self.logprobs {
            None => Ok(None),
            Some(-1) => Ok(Some(ALL_LOGPROBS)),
            Some(k) if k >= 0 => Ok(Some(usize::try_from(k).unwrap_or(ALL_LOGPROBS))),
            Some(k) => Err(ApiError::bad(
                "logprobs",
                format!("logprobs must be -1 or at least 0, got {k}"),
            )),
        }
    }
}

/// `POST /tokenize`: a completions-style prompt or chat messages.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessageIn>>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Shown to the chat template as in a chat request.
    pub tools: Option<serde_json::Value>,
    pub return_token_strs: Option<bool>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Option<Vec<u32>>,
}

/// Parses a generation request: its fields checked by [`fields::check_fields`],
/// then the typed body. `model: ""` means the served model, as in vLLM.
pub fn parse_generation<T: serde::de::DeserializeOwned>(
    body: &[u8],
    chat: bool,
    strict_fields: bool,
) -> Result<T, ApiError> {
    let mut v: serde_json::Value = parse_body(body)?;
    fields::coerce_bools(&mut v, chat);
    fields::check_fields(&v, chat, strict_fields)?;
    if let Some(m) = v.get_mut("model") {
        if m.as_str() == Some("") {
            *m = serde_json::Value::Null;
        }
    }
    serde_json::from_value(v).map_err(ApiError::from_json)
}

/// Chat rendering options, checked: `add_generation_prompt` defaults to true
/// unless `continue_final_message` is set; both true is vLLM's 400.
pub fn chat_mode(
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
) -> Result<(bool, bool), ApiError> {
    let cont = continue_final_message.unwrap_or(false);
    match add_generation_prompt {
        Some(true) if cont => Err(ApiError::bad(
            "continue_final_message",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        )),
        Some(add) => Ok((add, cont)),
        None => Ok((!cont, cont)),
    }
}

/// Parses a JSON body; any mismatch is a 400.
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::BadRequest {
            message: "the request body is empty; expected JSON".into(),
            param: None,
        });
    }
    serde_json::from_slice(body).map_err(ApiError::from_json)
}

fn finite(param: &str, v: f64) -> Result<f32, ApiError> {
    if v.is_finite() {
        Ok(v as f32)
    } else {
        Err(ApiError::bad(
            param,
            format!("{param} must be a finite number"),
        ))
    }
}

/// Builds and validates the sampling parameters of one sample.
///
/// `max_tokens` is passed separately because chat prefers `max_completion_tokens`;
/// `logprobs` is already resolved to "top-k count or none".
pub fn sampling_params(
    c: &CommonFields,
    max_tokens: Option<i64>,
    logprobs: Option<usize>,
    vocab_size: usize,
) -> Result<SamplingParams, ApiError> {
    let max_tokens = match max_tokens {
        None => None,
        Some(m) if m >= 1 => Some(m as usize),
        Some(m) => {
            return Err(ApiError::bad(
                "max_tokens",
                format!("max_tokens must be at least 1, got {m}"),
            ))
        }
    };
    let mut p = SamplingParams {
        max_tokens,
        ..Default::default()
    };
    if let Some(t) = c.temperature {
        p.temperature = finite("temperature", t)?;
        if t < 0.0 {
            return Err(ApiError::bad(
                "temperature",
                format!("temperature must be >= 0, got {t}"),
            ));
        }
    }
    if let Some(v) = c.top_p {
        p.top_p = finite("top_p", v)?;
        if !(v > 0.0 && v <= 1.0) {
            return Err(ApiError::bad(
                "top_p",
                format!("top_p must be in (0, 1], got {v}"),
            ));
        }
    }
    if let Some(k) = c.top_k {
        // -1 and 0 both mean "disabled", as in vLLM.
        if k < -1 {
            return Err(ApiError::bad(
                "top_k",
                format!("top_k must be -1 (disabled) or >= 1, got {k}"),
            ));
        }
        p.top_k = k.clamp(0, i32::MAX as i64) as i32;
    }
    if let Some(v) = c.min_p {
        p.min_p = finite("min_p", v)?;
    }
    if let Some(v) = c.presence_penalty {
        p.presence_penalty = finite("presence_penalty", v)?;
    }
    if let Some(v) = c.frequency_penalty {
        p.frequency_penalty = finite("frequency_penalty", v)?;
    }
    if let Some(v) = c.repetition_penalty {
        p.repetition_penalty = finite("repetition_penalty", v)?;
    }
    // Seeds are any integer; negative ones wrap, so every seed is usable.
    p.seed = c.seed.map(|s| s as u64);
    p.stop = match &c.stop {
        None => Vec::new(),
        Some(StringOrList::One(s)) => vec![s.clone()],
        Some(StringOrList::Many(v)) => v.clone(),
    }
    .into();
    if let Some(ids) = &c.stop_token_ids {
        check_in_vocab("stop_token_ids", ids, vocab_size)?;
        p.stop_token_ids = ids.as_slice().into();
    }
    if let Some(ids) = &c.allowed_token_ids {
        check_in_vocab("allowed_token_ids", ids, vocab_size)?;
        p.allowed_token_ids = Some(ids.as_slice().into());
    }
    p.ignore_eos = c.ignore_eos.unwrap_or(false);
    if let Some(m) = c.min_tokens {
        if m < 0 {
            return Err(ApiError::bad(
                "min_tokens",
                format!("min_tokens must be >= 0, got {m}"),
            ));
        }
        p.min_tokens = m as usize;
    }
    if let Some(bias) = &c.logit_bias {
        p.logit_bias = logit_bias(bias, vocab_size)?.into();
    }
    p.include_stop_str_in_output = c.include_stop_str_in_output.unwrap_or(false);
    p.skip_special_tokens = c.skip_special_tokens.unwrap_or(true);
    p.logprobs = logprobs;
    p.prompt_logprobs = c.prompt_logprobs()?;
    if let Some(ids) = &c.logprob_token_ids {
        check_in_vocab("logprob_token_ids", ids, vocab_size)?;
        p.logprob_token_ids = Some(ids.as_slice().into());
    }
    p.structured_outputs =
        structured::parse(c.response_format.as_ref(), c.structured_outputs.as_ref())?
            .map(std::sync::Arc::new);
    // The bounds of `SamplingParams::validate` are checked once, where the request
    // enters the engine (`EngineHandle::submit`); this only parses.
    Ok(p)
}

/// The parameters of sample `i` of `n`: seeds are offset so samples differ but
/// stay reproducible.
pub fn params_for_sample(base: &SamplingParams, i: usize) -> SamplingParams {
    let mut p = base.clone();
    p.seed = base.seed.map(|s| s.wrapping_add(i as u64));
    p
}

/// Rejects prompts that are empty or leave no room to generate in the context.
pub fn check_prompt_len(
    len: usize,
    max_tokens: Option<usize>,
    max_model_len: usize,
) -> Result<(), ApiError> {
    if len == 0 {
        return Err(ApiError::bad("prompt", "the prompt is empty"));
    }
    if len >= max_model_len {
        return Err(ApiError::bad(
            "prompt",
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your prompt has {len} tokens, \
                 which leaves no room for the completion."
            ),
        ));
    }
    if let Some(m) = max_tokens {
        if len + m > max_model_len {
            return Err(ApiError::bad(
                "max_tokens",
                format!(
                    "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens \
                     ({len} in the prompt, {m} in the completion).",
                    len + m
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
