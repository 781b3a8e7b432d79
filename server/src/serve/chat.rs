//! The chat-specific parts of a request: rendering the conversation through the
//! template (with `tools`, assistant `tool_calls` and `tool` messages, as HF
//! tool-use templates read them), and what `tools` / `tool_choice` and the
//! `--reasoning-parser` make of the output ([`shape`](super::shape)).

use super::error::ApiError;
use super::protocol::{ChatMessageIn, ChatRequest, MessageContent};
use super::shape::Shaping;
use super::state::AppState;
use super::tools::choice::{self, NamedParser, RequiredParser, ToolChoice};
use super::tools::ToolParser;
use pagoda_core::{Constraint, SamplingParams, StructuredOutputs};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// vLLM's message for `auto` without the flags that enable it.
pub const AUTO_NEEDS_FLAGS: &str =
    "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set";

/// One message as the template sees it: `content` as text; an assistant's
/// `tool_calls` with `arguments` parsed into a mapping (what HF templates
/// expect, as vLLM hands them over); a tool message's `tool_call_id`; `name`.
fn template_message(i: usize, m: &ChatMessageIn) -> Result<Value, ApiError> {
    let mut out = json!({"role": m.role, "content": m.text()?});
    if let Some(calls) = m.tool_calls.as_ref().filter(|v| !v.is_null()) {
        let bad =
            |what: String| ApiError::bad("messages", format!("messages[{i}].tool_calls{what}"));
        let list = calls
            .as_array()
            .ok_or_else(|| bad(" must be a list".into()))?;
        let mut shown = Vec::with_capacity(list.len());
        for (j, c) in list.iter().enumerate() {
            let f = c
                .get("function")
                .filter(|f| f.is_object())
                .ok_or_else(|| bad(format!("[{j}].function must be an object")))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("[{j}].function.name must be a string")))?;
            let args = match f.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(s)) if s.trim().is_empty() => json!({}),
                Some(Value::String(s)) => serde_json::from_str(s)
                    .map_err(|e| bad(format!("[{j}].function.arguments is not valid JSON: {e}")))?,
                Some(v @ (Value::Object(_) | Value::Array(_))) => v.clone(),
                Some(_) => {
                    return Err(bad(format!(
                        "[{j}].function.arguments must be a JSON string"
                    )))
                }
            };
            shown.push(json!({
                "id": c.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {"name": name, "arguments": args},
            }));
        }
        out["tool_calls"] = shown.into();
    }
    for (key, v) in [("tool_call_id", &m.tool_call_id), ("name", &m.name)] {
        match v {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => out[key] = s.clone().into(),
            Some(_) => {
                return Err(ApiError::bad(
                    "messages",
                    format!("messages[{i}].{key} must be a string"),
                ))
            }
        }
    }
    if let Some(r) = m.reasoning.as_ref().or(m.reasoning_content.as_ref()) {
        out["reasoning"] = r.clone().into();
        out["reasoning_content"] = r.clone().into();
    }
    Ok(out)
}

/// Every message for the template.
pub fn template_messages(messages: &[ChatMessageIn]) -> Result<Vec<Value>, ApiError> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| template_message(i, m))
        .collect()
}

impl AppState {
    /// Renders chat messages (and `tools`) through the model's template. With
    /// `continue_final_message` the output stops right after the final message's
    /// content (its end-of-turn markup is cut), as vLLM and HF do.
    pub(super) fn render_chat(
        &self,
        messages: &[ChatMessageIn],
        tools: Option<&Value>,
        (add_generation_prompt, continue_final): (bool, bool),
        kwargs: Option<&Map<String, Value>>,
    ) -> Result<String, ApiError> {
        let tmpl = self.chat_template().ok_or_else(|| {
            ApiError::bad(
                "messages",
                "this model has no chat template; use /v1/completions",
            )
        })?;
        let total: usize = messages
            .iter()
            .map(|m| match &m.content {
                Some(MessageContent::Text(t)) => t.len(),
                Some(MessageContent::Parts(p)) => p
                    .iter()
                    .map(|p| p.text.as_ref().map_or(0, |t| t.len()))
                    .sum(),
                None => 0,
            })
            .sum();
        self.check_text_len("messages", total)?;
        let msgs = template_messages(messages)?;
        let tools = tools.filter(|t| !t.is_null());
        let text = tmpl
            .render_messages(&msgs, add_generation_prompt, tools, kwargs)
            .map_err(|e| {
                ApiError::bad("messages", format!("cannot render the chat template: {e}"))
            })?;
        if !continue_final {
            return Ok(text);
        }
        let last = msgs
            .last()
            .and_then(|m| m["content"].as_str())
            .map(str::trim)
            .unwrap_or("");
        match text.rfind(last) {
            Some(at) if !last.is_empty() => Ok(text[..at + last.len()].to_string()),
            _ => Err(ApiError::bad(
                "continue_final_message",
                "continue_final_message needs a final message with content that the chat template keeps",
            )),
        }
    }

    /// What `tools`, `tool_choice` and the reasoning parser ask of a chat
    /// request's output: `required` and a named function constrain it to their
    /// JSON schema (so `params` gets that constraint); `auto` needs the flags.
    /// None when the output is plain content.
    pub(super) fn chat_shaping(
        &self,
        req: &ChatRequest,
        params: &mut SamplingParams,
    ) -> Result<Option<Arc<Shaping>>, ApiError> {
        let tools = choice::parse_tools(req.tools.as_ref())?;
        let tool_choice = choice::parse_choice(req.tool_choice.as_ref(), &tools)?;
        let parallel = req.parallel_tool_calls.unwrap_or(true);
        let parser: Option<Arc<dyn ToolParser>> = match &tool_choice {
            ToolChoice::None => None,
            ToolChoice::Auto => match self.tool_parser {
                Some(p) => Some(Arc::new(p)),
                None => return Err(ApiError::bad("tool_choice", AUTO_NEEDS_FLAGS)),
            },
            ToolChoice::Required => Some(Arc::new(RequiredParser)),
            ToolChoice::Named(n) => Some(Arc::new(NamedParser(n.clone()))),
        };
        if let Some(schema) = choice::schema(&tool_choice, &tools, parallel) {
            if params.structured_outputs.is_some() {
                return Err(ApiError::bad(
                    "tool_choice",
                    "`tool_choice` \"required\" or a named function constrains the output \
                     itself: leave `structured_outputs` and `response_format` out",
                ));
            }
            params.structured_outputs =
                Some(Arc::new(StructuredOutputs::new(Constraint::Json(schema))));
        }
        if parser.is_none() && self.reasoning_parser.is_none() {
            return Ok(None);
        }
        Ok(Some(Arc::new(Shaping {
            reasoning: self.reasoning_parser,
            include_reasoning: req.include_reasoning.unwrap_or(true),
            tools: parser,
            parallel,
            choice: tool_choice,
        })))
    }
}
