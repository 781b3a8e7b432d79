//! Driving engine request streams into HTTP answers: an SSE body for `stream:
//! true`, or a collected response otherwise.
//!
//! The SSE body *owns* the engine's [`RequestStream`]s, so when a client
//! disconnects and hyper drops the body, the streams drop and their requests are
//! aborted at once (freeing their KV blocks).

use super::error::ApiError;
use super::format::{merge_logprobs, sse_event, usage, ChoiceState, Ctx, SSE_DONE};
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::stream::{self, BoxStream, SelectAll, StreamExt};
use pagoda_engine::{EngineError, RequestOutput, RequestStream};
use std::borrow::Cow;
use std::convert::Infallible;
use std::sync::Arc;

/// One engine request behind one choice.
pub struct Sample {
    pub state: ChoiceState,
    pub stream: RequestStream,
    /// Completions' `echo`: the prompt text and ids, shown before the output.
    pub echo: Option<(String, Vec<u32>)>,
}

type Tagged = (usize, Result<RequestOutput, EngineError>);

/// Longest silence on an SSE stream before a keep-alive comment goes out.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(5);

/// Merges the per-choice streams, tagging each output with its position.
fn merge(streams: Vec<RequestStream>) -> SelectAll<BoxStream<'static, Tagged>> {
    stream::select_all(streams.into_iter().enumerate().map(|(i, s)| {
        stream::unfold(s, move |mut s| async move {
            s.next().await.map(|o| ((i, o), s))
        })
        .boxed()
    }))
}

/// Applies `echo` to a fresh choice: its text now; with logprobs, its token
/// entries wait for the first output, which brings the prompt logprobs. Returns
/// whether they wait.
fn apply_echo(ctx: &Ctx, st: &mut ChoiceState, echo: &Option<(String, Vec<u32>)>) -> bool {
    let Some((text, ids)) = echo.as_ref() else {
        return false;
    };
    st.text.push_str(text);
    st.echo_bytes = text.len();
    st.offset = text.chars().count();
    // Chat echoes the final message's text only: its logprobs are not the prompt's.
    let deferred = ctx.logprobs && ctx.api == super::format::Api::Completion;
    if deferred {
        st.echo_ids = Some(ids.clone());
    }
    deferred
}

/// Runs every sample to the end and returns their final states.
pub async fn collect(ctx: &Ctx, samples: Vec<Sample>) -> Result<Vec<ChoiceState>, ApiError> {
    let mut states = Vec::with_capacity(samples.len());
    let mut streams = Vec::with_capacity(samples.len());
    for Sample {
        mut state,
        stream,
        echo,
    } in samples
    {
        apply_echo(ctx, &mut state, &echo);
        states.push(state);
        streams.push(stream);
    }
    let mut merged = merge(streams);
    while let Some((i, r)) = merged.next().await {
        // On error, returning drops `merged` and so aborts the other samples.
        if let Err(EngineError::RequestFailed { .. }) = &r {
            ctx.metrics.count_error();
        }
        let out = r.map_err(ApiError::from)?;
        let st = &mut states[i];
        if let Some(lp) = st.absorb(ctx, &out) {
            merge_logprobs(&mut st.logprobs, lp);
        }
    }
    Ok(states)
}

enum Phase {
    Start,
    Streaming,
    Usage,
    Done,
    End,
}

struct SseState {
    ctx: Arc<Ctx>,
    states: Vec<ChoiceState>,
    echoes: Vec<Option<(String, Vec<u32>)>>,
    merged: SelectAll<BoxStream<'static, Tagged>>,
    phase: Phase,
}

impl SseState {
    /// The next bytes of the body, or None at the end.
    async fn next_bytes(&mut self) -> Option<String> {
        loop {
            match self.phase {
                Phase::Start => {
                    self.phase = Phase::Streaming;
                    // Chat: a first chunk per choice carrying the role. Completions:
                    // the echoed prompt, if asked for.
                    let mut out = String::new();
                    for (st, echo) in self.states.iter_mut().zip(&self.echoes) {
                        let ctx = &self.ctx;
                        match ctx.api {
                            super::format::Api::Chat => {
                                let mut chunk = ctx.chunk(
                                    st.index,
                                    "",
                                    None,
                                    None,
                                    serde_json::Value::Null,
                                    true,
                                );
                                if ctx.return_token_ids {
                                    add_token_ids(ctx, &mut chunk, st, &[], true);
                                }
                                // vLLM's continuous usage covers the role chunk too
                                // (no completion tokens yet).
                                if ctx.continuous_usage {
                                    chunk["usage"] = choice_usage(st);
                                }
                                out.push_str(&sse_event(&chunk));
                                st.started = true;
                                if echo.is_some() {
                                    apply_echo(ctx, st, echo);
                                    let mut chunk = ctx.chunk(
                                        st.index,
                                        &st.text,
                                        None,
                                        None,
                                        serde_json::Value::Null,
                                        false,
                                    );
                                    if ctx.continuous_usage {
                                        chunk["usage"] = choice_usage(st);
                                    }
                                    out.push_str(&sse_event(&chunk));
                                }
                            }
                            super::format::Api::Completion => {
                                if echo.is_some() {
                                    let before = st.text.len();
                                    let deferred = apply_echo(ctx, st, echo);
                                    let text = st.text[before..].to_string();
                                    if deferred {
                                        // Goes out with the first output and its logprobs.
                                        st.unsent_echo = text;
                                    } else {
                                        out.push_str(&sse_event(&ctx.chunk(
                                            st.index,
                                            &text,
                                            None,
                                            None,
                                            serde_json::Value::Null,
                                            false,
                                        )));
                                    }
                                }
                            }
                        }
                    }
                    if !out.is_empty() {
                        return Some(out);
                    }
                }
                Phase::Streaming => {
                    match tokio::time::timeout(KEEP_ALIVE, self.merged.next()).await {
                        // Nothing to say for a while (e.g. queued): an SSE comment keeps
                        // proxies patient and reveals a vanished client, whose request is
                        // then aborted even before it produced a token.
                        Err(_) => return Some(": keep-alive\n\n".to_string()),
                        Ok(Some((i, Ok(out)))) => {
                            let ctx = &self.ctx;
                            let st = &mut self.states[i];
                            let lp = st.absorb(ctx, &out);
                            let shaped = st
                                .shaper
                                .as_mut()
                                .map(|s| s.push(&out.new_text, out.finished));
                            let nothing = match &shaped {
                                Some(d) => d.is_empty(),
                                None => out.new_text.is_empty(),
                            };
                            if nothing && lp.is_none() && !out.finished {
                                continue;
                            }
                            let finish = if out.finished { st.finish_reason } else { None };
                            let stop = if out.finished {
                                st.stop_reason_json()
                            } else {
                                serde_json::Value::Null
                            };
                            let first = !st.started;
                            st.started = true;
                            let text = if st.unsent_echo.is_empty() {
                                Cow::Borrowed(out.new_text.as_str())
                            } else {
                                Cow::Owned(std::mem::take(&mut st.unsent_echo) + &out.new_text)
                            };
                            let mut chunk = ctx.chunk(
                                st.index,
                                &text,
                                lp,
                                finish,
                                stop,
                                first && ctx.api == super::format::Api::Chat,
                            );
                            if let (Some(d), Some(sh)) = (shaped, &st.shaper) {
                                shape_chunk(
                                    &mut chunk,
                                    d,
                                    out.finished.then(|| sh.finish_reason(finish)),
                                );
                            }
                            if ctx.continuous_usage {
                                chunk["usage"] = choice_usage(st);
                            }
                            if ctx.return_token_ids {
                                add_token_ids(ctx, &mut chunk, st, &out.new_token_ids, first);
                            }
                            return Some(sse_event(&chunk));
                        }
                        Ok(Some((i, Err(EngineError::Shutdown)))) => {
                            // Cut by shutdown after the 200 went out: the choice ends
                            // as aborted (non-streaming requests get a 503 instead).
                            let ctx = &self.ctx;
                            let st = &mut self.states[i];
                            st.finish_reason = Some(pagoda_core::FinishReason::Abort);
                            let first = !st.started;
                            st.started = true;
                            let mut chunk = ctx.chunk(
                                st.index,
                                "",
                                None,
                                st.finish_reason,
                                serde_json::Value::Null,
                                first && ctx.api == super::format::Api::Chat,
                            );
                            if ctx.continuous_usage {
                                chunk["usage"] = choice_usage(st);
                            }
                            return Some(sse_event(&chunk));
                        }
                        Ok(Some((_, Err(e)))) => {
                            if let EngineError::RequestFailed { .. } = e {
                                self.ctx.metrics.count_error();
                            }
                            // Drop every stream: aborts the remaining samples.
                            self.merged = SelectAll::new();
                            self.phase = Phase::Done;
                            tracing::warn!("stream {} failed: {e}", self.ctx.id);
                            return Some(sse_event(&ApiError::from(e).to_json()));
                        }
                        Ok(None) => {
                            self.phase = if self.ctx.include_usage {
                                Phase::Usage
                            } else {
                                Phase::Done
                            };
                        }
                    }
                }
                Phase::Usage => {
                    self.phase = Phase::Done;
                    return Some(sse_event(&self.ctx.usage_chunk(usage(&self.states))));
                }
                Phase::Done => {
                    self.phase = Phase::End;
                    return Some(SSE_DONE.to_string());
                }
                Phase::End => return None,
            }
        }
    }
}

/// A shaped chat chunk: the delta's text is the shaper's (reasoning, content,
/// tool calls), and the last chunk's `finish_reason` may be `tool_calls`.
fn shape_chunk(
    chunk: &mut serde_json::Value,
    d: super::shape::Delta,
    finish: Option<&'static str>,
) {
    let choice = &mut chunk["choices"][0];
    if let Some(delta) = choice["delta"].as_object_mut() {
        // The engine's text is replaced by what the parsers settled.
        delta.remove("content");
        d.write(delta);
    }
    if let Some(f) = finish {
        choice["finish_reason"] = f.into();
    }
}

/// `return_token_ids` in a stream: each chunk carries its new ids; a choice's
/// first chunk also the prompt's (on the choice for completions, at the top
/// level for chat, as vLLM).
fn add_token_ids(
    ctx: &Ctx,
    chunk: &mut serde_json::Value,
    st: &ChoiceState,
    new: &[u32],
    first: bool,
) {
    chunk["choices"][0]["token_ids"] = serde_json::json!(new);
    if first {
        let prompt = serde_json::json!(st.prompt_ids);
        match ctx.api {
            super::format::Api::Completion => chunk["choices"][0]["prompt_token_ids"] = prompt,
            super::format::Api::Chat => chunk["prompt_token_ids"] = prompt,
        }
    }
}

/// One choice's usage so far, for `continuous_usage_stats` chunks (vLLM counts
/// the prompt in every choice's chunks).
fn choice_usage(st: &ChoiceState) -> serde_json::Value {
    serde_json::json!({
        "prompt_tokens": st.num_prompt_tokens,
        "completion_tokens": st.num_output_tokens,
        "total_tokens": st.num_prompt_tokens + st.num_output_tokens,
    })
}

/// A `text/event-stream` response that streams every sample's chunks.
pub fn sse_response(ctx: Arc<Ctx>, samples: Vec<Sample>) -> Response {
    let mut states = Vec::with_capacity(samples.len());
    let mut echoes = Vec::with_capacity(samples.len());
    let mut streams = Vec::with_capacity(samples.len());
    for s in samples {
        states.push(s.state);
        echoes.push(s.echo);
        streams.push(s.stream);
    }
    let state = SseState {
        ctx,
        states,
        echoes,
        merged: merge(streams),
        phase: Phase::Start,
    };
    let body = stream::unfold(state, |mut st| async move {
        let bytes = st.next_bytes().await?;
        Some((Ok::<_, Infallible>(Bytes::from(bytes)), st))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}
