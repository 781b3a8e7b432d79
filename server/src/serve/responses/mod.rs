//! `POST /v1/responses` and `GET /v1/responses/{id}`: OpenAI's Responses API,
//! the part a local engine serves (as vLLM's `serving_responses.py` does).
//!
//! A request becomes a chat completions request ([`crate::serve::bridge`]):
//! `instructions` a system message, `input` (text, or message,
//! `function_call` and `function_call_output` items) the conversation after the
//! history of `previous_response_id`, the flat function `tools` chat's nested
//! ones. The answer's reasoning, text and tool calls become `reasoning`,
//! `message` and `function_call` output items ([`stream`] for the typed SSE
//! events). With `store` (the default) the response is kept in the bounded
//! [`store`] for `GET` and follow-ups. What a local engine does not serve
//! (built-in tools, `background`, stored prompts, conversations) is a 400 that
//! names it.

pub mod object;
pub mod store;
pub mod stream;

use super::bridge::{self, given, parse_object, text_of};
use super::error::ApiError;
use super::handlers::{respond, Body};
use super::shape::random_id;
use super::state::{unix_now, AppState};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use object::{call_item, message_item, reasoning_item, text_part, usage, Turn};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

/// Fields refused by name, with why.
const UNSERVED: &[(&str, &str)] = &[
    (
        "background",
        "background responses are not supported by Pagoda; leave `background` out or false",
    ),
    (
        "conversation",
        "conversations are not supported by Pagoda; use `previous_response_id`",
    ),
    (
        "prompt",
        "stored prompt templates are not supported by Pagoda; send `input` and `instructions`",
    ),
    (
        "max_tool_calls",
        "`max_tool_calls` is not supported by Pagoda",
    ),
];

/// vLLM sampling extensions passed through to the chat pipeline as they are.
const PASSTHROUGH: &[&str] = &[
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "structured_outputs",
    "priority",
    "cache_salt",
    "parallel_tool_calls",
    "chat_template_kwargs",
];

fn bool_field(req: &Value, key: &str, default: bool) -> Result<bool, ApiError> {
    match given(req, key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        // As vLLM's pydantic models accept them.
        Some(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
        Some(_) => Err(ApiError::bad(key, format!("`{key}` must be a boolean"))),
    }
}

/// One chat message from a message item (`role` + `content`).
fn input_message(i: usize, item: &Value) -> Result<Value, ApiError> {
    let param = format!("input[{i}]");
    let role = item.get("role").and_then(Value::as_str).unwrap_or("");
    let role = match role {
        "user" | "assistant" | "system" => role,
        // Responses' developer messages are the system prompt in chat templates.
        "developer" => "system",
        other => {
            return Err(ApiError::bad(
                "input",
                format!("{param}.role must be user, assistant, system or developer, got `{other}`"),
            ))
        }
    };
    let content = item.get("content").unwrap_or(&Value::Null);
    let text = text_of(
        content,
        &["input_text", "output_text", "text", "refusal"],
        &format!("{param}.content"),
    )
    .map_err(|e| ApiError::bad("input", e.to_string()))?;
    Ok(json!({"role": role, "content": text}))
}

/// `input` as chat messages appended to `out`.
fn input_messages(input: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let items = match input {
        Value::String(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::bad(
                "input",
                "`input` must be a string or a list of items",
            ))
        }
    };
    for (i, item) in items.iter().enumerate() {
        let kind = item.get("type").and_then(Value::as_str);
        let field = |k: &str| {
            item.get(k)
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad("input", format!("input[{i}].{k} must be a string")))
        };
        match kind {
            None | Some("message") => out.push(input_message(i, item)?),
            Some("function_call") => {
                let call = json!({
                    "id": field("call_id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?},
                });
                // Calls of one turn join one assistant message.
                match out.last_mut() {
                    Some(m) if m["role"] == "assistant" && m["tool_calls"].is_array() => {
                        m["tool_calls"].as_array_mut().unwrap().push(call)
                    }
                    _ => out
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            Some("function_call_output") => {
                let output = item.get("output").unwrap_or(&Value::Null);
                let text = text_of(
                    output,
                    &["input_text", "output_text", "text"],
                    &format!("input[{i}].output"),
                )
                .map_err(|e| ApiError::bad("input", e.to_string()))?;
                out.push(
                    json!({"role": "tool", "tool_call_id": field("call_id")?, "content": text}),
                );
            }
            // Earlier reasoning is not shown to the model again (as chat templates drop it).
            Some("reasoning") => {}
            Some(other) => {
                return Err(ApiError::bad(
                    "input",
                    format!("input[{i}]: items of type `{other}` are not supported by Pagoda"),
                ))
            }
        }
    }
    Ok(())
}

/// Responses' flat function tools as chat's (`{type, function: {...}}`).
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let list = tools
        .as_array()
        .ok_or_else(|| ApiError::bad("tools", "`tools` must be a list"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::bad(
                    "tools",
                    format!(
                        "tools[{i}]: built-in tools (`{other}`) are not supported by Pagoda; \
                         only `function` tools"
                    ),
                ))
            }
            None => {
                return Err(ApiError::bad(
                    "tools",
                    format!("tools[{i}].type is required"),
                ))
            }
        }
        let mut f = Map::new();
        for k in ["name", "description", "parameters", "strict"] {
            if let Some(v) = given(t, k) {
                f.insert(k.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(out.into())
}

/// Responses' `tool_choice` as chat's.
fn chat_tool_choice(c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(_) => Ok(c.clone()),
        Value::Object(o) => match (o.get("type").and_then(Value::as_str), o.get("name")) {
            (Some("function"), Some(Value::String(n))) => {
                Ok(json!({"type": "function", "function": {"name": n}}))
            }
            (Some("allowed_tools" | "mcp" | "custom"), _) => Err(ApiError::bad(
                "tool_choice",
                "only \"none\", \"auto\", \"required\" and {\"type\": \"function\", \"name\": ...} are supported",
            )),
            (Some(t), _) if t != "function" => Err(ApiError::bad(
                "tool_choice",
                format!("tool_choice for built-in tools (`{t}`) is not supported by Pagoda"),
            )),
            _ => Err(ApiError::bad(
                "tool_choice",
                "a named tool_choice is {\"type\": \"function\", \"name\": ...}",
            )),
        },
        _ => Err(ApiError::bad(
            "tool_choice",
            "tool_choice must be a string or an object",
        )),
    }
}

/// `text.format` as chat's `response_format`.
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let Some(f) = given(text, "format") else {
        return Ok(None);
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut s = Map::new();
            for k in ["name", "schema", "strict", "description"] {
                if let Some(v) = given(f, k) {
                    s.insert(k.into(), v.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": s})))
        }
        _ => Err(ApiError::bad(
            "text",
            "text.format.type must be text, json_object or json_schema",
        )),
    }
}

/// Parses and translates a request body (on the blocking pool).
pub fn translate(st: &AppState, bytes: &[u8]) -> Result<Turn, ApiError> {
    let req = parse_object(bytes)?;
    for (k, why) in UNSERVED {
        let on = match given(&req, k) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::String(s)) => s != "false",
            Some(_) => true,
        };
        if on {
            return Err(ApiError::bad(*k, *why));
        }
    }
    if given(&req, "top_logprobs").is_some_and(|v| v.as_u64() != Some(0)) {
        return Err(ApiError::bad(
            "top_logprobs",
            "logprobs are not served by /v1/responses; use /v1/chat/completions",
        ));
    }
    let stream = bool_field(&req, "stream", false)?;
    let store = bool_field(&req, "store", true)? && st.responses_store.enabled();
    let mut parent = None;
    if let Some(prev) = given(&req, "previous_response_id") {
        let id = prev
            .as_str()
            .ok_or_else(|| ApiError::bad("previous_response_id", "must be a string"))?;
        let stored = st
            .responses_store
            .get(id)
            .ok_or_else(|| ApiError::NotFound {
                message: format!("Response with id '{id}' not found."),
            })?;
        parent = Some(stored.history.clone());
    }
    let input =
        given(&req, "input").ok_or_else(|| ApiError::bad("input", "`input` is required"))?;
    let mut own = Vec::new();
    input_messages(input, &mut own)?;
    let mut messages = Vec::new();
    if let Some(i) = given(&req, "instructions") {
        let text = i
            .as_str()
            .ok_or_else(|| ApiError::bad("instructions", "`instructions` must be a string"))?;
        messages.push(json!({"role": "system", "content": text}));
    }
    if let Some(p) = &parent {
        messages.extend(p.messages());
    }
    messages.extend(own.iter().cloned());
    let mut chat = json!({"messages": messages});
    bridge::copy_fields(&req, &mut chat, PASSTHROUGH);
    if let Some(m) = given(&req, "max_output_tokens") {
        chat["max_completion_tokens"] = m.clone();
    }
    if let Some(t) = given(&req, "tools") {
        if t.as_array().is_some_and(|a| !a.is_empty()) {
            chat["tools"] = chat_tools(t)?;
        }
    }
    if let Some(c) = given(&req, "tool_choice") {
        chat["tool_choice"] = chat_tool_choice(c)?;
    }
    if let Some(rf) = given(&req, "text")
        .map(response_format)
        .transpose()?
        .flatten()
    {
        chat["response_format"] = rf;
    }
    let mut echo = Map::new();
    for k in [
        "instructions",
        "max_output_tokens",
        "previous_response_id",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "metadata",
        "text",
        "reasoning",
        "user",
    ] {
        echo.insert(k.into(), given(&req, k).cloned().unwrap_or(Value::Null));
    }
    Ok(Turn {
        id: random_id("resp_"),
        created: unix_now(),
        chat,
        parent,
        input: own,
        echo,
        store,
        stream,
    })
}

/// The output items of a non-streamed chat message.
fn output_items(m: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(r) = m["reasoning"].as_str().filter(|r| !r.is_empty()) {
        out.push(reasoning_item(&random_id("rs_"), r));
    }
    let text = m["content"].as_str().unwrap_or("");
    let calls = m["tool_calls"].as_array().map_or(&[][..], |v| v);
    if !text.is_empty() || calls.is_empty() {
        out.push(message_item(
            &random_id("msg_"),
            "completed",
            vec![text_part(text)],
        ));
    }
    for c in calls {
        out.push(call_item(
            &random_id("fc_"),
            "completed",
            c["id"].as_str().unwrap_or(""),
            c["function"]["name"].as_str().unwrap_or(""),
            c["function"]["arguments"].as_str().unwrap_or(""),
        ));
    }
    out
}

/// The finished response of a non-streamed request.
fn from_chat(st: &AppState, turn: &Turn, chat: &Value) -> Value {
    let c = &chat["choices"][0];
    let u = &chat["usage"];
    let n = |v: &Value| v.as_u64().unwrap_or(0) as usize;
    let status = if c["finish_reason"] == "length" {
        "incomplete"
    } else {
        "completed"
    };
    turn.response(
        &st.model_name,
        status,
        &output_items(&c["message"]),
        usage(
            n(&u["prompt_tokens"]),
            n(&u["prompt_tokens_details"]["cached_tokens"]),
            n(&u["completion_tokens"]),
        ),
    )
}

/// `POST /v1/responses`.
pub async fn create(State(st): State<Arc<AppState>>, body: Body) -> Response {
    let arrival = Instant::now();
    respond(
        async {
            let bytes = st.read_body(body)?;
            let st2 = st.clone();
            let mut turn = st.offload(move || translate(&st2, &bytes)).await?;
            let run = st
                .start_chat(std::mem::take(&mut turn.chat), arrival)
                .await?;
            if turn.stream {
                return Ok(bridge::sse(stream::ResponseEvents::new(
                    st.clone(),
                    turn,
                    run,
                )));
            }
            let chat = run.finish().await?;
            let r = from_chat(&st, &turn, &chat);
            turn.keep(&st, &r);
            Ok(Json(r).into_response())
        }
        .await,
    )
}

/// `GET /v1/responses/{id}`: a stored response.
pub async fn retrieve(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match st.responses_store.get(&id) {
        Some(s) => Json(s.response.clone()).into_response(),
        None => ApiError::NotFound {
            message: format!("Response with id '{id}' not found."),
        }
        .into_response(),
    }
}

#[cfg(test)]
mod tests;
