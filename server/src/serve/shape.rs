//! What a chat choice's output becomes once tools and reasoning are in play:
//! the text goes through the `--reasoning-parser` (reasoning apart from the
//! answer), then the answer through the request's tool parser (the
//! `--tool-call-parser` for `tool_choice: "auto"`, the schema-bound parsers of
//! [`crate::serve::tools::choice`] for `required` and a named function).
//!
//! Streaming feeds each delta to a [`Shaper`]; the non-streamed answer feeds the
//! whole text at once ([`message`]). Both are the same prefix-stable parsers
//! (the property tests of `tools/tests.rs`), so a stream's deltas add up to the
//! non-streamed message however the engine cut the text.

use super::reasoning::{ReasoningParser, ReasoningStream};
use super::tools::{Item, ToolChoice, ToolParser, ToolStream};
use pagoda_core::FinishReason;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// How one request's choices are shaped (shared by its choices).
pub struct Shaping {
    pub reasoning: Option<&'static dyn ReasoningParser>,
    /// `include_reasoning: false` drops the reasoning (it is still split off).
    pub include_reasoning: bool,
    pub tools: Option<Arc<dyn ToolParser>>,
    /// `parallel_tool_calls` (false keeps only the first call).
    pub parallel: bool,
    /// Which parser `tools` is (for `finish_reason`).
    pub choice: ToolChoice,
}

impl Shaping {
    pub fn start(self: &Arc<Self>) -> Shaper {
        Shaper {
            reasoning: self.reasoning.map(ReasoningStream::new),
            tools: self
                .tools
                .as_ref()
                .map(|p| ToolStream::new(p.clone(), self.parallel)),
            cfg: self.clone(),
            calls: 0,
        }
    }
}

/// One choice's output so far (streaming).
pub struct Shaper {
    cfg: Arc<Shaping>,
    reasoning: Option<ReasoningStream>,
    tools: Option<ToolStream>,
    /// Calls started so far.
    calls: usize,
}

/// What one delta of output settled, in OpenAI's delta terms.
#[derive(Debug, Default, PartialEq)]
pub struct Delta {
    pub reasoning: String,
    pub content: String,
    /// `[{index, id, type, function: {name, arguments}}]` for a new call, then
    /// `[{index, function: {arguments}}]` for its argument fragments.
    pub tool_calls: Vec<Value>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.tool_calls.is_empty()
    }

    /// Writes the non-empty parts into a chunk's `delta`.
    pub fn write(self, delta: &mut Map<String, Value>) {
        if !self.content.is_empty() {
            delta.insert("content".into(), self.content.into());
        }
        if !self.reasoning.is_empty() {
            delta.insert("reasoning".into(), self.reasoning.into());
        }
        if !self.tool_calls.is_empty() {
            delta.insert("tool_calls".into(), self.tool_calls.into());
        }
    }
}

/// A tool call id as vLLM makes them: `chatcmpl-tool-` and 32 hex digits.
pub fn tool_call_id() -> String {
    random_id("chatcmpl-tool-")
}

/// `prefix` and 32 unpredictable hex digits.
pub fn random_id(prefix: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // std's hasher keys are random per `RandomState`: two of them make 128
    // unpredictable bits without a dependency.
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let half = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        h.finish()
    };
    format!("{prefix}{:016x}{:016x}", half(), half())
}

impl Shaper {
    /// Feeds one delta of the output (`fin`: the last).
    pub fn push(&mut self, text: &str, fin: bool) -> Delta {
        let (reasoning, answer) = match &mut self.reasoning {
            Some(r) => r.push(text, fin),
            None => (String::new(), text.to_string()),
        };
        let mut d = Delta::default();
        if self.cfg.include_reasoning {
            d.reasoning = reasoning;
        }
        let Some(tools) = &mut self.tools else {
            d.content = answer;
            return d;
        };
        for item in tools.push(&answer, fin) {
            match item {
                Item::Content(s) => d.content.push_str(&s),
                Item::CallStart { name } => {
                    d.tool_calls.push(json!({
                        "index": self.calls, "id": tool_call_id(), "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }));
                    self.calls += 1;
                }
                Item::Args(a) => {
                    let index = self.calls.saturating_sub(1);
                    // Fragments of a call started in this same delta join it.
                    match d.tool_calls.last_mut() {
                        Some(last) if last["index"] == index => {
                            let args = &mut last["function"]["arguments"];
                            *args = format!("{}{a}", args.as_str().unwrap_or("")).into();
                        }
                        _ => d
                            .tool_calls
                            .push(json!({"index": index, "function": {"arguments": a}})),
                    }
                }
            }
        }
        d
    }

    /// The choice's `finish_reason`, as vLLM's: `tool_calls` once `auto` found
    /// a call, or `required`'s call ended on a stop; the engine's otherwise (a
    /// named function too, as OpenAI answers a forced function).
    pub fn finish_reason(&self, engine: Option<FinishReason>) -> &'static str {
        let engine = engine.unwrap_or(FinishReason::Abort);
        let calls = self.calls > 0;
        match self.cfg.choice {
            ToolChoice::Auto if calls => "tool_calls",
            ToolChoice::Required if calls && engine == FinishReason::Stop => "tool_calls",
            _ => engine.as_str(),
        }
    }
}

/// The non-streamed `message` of a choice and its `finish_reason`.
pub fn message(
    cfg: &Arc<Shaping>,
    text: &str,
    engine: Option<FinishReason>,
) -> (Value, &'static str) {
    let mut sh = cfg.start();
    let d = sh.push(text, true);
    let mut calls: Vec<Value> = Vec::new();
    for c in d.tool_calls {
        match c.get("id") {
            Some(id) => {
                calls.push(json!({"id": id, "type": "function", "function": c["function"]}))
            }
            None => {
                if let Some(last) = calls.last_mut() {
                    let a = &mut last["function"]["arguments"];
                    *a = format!(
                        "{}{}",
                        a.as_str().unwrap_or(""),
                        c["function"]["arguments"].as_str().unwrap_or("")
                    )
                    .into();
                }
            }
        }
    }
    let content = if d.content.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        d.content.into()
    };
    let mut m = json!({"role": "assistant", "content": content});
    if cfg.reasoning.is_some() {
        m["reasoning"] = if d.reasoning.is_empty() {
            Value::Null
        } else {
            d.reasoning.into()
        };
    }
    if !calls.is_empty() {
        m["tool_calls"] = calls.into();
    }
    (m, sh.finish_reason(engine))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::{reasoning, tools};

    fn shaping(choice: ToolChoice, reasoning: Option<&str>) -> Arc<Shaping> {
        let tools: Option<Arc<dyn ToolParser>> = match &choice {
            ToolChoice::None => None,
            ToolChoice::Auto => Some(Arc::new(tools::lookup("hermes").unwrap())),
            ToolChoice::Required => Some(Arc::new(tools::choice::RequiredParser)),
            ToolChoice::Named(n) => Some(Arc::new(tools::choice::NamedParser(n.clone()))),
        };
        Arc::new(Shaping {
            reasoning: reasoning.map(|n| reasoning::lookup(n).unwrap()),
            include_reasoning: true,
            tools,
            parallel: true,
            choice,
        })
    }

    const OUT: &str = "<think>hmm</think>Sure. <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";

    /// Streamed one char at a time, the deltas fold to the one-shot message:
    /// id, type and name once, then argument fragments; the same finish.
    #[test]
    fn deltas_fold_to_the_message() {
        let cfg = shaping(ToolChoice::Auto, Some("qwen3"));
        let (m, finish) = message(&cfg, OUT, Some(FinishReason::Stop));
        assert_eq!(m["reasoning"], "hmm");
        assert_eq!(m["content"], "Sure. ");
        assert_eq!(m["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
        assert_eq!(finish, "tool_calls");
        let mut sh = cfg.start();
        let (mut r, mut c, mut calls) = (String::new(), String::new(), Vec::<Value>::new());
        let chars: Vec<char> = OUT.chars().collect();
        for (i, ch) in chars.iter().enumerate() {
            let d = sh.push(&ch.to_string(), i + 1 == chars.len());
            r.push_str(&d.reasoning);
            c.push_str(&d.content);
            calls.extend(d.tool_calls);
        }
        assert_eq!((r.as_str(), c.as_str()), ("hmm", "Sure. "));
        assert!(calls[0]["id"]
            .as_str()
            .unwrap()
            .starts_with("chatcmpl-tool-"));
        assert_eq!(calls[0]["type"], "function");
        let args: String = calls
            .iter()
            .map(|c| c["function"]["arguments"].as_str().unwrap())
            .collect();
        assert_eq!(args, "{\"a\":1}");
        assert!(calls[1..].iter().all(|c| c.get("id").is_none()));
        assert_eq!(sh.finish_reason(Some(FinishReason::Stop)), "tool_calls");
    }

    #[test]
    fn finish_reasons_follow_vllm() {
        let named = shaping(ToolChoice::Named("f".into()), None);
        let (m, finish) = message(&named, "{\"a\": 1}", Some(FinishReason::Stop));
        assert_eq!(
            (finish, &m["tool_calls"][0]["function"]["arguments"]),
            ("stop", &json!("{\"a\": 1}"))
        );
        assert!(m["content"].is_null() && m.get("reasoning").is_none());
        let req = shaping(ToolChoice::Required, None);
        let text = "[{\"name\": \"f\", \"parameters\": {}}]";
        assert_eq!(
            message(&req, text, Some(FinishReason::Stop)).1,
            "tool_calls"
        );
        assert_eq!(message(&req, text, Some(FinishReason::Length)).1, "length");
        let none = shaping(ToolChoice::None, Some("deepseek_r1"));
        let (m, finish) = message(&none, "a</think>b", Some(FinishReason::Stop));
        assert_eq!(
            (m["reasoning"].as_str(), m["content"].as_str(), finish),
            (Some("a"), Some("b"), "stop")
        );
        let ids = (tool_call_id(), tool_call_id());
        assert_ne!(ids.0, ids.1);
        assert_eq!(ids.0.len(), "chatcmpl-tool-".len() + 32);
    }
}
