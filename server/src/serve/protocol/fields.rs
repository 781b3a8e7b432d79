//! Which request fields Pagoda honours, which it accepts because they change
//! nothing, and which it refuses: a vLLM or OpenAI field Pagoda knows but does not
//! implement is a 400 naming it at any value but its default, never a silent
//! no-op. A field nobody defines is what vLLM does with it: accepted, ignored,
//! and logged once per field name (routers such as vllm-router add fields of
//! their own, e.g. `no_stop_trim`, to every request they forward);
//! `--strict-request-fields` refuses those too.

use super::super::error::ApiError;
use serde_json::Value;

/// Fields of both generation endpoints that Pagoda implements.
const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "n",
    "logit_bias",
    "stream",
    "stream_options",
    "cache_salt",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "return_tokens_as_token_ids",
    "priority",
    "add_special_tokens",
    "truncate_prompt_tokens",
    "truncation_side",
    "allowed_token_ids",
    "return_token_ids",
    "prompt_logprobs",
    "bad_words",
    "logprob_token_ids",
    "response_format",
    "structured_outputs",
];

const COMPLETION: &[&str] = &["prompt", "echo", "logprobs"];
const CHAT: &[&str] = &[
    "messages",
    "continue_final_message",
    "echo",
    "chat_template_kwargs",
    "logprobs",
    "top_logprobs",
    "max_completion_tokens",
    "add_generation_prompt",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "include_reasoning",
];

/// OpenAI fields that only label or route a request: accepted, no effect.
const HARMLESS: &[&str] = &["user", "metadata", "store", "service_tier"];

/// Fields accepted only at the value that means "off" (what Pagoda does anyway).
fn is_off(field: &str, v: &Value) -> Option<bool> {
    let null = v.is_null();
    Some(match field {
        "best_of" => null || v.as_u64() == Some(1),
        "use_beam_search" | "continue_final_message" => null || v == &Value::Bool(false),
        "length_penalty" => null || v.as_f64() == Some(1.0),
        "suffix" => null || v.as_str() == Some(""),
        "spaces_between_special_tokens" => null || v == &Value::Bool(true),
        "tools" | "documents" => null || v.as_array().is_some_and(|a| a.is_empty()),
        "tool_choice" => null || v.as_str() == Some("none"),
        "parallel_tool_calls" | "include_reasoning" => true,
        "mm_processor_kwargs" | "vllm_xargs" | "kv_transfer_params" => {
            null || v.as_object().is_some_and(|o| o.is_empty())
        }
        "logits_processors"
        | "guided_json"
        | "guided_regex"
        | "guided_choice"
        | "guided_grammar"
        | "guided_decoding_backend"
        | "guided_whitespace_pattern"
        | "prompt_embeds"
        | "chat_template"
        | "reasoning_effort"
        | "request_id"
        | "min_characters" => null,
        _ => return None,
    })
}

/// Field names already logged as ignored; bounded, so that a client sending
/// random names cannot grow it.
static LOGGED: std::sync::Mutex<Option<std::collections::HashSet<String>>> =
    std::sync::Mutex::new(None);
const MAX_LOGGED: usize = 256;

/// Logs, once per name, that an unknown field was ignored (vLLM's warning).
fn note_ignored(field: &str) {
    let mut g = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    let set = g.get_or_insert_with(Default::default);
    if set.len() < MAX_LOGGED && set.insert(field.to_string()) {
        tracing::warn!(
            "The following fields were present in the request but ignored: {{{field:?}}} \
             (logged once per field; --strict-request-fields refuses them)"
        );
    }
}

/// Checks a generation request's top-level fields (`chat` selects the endpoint;
/// `strict`: unknown fields are a 400 instead of ignored).
pub fn check_fields(body: &Value, chat: bool, strict: bool) -> Result<(), ApiError> {
    let Some(obj) = body.as_object() else {
        return Ok(()); // the typed parse reports a non-object body
    };
    let own = if chat { CHAT } else { COMPLETION };
    for (k, v) in obj {
        let k = k.as_str();
        if COMMON.contains(&k) || own.contains(&k) || HARMLESS.contains(&k) {
            continue;
        }
        match is_off(k, v) {
            Some(true) => {}
            Some(false) if k.starts_with("guided_") => {
                return Err(ApiError::bad(
                    k,
                    format!(
                        "`{k}` was removed in vLLM 0.12 and is not accepted: use \
                         `structured_outputs` (`json`, `regex`, `choice`, `grammar`) or \
                         `response_format` instead"
                    ),
                ))
            }
            Some(false) => {
                return Err(ApiError::bad(
                    k,
                    format!(
                        "`{k}` is not supported by Pagoda (yet): leave it out or at its default"
                    ),
                ))
            }
            None if strict => {
                return Err(ApiError::bad(
                    k,
                    format!("Unrecognized request argument supplied: {k}"),
                ))
            }
            None => note_ignored(k),
        }
    }
    if let Some(so) = obj.get("stream_options").filter(|v| !v.is_null()) {
        if obj.get("stream").and_then(Value::as_bool) != Some(true) {
            return Err(ApiError::bad(
                "stream_options",
                "Stream options can only be defined when `stream=True`.",
            ));
        }
        if let Some(o) = so.as_object() {
            for (k, v) in o {
                match k.as_str() {
                    "include_usage" | "continuous_usage_stats" if v.is_null() || v.is_boolean() => {
                    }
                    "include_usage" | "continuous_usage_stats" => {
                        return Err(ApiError::bad(
                            "stream_options",
                            format!("stream_options.{k} must be a boolean"),
                        ))
                    }
                    other if !strict => note_ignored(&format!("stream_options.{other}")),
                    other => {
                        return Err(ApiError::bad(
                            "stream_options",
                            format!("stream_options.{other} is not supported by Pagoda (yet)"),
                        ))
                    }
                }
            }
        }
    }
    if obj.get("cache_salt").and_then(Value::as_str) == Some("") {
        return Err(ApiError::bad(
            "cache_salt",
            "Parameter 'cache_salt' must be a non-empty string if provided.",
        ));
    }
    Ok(())
}

/// Boolean fields of both generation endpoints (chat's `logprobs` too; on
/// completions it is a number).
const BOOLS: &[&str] = &[
    "ignore_eos",
    "stream",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "return_tokens_as_token_ids",
    "add_special_tokens",
    "return_token_ids",
    "echo",
    "add_generation_prompt",
    "continue_final_message",
    "parallel_tool_calls",
    "include_reasoning",
    "use_beam_search",
    "spaces_between_special_tokens",
];

/// A boolean as pydantic's lax mode reads one (vLLM's request models): the
/// strings `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`, `t`/`f`, `y`/`n`
/// (any case) and the numbers 0 and 1. None for anything else.
pub fn lax_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" | "t" | "y" => Some(true),
            "false" | "0" | "no" | "off" | "f" | "n" => Some(false),
            _ => None,
        },
        Value::Number(n) if n.as_f64() == Some(1.0) => Some(true),
        Value::Number(n) if n.as_f64() == Some(0.0) => Some(false),
        _ => None,
    }
}

/// Rewrites the boolean fields given as pydantic accepts them (`"true"`, `1`,
/// ...) to JSON booleans, so that a body vLLM takes is taken; other values are
/// left for the typed parse to refuse.
pub fn coerce_bools(body: &mut Value, chat: bool) {
    let Some(obj) = body.as_object_mut() else {
        return;
    };
    let chat_only: &[&str] = if chat { &["logprobs"] } else { &[] };
    for k in BOOLS.iter().chain(chat_only) {
        if let Some(v) = obj.get_mut(*k) {
            if let Some(b) = lax_bool(v) {
                *v = Value::Bool(b);
            }
        }
    }
    if let Some(o) = obj.get_mut("stream_options").and_then(Value::as_object_mut) {
        for k in ["include_usage", "continuous_usage_stats"] {
            if let Some(v) = o.get_mut(k) {
                if let Some(b) = lax_bool(v) {
                    *v = Value::Bool(b);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(r: Result<(), ApiError>) -> Option<String> {
        r.err().and_then(|e| e.param().map(str::to_string))
    }

    #[test]
    fn implemented_harmless_and_default_fields_pass() {
        let ok = json!({"prompt": "x", "max_tokens": 3, "user": "u", "best_of": 1,
                        "use_beam_search": false, "prompt_logprobs": null, "response_format": {"type": "json_object"},
                        "structured_outputs": {"regex": "a+"}, "guided_regex": null});
        assert!(check_fields(&ok, false, true).is_ok());
        let chat = json!({"messages": [], "top_logprobs": 2, "tools": [], "echo": false});
        assert!(check_fields(&chat, true, true).is_ok());
    }

    #[test]
    fn unimplemented_and_unknown_fields_are_named() {
        for (body, field) in [
            (json!({"logits_processors": ["x"]}), "logits_processors"),
            (json!({"prompt_embeds": "x"}), "prompt_embeds"),
            (json!({"guided_json": {"type": "object"}}), "guided_json"),
            (json!({"guided_choice": ["a"]}), "guided_choice"),
            (json!({"best_of": 3}), "best_of"),
            (json!({"frobnicate": true}), "frobnicate"),
            (
                json!({"stream_options": {"include_usage": true}}),
                "stream_options",
            ),
            (
                json!({"stream": true, "stream_options": {"continuous_usage_stats": 3}}),
                "stream_options",
            ),
            (json!({"cache_salt": ""}), "cache_salt"),
        ] {
            assert_eq!(
                param(check_fields(&body, false, true)).as_deref(),
                Some(field),
                "{body}"
            );
        }
        assert!(check_fields(&json!({"echo": true}), true, true).is_ok());
        assert!(check_fields(&json!({"echo": true}), false, true).is_ok());
        assert_eq!(
            param(check_fields(
                &json!({"continue_final_message": true}),
                false,
                true
            ))
            .as_deref(),
            Some("continue_final_message")
        );
    }

    /// Booleans as pydantic reads them: strings and 0/1 become booleans, other
    /// values are left for the typed parse to refuse; completions' `logprobs` is
    /// a number and stays one.
    #[test]
    fn booleans_sent_as_strings_are_read_as_vllm_reads_them() {
        let mut v = json!({"stream": "true", "echo": "False", "ignore_eos": 1,
                           "skip_special_tokens": "off", "add_special_tokens": "maybe",
                           "logprobs": 1, "stream_options": {"include_usage": "yes",
                           "continuous_usage_stats": "0"}});
        coerce_bools(&mut v, false);
        assert_eq!(
            v,
            json!({"stream": true, "echo": false, "ignore_eos": true,
                   "skip_special_tokens": false, "add_special_tokens": "maybe",
                   "logprobs": 1, "stream_options": {"include_usage": true,
                   "continuous_usage_stats": false}})
        );
        let mut c = json!({"logprobs": "true", "stream": 2});
        coerce_bools(&mut c, true);
        assert_eq!(c, json!({"logprobs": true, "stream": 2}));
    }

    /// vLLM's treatment of unknown fields (what routers rely on): ignored unless
    /// strict; known-but-unimplemented fields stay refused either way.
    #[test]
    fn unknown_fields_are_ignored_unless_strict() {
        let routed = json!({"prompt": "x", "no_stop_trim": true, "separate_reasoning": false,
                            "stream": true, "stream_options": {"include_usage": true, "x": 1}});
        assert!(check_fields(&routed, false, false).is_ok());
        assert_eq!(
            param(check_fields(&routed, false, true)).as_deref(),
            Some("no_stop_trim")
        );
        assert_eq!(
            param(check_fields(&json!({"best_of": 3}), false, false)).as_deref(),
            Some("best_of")
        );
        assert_eq!(
            param(check_fields(
                &json!({"logits_processors": ["x"]}),
                true,
                false
            ))
            .as_deref(),
            Some("logits_processors")
        );
    }
}
