//! The pieces of Anthropic's answer that the whole message (`messages/mod.rs`)
//! and its stream ([`super::stream`]) both carry: the `stop_reason` a chat
//! finish becomes, and a tool call's `input`.
//!
//! A leaf of its own so that the stream need not reach back into its parent
//! module for them (the parent already uses the stream).

use serde_json::{json, Value};

/// Anthropic's `stop_reason` and `stop_sequence` for chat's finish.
pub fn stop_reason(finish: &str, stop: &Value, has_calls: bool) -> (&'static str, Value) {
    match finish {
        "tool_calls" => ("tool_use", Value::Null),
        "length" => ("max_tokens", Value::Null),
        _ if has_calls => ("tool_use", Value::Null),
        _ if stop.is_string() => ("stop_sequence", stop.clone()),
        _ => ("end_turn", Value::Null),
    }
}

/// A tool call's arguments as `input` (an object; `{}` when they do not parse,
/// e.g. cut by `max_tokens`).
pub fn tool_input(args: &str) -> Value {
    serde_json::from_str::<Value>(args)
        .ok()
        .filter(Value::is_object)
        .unwrap_or(json!({}))
}
