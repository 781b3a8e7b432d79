//! The response object and what goes in it, built alike by the non-streamed
//! answer (`responses/mod.rs`) and by the SSE stream ([`super::stream`]): the
//! [`Turn`] a request became (what the object echoes, how it is kept in the
//! store), the output items (`reasoning`, `message`, `function_call`) and
//! `usage`.
//!
//! A leaf below both, so that the stream need not reach back into its parent
//! module for these builders (the parent already uses the stream).

use super::store::{self, Stored};
use crate::serve::state::AppState;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// A translated request: the chat body and what the response object echoes.
pub struct Turn {
    pub id: String,
    pub created: u64,
    /// The chat completions body.
    pub chat: Value,
    /// The stored conversation this turn continues (`previous_response_id`).
    pub parent: Option<Arc<store::History>>,
    /// This turn's input as chat messages.
    pub input: Vec<Value>,
    /// The request fields that the response object repeats.
    pub echo: Map<String, Value>,
    pub store: bool,
    pub stream: bool,
}

impl Turn {
    /// The response object in the state `status`, with `output` and `usage`.
    pub fn response(&self, model: &str, status: &str, output: &[Value], usage: Value) -> Value {
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created,
            "status": status, "model": model, "output": output, "usage": usage,
            "error": null, "incomplete_details": null, "store": self.store,
            "truncation": "disabled", "background": false,
        });
        for (k, v) in &self.echo {
            r[k] = v.clone();
        }
        // OpenAI's defaults where the request left them out.
        for (k, d) in [
            ("tools", json!([])),
            ("tool_choice", json!("auto")),
            ("parallel_tool_calls", json!(true)),
            ("metadata", json!({})),
            ("text", json!({"format": {"type": "text"}})),
            ("reasoning", json!({"effort": null, "summary": null})),
        ] {
            if r[k].is_null() {
                r[k] = d;
            }
        }
        if status == "incomplete" {
            r["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        r
    }

    /// Keeps a finished response (when `store`) for `GET` and follow-ups.
    pub fn keep(&self, st: &AppState, response: &Value) {
        if !self.store {
            return;
        }
        let mut turn = self.input.clone();
        turn.extend(output_messages(
            response["output"].as_array().map_or(&[], |v| v),
        ));
        st.responses_store.put(
            self.id.clone(),
            Stored {
                response: response.clone(),
                history: store::History::new(self.parent.clone(), turn),
            },
        );
    }
}

/// Responses' `usage` from token counts.
pub fn usage(prompt: usize, cached: usize, output: usize) -> Value {
    json!({
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    })
}

/// Output items as they are before and once done.
pub fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"id": id, "type": "reasoning", "summary": [],
           "content": [{"type": "reasoning_text", "text": text}]})
}

pub fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

pub fn message_item(id: &str, status: &str, parts: Vec<Value>) -> Value {
    json!({"id": id, "type": "message", "role": "assistant", "status": status, "content": parts})
}

pub fn call_item(id: &str, status: &str, call_id: &str, name: &str, args: &str) -> Value {
    json!({"id": id, "type": "function_call", "status": status,
           "call_id": call_id, "name": name, "arguments": args})
}

/// Output items as the chat messages a follow-up's template sees: one
/// assistant message with the text and the calls.
pub(super) fn output_messages(output: &[Value]) -> Vec<Value> {
    let mut text = String::new();
    let mut calls = Vec::new();
    for item in output {
        match item["type"].as_str() {
            Some("message") => {
                for p in item["content"].as_array().into_iter().flatten() {
                    text.push_str(p["text"].as_str().unwrap_or(""));
                }
            }
            Some("function_call") => calls.push(json!({
                "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            })),
            _ => {}
        }
    }
    let mut m = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        m["tool_calls"] = calls.into();
        if text.is_empty() {
            m["content"] = Value::Null;
        }
    }
    vec![m]
}
