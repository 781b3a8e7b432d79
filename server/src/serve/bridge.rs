//! The chat pipeline behind the APIs that are not chat completions (OpenAI's
//! Responses, Anthropic's Messages): each translates its request into a chat
//! completions body, which is then prepared (template, tools, reasoning parser,
//! structured outputs) and submitted exactly as `/v1/chat/completions` is; the
//! answer comes back as the chat completion object ([`ChatRun::finish`]) or as
//! a stream of shaped deltas ([`ChatRun::next`]) that the API re-shapes into its
//! own events. One pipeline, so the three APIs cannot drift apart.

use super::error::ApiError;
use super::format::{ChoiceState, Ctx};
use super::handlers::prepare_chat;
use super::shape::Delta;
use super::state::AppState;
use super::stream::{collect, Sample};
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use pagoda_core::FinishReason;
use pagoda_engine::EngineError;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// Longest silence on a stream before a keep-alive goes out (as chat's).
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(5);

/// A submitted chat request with one sample.
pub struct ChatRun {
    pub ctx: Ctx,
    sample: Option<Sample>,
    /// The end, once the last delta went out.
    pending: Option<Finish>,
}

/// How a streamed run ended.
#[derive(Debug, Clone)]
pub struct Finish {
    /// Chat's `finish_reason` (after the tool parser: `tool_calls` possible).
    pub finish_reason: &'static str,
    /// vLLM's `stop_reason`: the stop string or token id, null for EOS.
    pub stop_reason: Value,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub output_tokens: usize,
}

/// One step of a streamed run.
pub enum Step {
    /// What the parsers settled from the newest output (never empty).
    Delta(Delta),
    /// Nothing for a while (the caller sends its keep-alive).
    Idle,
    /// The end, after the last delta.
    Done(Finish),
    /// The engine failed midway.
    Failed(ApiError),
}

impl AppState {
    /// Prepares a translated chat body (on the blocking pool) and submits it.
    pub(super) async fn start_chat(
        self: &Arc<Self>,
        body: Value,
        arrival: Instant,
    ) -> Result<ChatRun, ApiError> {
        let bytes = serde_json::to_vec(&body).map_err(|e| ApiError::Internal {
            message: format!("cannot serialize the chat request: {e}"),
        })?;
        let st = self.clone();
        let prep = self.offload(move || prepare_chat(&st, &bytes)).await?;
        let (ctx, mut samples, _) = self.submit(prep, arrival).await?;
        Ok(ChatRun {
            ctx,
            sample: samples.pop(),
            pending: None,
        })
    }
}

impl ChatRun {
    /// Prompt tokens (known at submission).
    pub fn prompt_tokens(&self) -> usize {
        self.sample
            .as_ref()
            .map_or(0, |s| s.state.num_prompt_tokens)
    }

    /// Runs to the end: the chat completion object.
    pub async fn finish(mut self) -> Result<Value, ApiError> {
        let samples: Vec<Sample> = self.sample.take().into_iter().collect();
        let states = collect(&self.ctx, samples).await?;
        Ok(self.ctx.response(&states))
    }

    /// The next step of the stream; None after `Done` or `Failed`.
    pub async fn next(&mut self) -> Option<Step> {
        if let Some(f) = self.pending.take() {
            self.sample = None;
            return Some(Step::Done(f));
        }
        loop {
            let s = self.sample.as_mut()?;
            let out = match tokio::time::timeout(KEEP_ALIVE, s.stream.next()).await {
                Err(_) => return Some(Step::Idle),
                Ok(None) => {
                    // The engine ended the stream without a finished output.
                    let f = finish_of(&s.state);
                    self.sample = None;
                    return Some(Step::Done(f));
                }
                Ok(Some(Err(e))) => {
                    if let EngineError::RequestFailed { .. } = e {
                        self.ctx.metrics.count_error();
                    }
                    self.sample = None;
                    return Some(Step::Failed(e.into()));
                }
                Ok(Some(Ok(out))) => out,
            };
            let st = &mut s.state;
            st.absorb(&self.ctx, &out);
            let d = match st.shaper.as_mut() {
                Some(sh) => sh.push(&out.new_text, out.finished),
                None => Delta {
                    content: out.new_text.clone(),
                    ..Delta::default()
                },
            };
            if out.finished {
                let f = finish_of(st);
                if d.is_empty() {
                    self.sample = None;
                    return Some(Step::Done(f));
                }
                // The last delta first, then `Done`.
                self.pending = Some(f);
                return Some(Step::Delta(d));
            }
            if !d.is_empty() {
                return Some(Step::Delta(d));
            }
        }
    }
}

fn finish_of(st: &ChoiceState) -> Finish {
    let engine = st.finish_reason;
    Finish {
        finish_reason: match &st.shaper {
            Some(sh) => sh.finish_reason(engine),
            None => engine.unwrap_or(FinishReason::Abort).as_str(),
        },
        stop_reason: st.stop_reason_json(),
        prompt_tokens: st.num_prompt_tokens,
        cached_tokens: st.num_cached_tokens,
        output_tokens: st.num_output_tokens,
    }
}

/// An SSE event with a name (`event: NAME`), as Responses and Messages send them.
pub fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// What an API's stream state machine provides.
pub trait SseSource: Send + 'static {
    /// The next bytes of the body; None at the end.
    fn next_bytes(&mut self) -> impl std::future::Future<Output = Option<String>> + Send;
}

/// A `text/event-stream` response over `src`. The body owns the run, so a
/// client that goes away drops it and aborts the request (as chat's does).
pub fn sse<S: SseSource>(src: S) -> Response {
    let body = futures::stream::unfold(src, |mut st| async move {
        let bytes = st.next_bytes().await?;
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(bytes)), st))
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

/// `Some(v)` unless null or absent.
pub fn given<'a>(body: &'a Value, key: &str) -> Option<&'a Value> {
    body.get(key).filter(|v| !v.is_null())
}

/// Copies the listed fields, when given, from one body to another.
pub fn copy_fields(from: &Value, to: &mut Value, keys: &[&str]) {
    for k in keys {
        if let Some(v) = given(from, k) {
            to[*k] = v.clone();
        }
    }
}

/// Text of a content value that is a string or a list of text parts (`{type,
/// text}` with one of `kinds`); other parts are a 400 naming `param`.
pub fn text_of(v: &Value, kinds: &[&str], param: &str) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                match p.get("text").and_then(Value::as_str) {
                    Some(t) if kinds.contains(&kind) => out.push_str(t),
                    _ => {
                        return Err(ApiError::bad(
                            param,
                            format!(
                                "{param}[{i}]: content of type `{kind}` is not supported \
                                 (only {} parts with `text`)",
                                kinds.join(", ")
                            ),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::bad(
            param,
            format!("{param} must be a string or a list of content parts"),
        )),
    }
}

/// A JSON body that is an object, or a 400.
pub fn parse_object(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| ApiError::BadRequest {
        message: format!("the body is not valid JSON: {e}"),
        param: None,
    })?;
    if !v.is_object() {
        return Err(ApiError::BadRequest {
            message: "the body must be a JSON object".into(),
            param: None,
        });
    }
    Ok(v)
}
