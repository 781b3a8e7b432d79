//! Issue 25: tool calling and reasoning output through `pagoda serve` on the
//! real model.
//!
//! - `tool_choice: "required"` and a named function constrain the output to the
//!   tools' schema: the arguments parse and validate, streamed and not, and the
//!   stream's deltas (id, type and name once, then argument fragments) add up
//!   to the non-streamed `tool_calls`.
//! - `auto` with `--tool-call-parser hermes`, on an output forced (by a
//!   `structured_outputs` regex) to hold a `<tool_call>` block: the block comes
//!   back as `tool_calls`, identical streamed and not, with no markup in
//!   `content`.
//! - A conversation with an assistant's `tool_calls` and a `tool` message
//!   renders through the template (which sees `tools` and the calls) and
//!   answers.
//! - `--reasoning-parser`: a forced `<think>…</think>` lands in `reasoning`,
//!   streamed and not; `chat_template_kwargs` reach the template.
//! - Bad inputs are 400s naming the field; bad flags stop the server at start.

mod common;

use common::{assert_error, Server};
use serde_json::{json, Value};
use std::process::Command;

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["city", "unit"],
                "additionalProperties": false
            }
        }},
        {"type": "function", "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                "required": ["city"],
                "additionalProperties": false
            }
        }}
    ])
}

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": weather_tools(),
        "max_tokens": 120,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Checks `arguments` against the test tools' schemas (the enums, required keys,
/// no others) and returns them parsed.
fn check_args(name: &str, arguments: &Value) -> Value {
    let text = arguments.as_str().expect("arguments is a JSON string");
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let o = v.as_object().expect("arguments is an object");
    let (allowed, required): (&[&str], &[&str]) = match name {
        "get_weather" => (&["city", "unit"], &["city", "unit"]),
        "get_time" => (&["city"], &["city"]),
        other => panic!("unknown tool {other}"),
    };
    for k in o.keys() {
        assert!(
            allowed.contains(&k.as_str()),
            "{name}: extra key {k} in {text}"
        );
    }
    for k in required {
        assert!(o.contains_key(*k), "{name}: missing {k} in {text}");
    }
    assert!(["Paris", "London", "Tokyo"].contains(&o["city"].as_str().unwrap()));
    if let Some(u) = o.get("unit") {
        assert!(["celsius", "fahrenheit"].contains(&u.as_str().unwrap()));
    }
    v
}

/// A streamed answer folded back: content, reasoning, calls as
/// `(id, name, arguments)`, the last finish_reason. Asserts the delta shape:
/// id, type and name come once per call (its first delta), then only
/// argument fragments.
fn fold_stream(events: &[Value]) -> (String, String, Vec<(String, String, String)>, String) {
    let (mut content, mut reasoning) = (String::new(), String::new());
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut finish = String::new();
    for e in events {
        let Some(c) = e["choices"].get(0) else {
            continue;
        };
        let d = &c["delta"];
        content.push_str(d["content"].as_str().unwrap_or(""));
        reasoning.push_str(d["reasoning"].as_str().unwrap_or(""));
        for t in d["tool_calls"].as_array().into_iter().flatten() {
            let index = t["index"].as_u64().expect("index") as usize;
            if index == calls.len() {
                assert_eq!(t["type"], "function", "{t}");
                let id = t["id"].as_str().expect("a new call has an id").to_string();
                let name = t["function"]["name"]
                    .as_str()
                    .expect("and a name")
                    .to_string();
                calls.push((id, name, String::new()));
            } else {
                assert_eq!(index + 1, calls.len(), "calls come in order: {t}");
                assert!(
                    t.get("id").is_none() && t["function"].get("name").is_none(),
                    "{t}"
                );
            }
            calls[index]
                .2
                .push_str(t["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (content, reasoning, calls, finish)
}

/// `(name, arguments)` of a non-streamed message's calls, with their shape checked.
fn message_calls(m: &Value) -> Vec<(String, String)> {
    m["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            assert!(
                c["id"].as_str().unwrap().starts_with("chatcmpl-tool-"),
                "{c}"
            );
            assert_eq!(c["type"], "function");
            (
                c["function"]["name"].as_str().unwrap().to_string(),
                c["function"]["arguments"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn names_args(calls: &[(String, String, String)]) -> Vec<(String, String)> {
    calls
        .iter()
        .map(|(_, n, a)| (n.clone(), a.clone()))
        .collect()
}

#[test]
fn forced_tool_calls_validate_streamed_and_not() {
    let s = Server::start(&["--kv-cache-memory-mib", "64"]);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for (choice, finish) in [(named, "stop"), (json!("required"), "tool_calls")] {
        // One call at most (`maxItems: 1`), so the output is bounded and ends.
        let body = ask(json!({"tool_choice": choice, "parallel_tool_calls": false}));
        let v = s.post_ok("/v1/chat/completions", &body);
        let c = &v["choices"][0];
        let calls = message_calls(&c["message"]);
        assert!(!calls.is_empty(), "{choice}: {v}");
        for (name, args) in &calls {
            check_args(name, &json!(args));
        }
        if choice.is_object() {
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].0, "get_weather");
        }
        assert_eq!(c["finish_reason"], finish, "{choice}: {v}");
        assert!(c["message"]["content"].is_null(), "{v}");
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let (content, _, streamed, sfinish) = fold_stream(&s.stream("/v1/chat/completions", &sb));
        assert_eq!(names_args(&streamed), calls, "{choice}: streamed vs not");
        assert_eq!(sfinish, finish);
        assert!(content.is_empty(), "{content:?}");
    }
    // Parallel calls allowed: every whole call validates (the model may run
    // into max_tokens in a later one).
    let v = s.post_ok(
        "/v1/chat/completions",
        &ask(json!({"tool_choice": "required"})),
    );
    let calls = message_calls(&v["choices"][0]["message"]);
    assert!(!calls.is_empty(), "{v}");
    for (name, args) in &calls {
        check_args(name, &json!(args));
    }
    bad_requests_are_400s(&s);
}

/// Bad tool inputs on a server without the auto flags.
fn bad_requests_are_400s(s: &Server) {
    let chat = "/v1/chat/completions";
    let cases: Vec<(Value, &str, &str)> = vec![
        // `tools` alone means `auto`, which needs the flags (vLLM's message).
        (ask(json!({})), "tool_choice", "--enable-auto-tool-choice"),
        (
            ask(json!({"tool_choice": "auto"})),
            "tool_choice",
            "--tool-call-parser",
        ),
        (
            ask(json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}})),
            "tool_choice",
            "nope",
        ),
        (
            ask(json!({"tool_choice": "sometimes"})),
            "tool_choice",
            "sometimes",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
            "tool_choice",
            "`tools` must be set",
        ),
        (
            ask(json!({"tools": [{"type": "function", "function": {}}]})),
            "tools",
            "name",
        ),
        (ask(json!({"tools": {"a": 1}})), "tools", "list"),
        (
            ask(json!({"tool_choice": "required", "structured_outputs": {"regex": "a"}})),
            "tool_choice",
            "structured_outputs",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null,
                    "tool_calls": [{"id": "c", "type": "function",
                                    "function": {"name": "f", "arguments": "{not json"}}]}]}),
            "messages",
            "not valid JSON",
        ),
    ];
    for (body, param, needle) in cases {
        let (status, text) = s.post_raw(chat, body.to_string().as_bytes());
        assert_error(status, &text, 400, &format!("{body}"));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], param, "{body}: {text}");
        assert!(text.contains(needle), "{body}: {text} lacks {needle:?}");
    }
    // `tool_choice: "none"` needs no flags; the tools still reach the template.
    let v = s.post_ok(chat, &ask(json!({"tool_choice": "none", "max_tokens": 4})));
    assert!(
        v["choices"][0]["message"].get("tool_calls").is_none(),
        "{v}"
    );
    // Completions still refuse `tools`.
    let (status, text) = s.post_raw(
        "/v1/completions",
        json!({"prompt": "x", "tools": weather_tools()})
            .to_string()
            .as_bytes(),
    );
    assert_error(status, &text, 400, "tools on completions");
}

/// A ChatML template that shows `tools`, an assistant's calls, a tool
/// message's `tool_call_id` and `enable_thinking` (as Qwen3's does).
const TOOL_TEMPLATE: &str = r#"{% if tools %}<|im_start|>system
Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}</tool_call>{% endfor %}{% if m.tool_call_id %} [answers {{ m.tool_call_id }}]{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"#;

fn template_file() -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), TOOL_TEMPLATE).unwrap();
    f
}

/// The prompt a chat body renders to (`/tokenize`, then `/detokenize`).
fn rendered(s: &Server, body: &Value) -> String {
    let mut t = json!({"messages": body["messages"]});
    for k in ["tools", "chat_template_kwargs"] {
        if let Some(v) = body.get(k) {
            t[k] = v.clone();
        }
    }
    let ids = s.post_ok("/tokenize", &t)["tokens"].clone();
    s.post_ok("/detokenize", &json!({"tokens": ids}))["prompt"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn auto_hermes_parses_forced_block_and_multi_turn_renders() {
    let tmpl = template_file();
    let s = Server::start(&[
        "--kv-cache-memory-mib",
        "64",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--chat-template",
        tmpl.path().to_str().unwrap(),
    ]);
    let regex = r#"Let me check\. <tool_call>\{"name": "get_weather", "arguments": \{"city": "(Paris|London)", "unit": "celsius"\}\}</tool_call>"#;
    let body = ask(json!({"structured_outputs": {"regex": regex}, "max_tokens": 80}));
    let v = s.post_ok("/v1/chat/completions", &body);
    let c = &v["choices"][0];
    let calls = message_calls(&c["message"]);
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0].0, "get_weather");
    let args = check_args("get_weather", &json!(calls[0].1));
    assert_eq!(args["unit"], "celsius");
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    let content = c["message"]["content"].as_str().unwrap_or("");
    assert_eq!(content.trim(), "Let me check.", "{v}");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (scontent, _, streamed, finish) = fold_stream(&s.stream("/v1/chat/completions", &sb));
    assert_eq!(names_args(&streamed), calls, "streamed vs not");
    assert_eq!(scontent, content);
    assert_eq!(finish, "tool_calls");
    // Without a block the answer is plain content, as without tools.
    let plain = ask(json!({"structured_outputs": {"regex": "It is sunny\\."}}));
    let v = s.post_ok("/v1/chat/completions", &plain);
    assert_eq!(v["choices"][0]["message"]["content"], "It is sunny.", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    multi_turn_renders(&s);
}

/// The conversation after a call: the assistant's `tool_calls` (arguments as a
/// JSON string, content null) and the tool's answer render and generate.
fn multi_turn_renders(s: &Server) {
    let body = json!({
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"}
        ],
        "tools": weather_tools(),
        "tool_choice": "none",
        "max_tokens": 8,
        "temperature": 0,
    });
    let v = s.post_ok("/v1/chat/completions", &body);
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    let prompt = rendered(s, &body);
    // The call's arguments reach the template as a mapping (re-serialized).
    let call = prompt
        .split("<tool_call>")
        .nth(1)
        .and_then(|t| t.split("</tool_call>").next())
        .unwrap_or_else(|| panic!("no call in {prompt:?}"));
    let call: Value = serde_json::from_str(call).unwrap_or_else(|e| panic!("{call}: {e}"));
    assert_eq!(
        call["arguments"],
        json!({"city": "Paris", "unit": "celsius"})
    );
    assert_eq!(call["name"], "get_weather");
    for want in [
        "Tools: get_weather get_time",
        "<|im_start|>tool\n21 degrees and sunny [answers call_1]",
    ] {
        assert!(prompt.contains(want), "{want:?} not in {prompt:?}");
    }
}

#[test]
fn reasoning_is_split_streamed_and_not() {
    let tmpl = template_file();
    let s = Server::start(&[
        "--kv-cache-memory-mib",
        "64",
        "--reasoning-parser",
        "qwen3",
        "--chat-template",
        tmpl.path().to_str().unwrap(),
    ]);
    let body = json!({
        "messages": [{"role": "user", "content": "Is 7 prime?"}],
        "structured_outputs": {"regex": "<think>Seven has no divisors but one and itself\\.</think>Yes\\."},
        "max_tokens": 60,
        "temperature": 0,
    });
    let v = s.post_ok("/v1/chat/completions", &body);
    let m = &v["choices"][0]["message"];
    assert_eq!(
        m["reasoning"], "Seven has no divisors but one and itself.",
        "{v}"
    );
    assert_eq!(m["content"], "Yes.", "{v}");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (content, reasoning, calls, finish) = fold_stream(&s.stream("/v1/chat/completions", &sb));
    assert_eq!(reasoning, m["reasoning"].as_str().unwrap());
    assert_eq!(content, "Yes.");
    assert!(calls.is_empty());
    assert_eq!(finish, "stop");
    // `include_reasoning: false` leaves it out.
    let mut nb = body.clone();
    nb["include_reasoning"] = json!(false);
    let v = s.post_ok("/v1/chat/completions", &nb);
    assert!(v["choices"][0]["message"]["reasoning"].is_null(), "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "Yes.");
    // No think block: all content.
    let plain = json!({"messages": body["messages"], "structured_outputs": {"regex": "No\\."},
                       "max_tokens": 5, "temperature": 0});
    let v = s.post_ok("/v1/chat/completions", &plain);
    assert_eq!(v["choices"][0]["message"]["content"], "No.");
    assert!(v["choices"][0]["message"]["reasoning"].is_null());
    // `chat_template_kwargs` reach the template (Qwen3's `enable_thinking`).
    let mut off = body.clone();
    off["chat_template_kwargs"] = json!({"enable_thinking": false});
    assert!(rendered(&s, &off).ends_with("<think>\n\n</think>\n\n"));
    assert!(!rendered(&s, &body).contains("<think>"));
    s.post_ok("/v1/chat/completions", &off);
}

/// Flags that cannot work stop the server before the model loads, with
/// vLLM's messages (an unknown name lists the registered parsers).
#[test]
fn bad_parser_flags_fail_at_start() {
    let model = common::model_path();
    let run = |flags: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_pagoda"))
            .args(["serve", "--host", "127.0.0.1", "--port", "1", "--model"])
            .arg(&model)
            .args(flags)
            .output()
            .expect("running pagoda");
        assert!(!out.status.success(), "{flags:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(&["--enable-auto-tool-choice", "--tool-call-parser", "nope"]);
    assert!(e.contains("invalid tool call parser: nope"), "{e}");
    for name in ["hermes", "llama3_json", "mistral", "pythonic"] {
        assert!(e.contains(name), "{name} not listed: {e}");
    }
    let e = run(&["--enable-auto-tool-choice"]);
    assert!(
        e.contains("--enable-auto-tool-choice requires --tool-call-parser"),
        "{e}"
    );
    let e = run(&["--reasoning-parser", "nope"]);
    assert!(
        e.contains("invalid reasoning parser: nope") && e.contains("deepseek_r1"),
        "{e}"
    );
}

/// A constraint applies to the answer, not to the reasoning before it (vLLM's rule;
/// `pagoda_engine::structured::ReasoningGate`). `deepseek_r1` reads the output as
/// reasoning from its first token: under `choice`, the free-running reasoning runs
/// to `max_tokens` (SmolLM2 never writes `</think>`) instead of being forced into a
/// choice; a prompt that closed its think block already (the assistant's own
/// message continued) has no reasoning to come, and the choice applies at once.
#[test]
fn structured_outputs_constrain_the_answer_after_the_reasoning() {
    let tmpl = template_file();
    let s = Server::start(&[
        "--kv-cache-memory-mib",
        "64",
        "--reasoning-parser",
        "deepseek_r1",
        "--chat-template",
        tmpl.path().to_str().unwrap(),
    ]);
    let choice = json!({"choice": ["Yes.", "No."]});
    let body = json!({
        "messages": [{"role": "user", "content": "Is 7 prime?"}],
        "structured_outputs": choice,
        "max_tokens": 8,
        "temperature": 0,
    });
    let v = s.post_ok("/v1/chat/completions", &body);
    let c = &v["choices"][0];
    assert_eq!(
        c["finish_reason"], "length",
        "reasoning is not constrained: {v}"
    );
    assert_eq!(v["usage"]["completion_tokens"], 8, "{v}");
    let reasoning = c["message"]["reasoning"].as_str().unwrap_or("");
    assert!(!reasoning.is_empty(), "{v}");
    assert!(!["Yes.", "No."].contains(&reasoning), "{v}");
    // Streamed: the same.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (_, streamed, _, finish) = fold_stream(&s.stream("/v1/chat/completions", &sb));
    assert_eq!((streamed.as_str(), finish.as_str()), (reasoning, "length"));

    // The think block closed in the prompt: the choice applies from the first token.
    let closed = json!({
        "messages": [{"role": "user", "content": "Is 7 prime?"},
                     {"role": "assistant", "content": "<think>Seven has no divisors.</think>"}],
        "continue_final_message": true,
        "add_generation_prompt": false,
        "structured_outputs": choice,
        "max_tokens": 8,
        "temperature": 0,
    });
    let v = s.post_ok("/v1/chat/completions", &closed);
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "stop", "{v}");
    // (deepseek_r1 reads an output without markers as reasoning.)
    let m = &c["message"];
    let text = format!(
        "{}{}",
        m["reasoning"].as_str().unwrap_or(""),
        m["content"].as_str().unwrap_or("")
    );
    assert!(["Yes.", "No."].contains(&text.as_str()), "{v}");
}
