//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's
//! Messages API, as vLLM and llama.cpp serve it to clients built for Claude.
//!
//! A request becomes a chat completions request ([`crate::serve::bridge`]):
//! `system` a system message, `text` blocks the messages' text, `tool_use`
//! blocks an assistant's `tool_calls` and `tool_result` blocks `tool`
//! messages; `tools` (`input_schema`) and `tool_choice` (`auto`, `any`,
//! `tool`, `none`) chat's. The answer's reasoning, text and calls become
//! `thinking`, `text` and `tool_use` content blocks, its finish Anthropic's
//! `stop_reason` ([`stream`] for the SSE events). Errors are Anthropic's
//! `{"type": "error", "error": {"type", "message"}}`.

pub mod answer;
pub mod stream;

use super::bridge::{self, given, parse_object, text_of};
use super::error::ApiError;
use super::handlers::{prepare_chat, Body};
use super::shape::random_id;
use super::state::AppState;
use answer::{stop_reason, tool_input};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

/// Anthropic's error object with the status of `e`.
pub fn error_response(e: &ApiError) -> Response {
    let kind = match e {
        ApiError::Unauthorized => "authentication_error",
        ApiError::NotFound { .. } => "not_found_error",
        ApiError::PayloadTooLarge { .. } => "request_too_large",
        ApiError::Unavailable { .. } => "overloaded_error",
        ApiError::Internal { .. } => "api_error",
        _ => "invalid_request_error",
    };
    let body = json!({"type": "error", "error": {"type": kind, "message": e.to_string()}});
    (e.status(), Json(body)).into_response()
}

fn respond(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(|e| error_response(&e))
}

/// A translated request.
pub struct Turn {
    pub chat: Value,
    pub stream: bool,
}

/// One message's blocks as chat messages appended to `out`.
fn blocks(i: usize, role: &str, content: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let param = format!("messages[{i}].content");
    let list = match content {
        Value::String(s) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Value::Array(l) => l,
        _ => {
            return Err(ApiError::bad(
                "messages",
                format!("{param} must be a string or a list of content blocks"),
            ))
        }
    };
    let (mut text, mut calls, mut reasoning) = (String::new(), Vec::new(), String::new());
    for (j, b) in list.iter().enumerate() {
        let bad = |m: &str| ApiError::bad("messages", format!("{param}[{j}]: {m}"));
        match (b.get("type").and_then(Value::as_str), role) {
            (Some("text"), _) => text.push_str(
                b.get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a text block needs `text`"))?,
            ),
            (Some("tool_use"), "assistant") => {
                let s = |k: &str| b.get(k).and_then(Value::as_str);
                let (Some(id), Some(name)) = (s("id"), s("name")) else {
                    return Err(bad("a tool_use block needs `id` and `name`"));
                };
                let input = b.get("input").cloned().unwrap_or(json!({}));
                calls.push(json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": input.to_string()}}));
            }
            (Some("tool_result"), "user") => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a tool_result block needs `tool_use_id`"))?;
                let c = b.get("content").unwrap_or(&Value::Null);
                let c = text_of(c, &["text"], &format!("{param}[{j}].content"))
                    .map_err(|e| ApiError::bad("messages", e.to_string()))?;
                out.push(json!({"role": "tool", "tool_call_id": id, "content": c}));
            }
            (Some("thinking"), "assistant") => {
                reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
            }
            (Some("redacted_thinking"), "assistant") => {}
            (Some(kind), _) => {
                return Err(bad(&format!(
                    "`{kind}` blocks in {role} messages are not supported by Pagoda"
                )))
            }
            (None, _) => return Err(bad("a content block needs `type`")),
        }
    }
    if !text.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
        let mut m = json!({"role": role, "content": text});
        if !calls.is_empty() {
            m["tool_calls"] = calls.into();
        }
        if !reasoning.is_empty() {
            m["reasoning"] = reasoning.into();
        }
        out.push(m);
    }
    Ok(())
}

/// Anthropic's tools as chat's function tools.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let list = tools
        .as_array()
        .ok_or_else(|| ApiError::bad("tools", "`tools` must be a list"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                return Err(ApiError::bad(
                    "tools",
                    format!("tools[{i}]: server tools (`{other}`) are not supported by Pagoda"),
                ))
            }
        }
        let name = given(t, "name")
            .ok_or_else(|| ApiError::bad("tools", format!("tools[{i}].name is required")))?;
        let mut f = Map::new();
        f.insert("name".into(), name.clone());
        if let Some(d) = given(t, "description") {
            f.insert("description".into(), d.clone());
        }
        f.insert(
            "parameters".into(),
            given(t, "input_schema")
                .cloned()
                .unwrap_or(json!({"type": "object"})),
        );
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(out.into())
}

/// Anthropic's `tool_choice` as chat's, and whether parallel calls are allowed.
fn chat_tool_choice(c: &Value) -> Result<(Value, bool), ApiError> {
    let parallel = !c
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let choice = match (c.get("type").and_then(Value::as_str), c.get("name")) {
        (Some("auto"), _) => json!("auto"),
        (Some("any"), _) => json!("required"),
        (Some("none"), _) => json!("none"),
        (Some("tool"), Some(Value::String(n))) => {
            json!({"type": "function", "function": {"name": n}})
        }
        _ => {
            return Err(ApiError::bad(
                "tool_choice",
                "tool_choice is {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}",
            ))
        }
    };
    Ok((choice, parallel))
}

/// Parses and translates a body; `count` (count_tokens) needs no `max_tokens`.
pub fn translate(bytes: &[u8], count: bool) -> Result<Turn, ApiError> {
    let req = parse_object(bytes)?;
    let max_tokens = match given(&req, "max_tokens") {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => Some(n.clone()),
        None if count => None,
        None => return Err(ApiError::bad("max_tokens", "max_tokens: Field required")),
        Some(v) => {
            return Err(ApiError::bad(
                "max_tokens",
                format!("max_tokens must be a positive integer, got {v}"),
            ))
        }
    };
    let mut messages = Vec::new();
    if let Some(s) = given(&req, "system") {
        let text = text_of(s, &["text"], "system")?;
        messages.push(json!({"role": "system", "content": text}));
    }
    let list = given(&req, "messages")
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| ApiError::bad("messages", "`messages` must be a non-empty list"))?;
    for (i, m) in list.iter().enumerate() {
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant")) => r,
            _ => {
                return Err(ApiError::bad(
                    "messages",
                    format!("messages[{i}].role must be `user` or `assistant`"),
                ))
            }
        };
        blocks(
            i,
            role,
            m.get("content").unwrap_or(&Value::Null),
            &mut messages,
        )?;
    }
    let mut chat = json!({"messages": messages});
    bridge::copy_fields(
        &req,
        &mut chat,
        // The last is vLLM's extension (as on chat), e.g. to force an output in tests.
        &[
            "model",
            "temperature",
            "top_p",
            "top_k",
            "seed",
            "structured_outputs",
        ],
    );
    if let Some(m) = max_tokens {
        chat["max_tokens"] = m.into();
    }
    if let Some(s) = given(&req, "stop_sequences") {
        chat["stop"] = s.clone();
    }
    if let Some(t) = given(&req, "tools") {
        if t.as_array().is_some_and(|a| !a.is_empty()) {
            chat["tools"] = chat_tools(t)?;
        }
    }
    if let Some(c) = given(&req, "tool_choice") {
        let (choice, parallel) = chat_tool_choice(c)?;
        chat["tool_choice"] = choice;
        chat["parallel_tool_calls"] = parallel.into();
    }
    // Extended thinking on or off reaches templates that read `enable_thinking` (Qwen3).
    match given(&req, "thinking").and_then(|t| t.get("type")?.as_str()) {
        Some("enabled") => chat["chat_template_kwargs"] = json!({"enable_thinking": true}),
        Some("disabled") => chat["chat_template_kwargs"] = json!({"enable_thinking": false}),
        _ => {}
    }
    let stream = match given(&req, "stream") {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(Value::String(s)) if s == "true" || s == "false" => s == "true",
        Some(_) => return Err(ApiError::bad("stream", "`stream` must be a boolean")),
    };
    Ok(Turn { chat, stream })
}

/// The message object of a non-streamed answer.
fn from_chat(st: &AppState, chat: &Value) -> Value {
    let c = &chat["choices"][0];
    let m = &c["message"];
    let mut content = Vec::new();
    if let Some(r) = m["reasoning"].as_str().filter(|r| !r.is_empty()) {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if let Some(t) = m["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": t}));
    }
    let calls = m["tool_calls"].as_array().map_or(&[][..], |v| v);
    for call in calls {
        content.push(json!({
            "type": "tool_use", "id": random_id("toolu_"),
            "name": call["function"]["name"],
            "input": tool_input(call["function"]["arguments"].as_str().unwrap_or("")),
        }));
    }
    let (reason, seq) = stop_reason(
        c["finish_reason"].as_str().unwrap_or(""),
        &c["stop_reason"],
        !calls.is_empty(),
    );
    json!({
        "id": random_id("msg_"), "type": "message", "role": "assistant", "model": st.model_name,
        "content": content, "stop_reason": reason, "stop_sequence": seq,
        "usage": {"input_tokens": chat["usage"]["prompt_tokens"],
                  "output_tokens": chat["usage"]["completion_tokens"]},
    })
}

/// `POST /v1/messages`.
pub async fn create(State(st): State<Arc<AppState>>, body: Body) -> Response {
    let arrival = Instant::now();
    respond(
        async {
            let bytes = st.read_body(body)?;
            let turn = st.offload(move || translate(&bytes, false)).await?;
            let run = st.start_chat(turn.chat, arrival).await?;
            if turn.stream {
                let model = st.model_name.clone();
                return Ok(bridge::sse(stream::MessageEvents::new(model, run)));
            }
            let chat = run.finish().await?;
            Ok(Json(from_chat(&st, &chat)).into_response())
        }
        .await,
    )
}

/// `POST /v1/messages/count_tokens`: the prompt's length as the template renders it.
pub async fn count_tokens(State(st): State<Arc<AppState>>, body: Body) -> Response {
    respond(
        async {
            let bytes = st.read_body(body)?;
            let st2 = st.clone();
            let n = st
                .offload(move || {
                    let mut turn = translate(&bytes, true)?;
                    // Only rendered and tokenized: nothing to constrain or compile.
                    turn.chat["max_tokens"] = 1.into();
                    // `none` still shows the tools to the template.
                    if turn.chat.get("tools").is_some() {
                        turn.chat["tool_choice"] = "none".into();
                    }
                    let body = serde_json::to_vec(&turn.chat).map_err(|e| ApiError::Internal {
                        message: e.to_string(),
                    })?;
                    let prep = prepare_chat(&st2, &body)?;
                    Ok(prep.prompts.first().map_or(0, |p| p.0.len()))
                })
                .await?;
            Ok(Json(json!({"input_tokens": n})).into_response())
        }
        .await,
    )
}

#[cfg(test)]
mod tests;
