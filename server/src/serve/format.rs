//! OpenAI response shapes: per-choice state, logprobs objects, SSE chunks and
//! usage. Pure code over [`RequestOutput`]s; streaming and collecting both use it,
//! so streamed and non-streamed answers cannot drift apart.

use super::metrics::{Metrics, RequestTimer};
use pagoda_core::{FinishReason, PromptLogprob, StopReason, TokenLogprobs};
use pagoda_engine::RequestOutput;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

/// Which API a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completion,
    Chat,
}

/// Turns token ids into the strings shown in logprobs.
pub trait TokenText: Send + Sync {
    /// The text of one token on its own (special tokens included).
    fn token_text(&self, id: u32) -> String;
}

impl<F: Fn(u32) -> String + Send + Sync> TokenText for F {
    fn token_text(&self, id: u32) -> String {
        self(id)
    }
}

/// What every chunk and response of one HTTP request shares.
pub struct Ctx {
    pub api: Api,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Whether logprobs were asked for (the count of top entries is the engine's).
    pub logprobs: bool,
    /// vLLM's `return_tokens_as_token_ids`: logprob tokens as `token_id:N`.
    pub tokens_as_ids: bool,
    pub include_usage: bool,
    /// Every chunk carries its choice's usage so far (`continuous_usage_stats`).
    pub continuous_usage: bool,
    /// vLLM's `return_token_ids`: prompt and output token ids beside the text.
    pub return_token_ids: bool,
    /// vLLM's `prompt_logprobs` was asked for: answer it (completions per choice,
    /// chat at the top level).
    pub prompt_logprobs: bool,
    pub text: Arc<dyn TokenText>,
    pub metrics: Arc<Metrics>,
    /// Chat with tools or a reasoning parser: how each choice's text is split
    /// into reasoning, content and tool calls.
    pub shaping: Option<Arc<super::shape::Shaping>>,
}

impl Ctx {
    fn token_label(&self, id: u32, text: &str) -> String {
        if self.tokens_as_ids {
            format!("token_id:{id}")
        } else {
            text.to_string()
        }
    }

    /// `object` of a streamed chunk.
    pub fn chunk_object(&self) -> &'static str {
        match self.api {
            Api::Completion => "text_completion",
            Api::Chat => "chat.completion.chunk",
        }
    }

    /// A streamed chunk for one choice.
    pub fn chunk(
        &self,
        index: usize,
        text: &str,
        logprobs: Option<Value>,
        finish: Option<FinishReason>,
        stop_reason: Value,
        first: bool,
    ) -> Value {
        let finish = finish.map(|f| f.as_str());
        let choice = match self.api {
            Api::Completion => json!({
                "index": index, "text": text, "logprobs": logprobs,
                "finish_reason": finish, "stop_reason": stop_reason,
            }),
            Api::Chat => {
                let mut delta = Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if first || !text.is_empty() {
                    delta.insert("content".into(), text.into());
                }
                json!({
                    "index": index, "delta": delta, "logprobs": logprobs,
                    "finish_reason": finish, "stop_reason": stop_reason,
                })
            }
        };
        json!({"id": self.id, "object": self.chunk_object(), "created": self.created, "model": self.model, "choices": [choice]})
    }

    /// The trailing usage chunk (`choices: []`).
    pub fn usage_chunk(&self, usage: Value) -> Value {
        json!({"id": self.id, "object": self.chunk_object(), "created": self.created, "model": self.model, "choices": [], "usage": usage})
    }

    /// The non-streamed response.
    pub fn response(&self, states: &[ChoiceState]) -> Value {
        let choices: Vec<Value> = states
            .iter()
            .map(|s| {
                let finish = s.finish_reason.unwrap_or(FinishReason::Abort).as_str();
                match self.api {
                    Api::Completion => {
                        let mut c = json!({
                            "index": s.index, "text": s.text, "logprobs": s.logprobs,
                            "finish_reason": finish, "stop_reason": s.stop_reason_json(),
                        });
                        if self.prompt_logprobs {
                            c["prompt_logprobs"] = s.prompt_logprobs.clone().unwrap_or(Value::Null);
                        }
                        c
                    }
                    Api::Chat => {
                        let (message, finish) = match &self.shaping {
                            None => (json!({"role": "assistant", "content": s.text}), finish),
                            Some(cfg) => s.shaped_message(cfg),
                        };
                        json!({
                            "index": s.index, "message": message,
                            "logprobs": s.logprobs, "finish_reason": finish, "stop_reason": s.stop_reason_json(),
                        })
                    }
                }
            })
            .collect();
        let object = match self.api {
            Api::Completion => "text_completion",
            Api::Chat => "chat.completion",
        };
        let mut v = json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
               "choices": choices, "usage": usage(states)});
        if self.prompt_logprobs && self.api == Api::Chat {
            v["prompt_logprobs"] = states
                .first()
                .and_then(|s| s.prompt_logprobs.clone())
                .unwrap_or(Value::Null);
        }
        if self.return_token_ids {
            for (c, s) in v["choices"]
                .as_array_mut()
                .into_iter()
                .flatten()
                .zip(states)
            {
                c["token_ids"] = json!(s.token_ids);
                if self.api == Api::Completion {
                    c["prompt_token_ids"] = json!(s.prompt_ids);
                }
            }
            if self.api == Api::Chat {
                v["prompt_token_ids"] = json!(states.first().and_then(|s| s.prompt_ids.as_ref()));
            }
        }
        v
    }

    /// Completions logprobs of the prompt tokens shown by `echo`: the first token
    /// has none (null), the others their prompt logprobs (null where the engine
    /// gave none).
    pub fn echo_logprobs(
        &self,
        ids: &[u32],
        prompt: Option<&[PromptLogprob]>,
        offset: &mut usize,
    ) -> Value {
        let entries: Vec<(u32, Option<TokenLogprobs>)> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let lp = i
                    .checked_sub(1)
                    .and_then(|j| prompt?.get(j))
                    .filter(|p| p.token_id == id)
                    .map(|p| TokenLogprobs {
                        token_id: p.token_id,
                        logprob: p.logprob,
                        top: p.top.clone(),
                    });
                (id, lp)
            })
            .collect();
        self.completion_logprobs(entries.iter().map(|(id, lp)| (*id, lp.as_ref())), offset)
    }

    /// vLLM's `prompt_logprobs` list: null for the first prompt token, then per
    /// token a map from token id to `{logprob, rank, decoded_token}` holding the
    /// prompt token itself and its most likely alternatives (ranks 1..k).
    pub fn prompt_logprobs_json(&self, entries: &[PromptLogprob]) -> Value {
        let item = |id: u32, logprob: f32, rank: u32| {
            let t = self.text.token_text(id);
            json!({"logprob": logprob_json(logprob), "rank": rank, "decoded_token": self.token_label(id, &t)})
        };
        let mut list = vec![Value::Null];
        for e in entries {
            let mut m = Map::new();
            m.insert(e.token_id.to_string(), item(e.token_id, e.logprob, e.rank));
            for (r, &(id, v)) in e.top.iter().enumerate() {
                m.entry(id.to_string())
                    .or_insert_with(|| item(id, v, r as u32 + 1));
            }
            list.push(Value::Object(m));
        }
        Value::Array(list)
    }

    /// Completions' logprobs object over tokens that may lack logprobs (null).
    fn completion_logprobs<'a>(
        &self,
        entries: impl Iterator<Item = (u32, Option<&'a TokenLogprobs>)>,
        offset: &mut usize,
    ) -> Value {
        let (mut tokens, mut values, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
        for (id, lp) in entries {
            let t = self.text.token_text(id);
            offsets.push(*offset);
            *offset += t.chars().count();
            let label = self.token_label(id, &t);
            match lp {
                None => {
                    values.push(Value::Null);
                    tops.push(Value::Null);
                }
                Some(lp) => {
                    let mut top = Map::new();
                    for &(id, v) in &lp.top {
                        let s = self.token_label(id, &self.text.token_text(id));
                        top.entry(s).or_insert(logprob_json(v));
                    }
                    // vLLM always lists the sampled token among the top entries.
                    top.entry(label.clone()).or_insert(logprob_json(lp.logprob));
                    values.push(logprob_json(lp.logprob));
                    tops.push(Value::Object(top));
                }
            }
            tokens.push(label);
        }
        json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
    }

    /// The logprobs object for some generated tokens, in this API's shape.
    pub fn logprobs_json(&self, lps: &[TokenLogprobs], offset: &mut usize) -> Value {
        match self.api {
            Api::Completion => {
                self.completion_logprobs(lps.iter().map(|lp| (lp.token_id, Some(lp))), offset)
            }
            Api::Chat => {
                let entry = |id: u32, v: f32| {
                    let t = self.text.token_text(id);
                    json!({"token": self.token_label(id, &t), "logprob": logprob_json(v), "bytes": t.as_bytes()})
                };
                let content: Vec<Value> = lps
                    .iter()
                    .map(|lp| {
                        let mut e = entry(lp.token_id, lp.logprob);
                        let top: Vec<Value> = lp.top.iter().map(|&(id, v)| entry(id, v)).collect();
                        e["top_logprobs"] = Value::Array(top);
                        e
                    })
                    .collect();
                json!({"content": content})
            }
        }
    }
}

/// A log-probability as JSON: a masked token's `-inf` (allowed_token_ids, a
/// structured-output grammar) is -9999.0, as vLLM writes it (JSON has no infinity).
fn logprob_json(v: f32) -> Value {
    json!(v.max(-9999.0))
}

/// Appends a logprobs delta to the accumulated object (arrays concatenate).
pub fn merge_logprobs(acc: &mut Option<Value>, delta: Value) {
    match acc {
        None => *acc = Some(delta),
        Some(Value::Object(a)) => {
            if let Value::Object(d) = delta {
                for (k, v) in d {
                    match (a.get_mut(&k), v) {
                        (Some(Value::Array(x)), Value::Array(y)) => x.extend(y),
                        (_, v) => {
                            a.insert(k, v);
                        }
                    }
                }
            }
        }
        Some(_) => *acc = Some(delta),
    }
}

/// The progress of one choice (one engine request).
pub struct ChoiceState {
    pub index: usize,
    /// Only the first sample of each prompt counts the prompt in `usage`.
    pub counts_prompt: bool,
    /// Everything generated so far (plus the echoed prompt).
    pub text: String,
    /// Characters so far, for completions' `text_offset`.
    pub offset: usize,
    pub logprobs: Option<Value>,
    pub finish_reason: Option<FinishReason>,
    pub stop_reason: Option<StopReason>,
    pub num_prompt_tokens: usize,
    pub num_cached_tokens: usize,
    pub num_output_tokens: usize,
    /// Set once the first chunk of this choice went out (chat sends the role then).
    pub started: bool,
    /// With `return_token_ids`: the prompt's ids and every output id so far.
    pub prompt_ids: Option<Vec<u32>>,
    pub token_ids: Vec<u32>,
    /// Completions `echo` with logprobs: the prompt ids whose logprobs go out with
    /// the first output (which brings their values).
    pub echo_ids: Option<Vec<u32>>,
    /// Streaming: echoed text that goes out with that first output.
    pub unsent_echo: String,
    /// vLLM's `prompt_logprobs` list, once the first output brought it.
    pub prompt_logprobs: Option<Value>,
    /// Streaming chat with tools or reasoning: this choice's parsers.
    pub shaper: Option<super::shape::Shaper>,
    /// Chat `echo`: the bytes of `text` that are the echoed message, not output.
    pub echo_bytes: usize,
    timer: RequestTimer,
}

impl ChoiceState {
    pub fn new(
        index: usize,
        counts_prompt: bool,
        num_prompt_tokens: usize,
        arrival: Instant,
    ) -> Self {
        ChoiceState {
            index,
            counts_prompt,
            text: String::new(),
            offset: 0,
            logprobs: None,
            finish_reason: None,
            stop_reason: None,
            num_prompt_tokens,
            num_cached_tokens: 0,
            num_output_tokens: 0,
            started: false,
            prompt_ids: None,
            token_ids: Vec::new(),
            echo_ids: None,
            unsent_echo: String::new(),
            prompt_logprobs: None,
            shaper: None,
            echo_bytes: 0,
            timer: RequestTimer::new(arrival),
        }
    }

    /// Keeps the prompt's ids for `return_token_ids`.
    pub fn with_prompt_ids(mut self, ids: Option<Vec<u32>>) -> Self {
        self.prompt_ids = ids;
        self
    }

    /// The non-streamed message of a shaped chat choice (the echoed text stays
    /// content) and its `finish_reason`.
    fn shaped_message(&self, cfg: &Arc<super::shape::Shaping>) -> (Value, &'static str) {
        let (echo, out) = self.text.split_at(self.echo_bytes.min(self.text.len()));
        let (mut m, finish) = super::shape::message(cfg, out, self.finish_reason);
        if !echo.is_empty() {
            m["content"] = format!("{echo}{}", m["content"].as_str().unwrap_or("")).into();
        }
        (m, finish)
    }

    /// Takes one engine output in; returns its logprobs delta (when asked for).
    pub fn absorb(&mut self, ctx: &Ctx, out: &RequestOutput) -> Option<Value> {
        self.timer.on_tokens(&ctx.metrics, out.new_token_ids.len());
        self.num_prompt_tokens = out.num_prompt_tokens.max(self.num_prompt_tokens);
        self.num_cached_tokens = out.num_cached_tokens;
        self.num_output_tokens = out
            .num_output_tokens
            .max(self.num_output_tokens + out.new_token_ids.len());
        self.text.push_str(&out.new_text);
        if ctx.return_token_ids {
            self.token_ids.extend_from_slice(&out.new_token_ids);
        }
        if out.finished {
            let reason = out.finish_reason.unwrap_or(FinishReason::Stop);
            self.finish_reason = Some(reason);
            self.stop_reason = out.stop_reason.clone();
            self.timer.on_finish(&ctx.metrics, reason);
            if let Some(m) = &out.metrics {
                ctx.metrics.observe_finished(m);
            }
        }
        if ctx.prompt_logprobs && self.prompt_logprobs.is_none() {
            let entries = out.prompt_logprobs.as_deref().unwrap_or(&[]);
            self.prompt_logprobs = Some(ctx.prompt_logprobs_json(entries));
        }
        // The echoed prompt's logprobs come first, now that their values are here.
        let mut delta = self.echo_ids.take().map(|ids| {
            let mut off = 0;
            ctx.echo_logprobs(&ids, out.prompt_logprobs.as_deref(), &mut off)
        });
        if ctx.logprobs && !out.new_logprobs.is_empty() {
            let mut off = self.offset;
            let lp = ctx.logprobs_json(&out.new_logprobs, &mut off);
            self.offset = off;
            merge_logprobs(&mut delta, lp);
        } else {
            self.offset += out.new_text.chars().count();
        }
        delta
    }

    /// vLLM's `stop_reason`: the stop string or token id that ended the choice, null for EOS.
    pub fn stop_reason_json(&self) -> Value {
        match &self.stop_reason {
            Some(StopReason::StopString(s)) => json!(s),
            Some(StopReason::StopTokenId(id)) => json!(id),
            Some(StopReason::Eos(_)) | None => Value::Null,
        }
    }
}

/// `usage` with `prompt_tokens_details.cached_tokens`.
pub fn usage(states: &[ChoiceState]) -> Value {
    let prompt: usize = states
        .iter()
        .filter(|s| s.counts_prompt)
        .map(|s| s.num_prompt_tokens)
        .sum();
    let cached: usize = states
        .iter()
        .filter(|s| s.counts_prompt)
        .map(|s| s.num_cached_tokens)
        .sum();
    let completion: usize = states.iter().map(|s| s.num_output_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// One SSE event.
pub fn sse_event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

pub const SSE_DONE: &str = "data: [DONE]\n\n";

#[cfg(test)]
mod tests;
