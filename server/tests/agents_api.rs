//! Issue 25 items 4 and 5: `/v1/responses` and `/v1/messages` through `pagoda
//! serve` on the real model (and item 6's gaps: continuous usage on every
//! chunk, string booleans, out-of-vocabulary and `logit_bias` messages).
//!
//! - Responses: text in and out, streamed events (`sequence_number` in order,
//!   deltas adding up to the non-streamed text), `GET` of a stored response,
//!   `store: false`, a forced function call (flat tools, named `tool_choice`)
//!   whose arguments validate, streamed and not, and its round trip through
//!   `previous_response_id` and a `function_call_output` item; 400s and 404s.
//! - Messages: text with `system`, `stop_sequences` (`stop_reason:
//!   "stop_sequence"`), the stream's events adding up to the non-streamed
//!   content, a forced `tool_use` and its `tool_result` round trip,
//!   `count_tokens`, `x-api-key`, Anthropic-shaped errors.
//! - With `--reasoning-parser` and `--tool-call-parser hermes` (`auto`): a
//!   forced `<think>` and `<tool_call>` become reasoning / thinking, text and
//!   function_call / tool_use, identical streamed and not.

mod common;

use common::Server;
use serde_json::{json, Value};

const KEY: &str = "agents-test-key";

fn flat_tools() -> Value {
    json!([{
        "type": "function", "name": "get_weather", "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
            },
            "required": ["city", "unit"], "additionalProperties": false
        }
    }])
}

/// The same tool in Anthropic's shape.
fn anthropic_tools() -> Value {
    let t = &flat_tools()[0];
    json!([{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}])
}

/// Checks arguments against `get_weather`'s schema.
fn check_weather(args: &Value) {
    let o = args
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {args}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["city", "unit"], "{args}");
    assert!(["Paris", "London", "Tokyo"].contains(&o["city"].as_str().unwrap()));
    assert!(["celsius", "fahrenheit"].contains(&o["unit"].as_str().unwrap()));
}

/// The text of a response's message items.
fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect()
}

/// A streamed response folded: (text deltas, argument deltas, final response).
/// Asserts the event order: created, in_progress first, sequence numbers
/// from 0 without gaps, each `.done` repeating what its deltas added up to.
fn fold_response(events: &[Value]) -> (String, String, Value) {
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..2],
        ["response.created", "response.in_progress"],
        "{kinds:?}"
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    let (mut text, mut args) = (String::new(), String::new());
    let (mut item_text, mut item_args) = (String::new(), String::new());
    for e in events {
        match e["type"].as_str().unwrap() {
            "response.output_text.delta" => item_text.push_str(e["delta"].as_str().unwrap()),
            "response.output_text.done" => {
                assert_eq!(e["text"], item_text.as_str(), "{e}");
                text.push_str(&std::mem::take(&mut item_text));
            }
            "response.function_call_arguments.delta" => {
                item_args.push_str(e["delta"].as_str().unwrap())
            }
            "response.function_call_arguments.done" => {
                assert_eq!(e["arguments"], item_args.as_str(), "{e}");
                args.push_str(&std::mem::take(&mut item_args));
            }
            _ => {}
        }
    }
    let last = events.last().unwrap();
    // `completed` also for an incomplete response (vLLM's; what `responses.stream()` waits for).
    assert_eq!(last["type"], "response.completed", "{last}");
    (text, args, last["response"].clone())
}

/// Output items without their (random) ids, to compare streamed and not.
fn without_ids(r: &Value) -> Value {
    let mut out = r["output"].clone();
    for i in out.as_array_mut().unwrap() {
        i.as_object_mut().unwrap().remove("id");
        i.as_object_mut().unwrap().remove("call_id");
    }
    out
}

#[test]
fn responses_text_store_tools_and_errors() {
    let s = Server::start(&["--kv-cache-memory-mib", "64", "--api-key", KEY]);
    let body = json!({"input": "Say hello.", "instructions": "Be brief.",
                      "max_output_tokens": 12, "temperature": 0});
    let r = s.post_ok("/v1/responses", &body);
    assert_eq!(r["object"], "response");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
    assert_eq!(r["instructions"], "Be brief.");
    let u = &r["usage"];
    let out_tokens = u["output_tokens"].as_u64().unwrap();
    assert!(
        u["input_tokens"].as_u64().unwrap() > 0 && out_tokens <= 12,
        "{r}"
    );
    assert_eq!(
        u["total_tokens"],
        u["input_tokens"].as_u64().unwrap() + out_tokens
    );
    match r["status"].as_str().unwrap() {
        "incomplete" => assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens"),
        "completed" => assert!(out_tokens < 12, "{r}"),
        other => panic!("status {other}"),
    }
    let text = output_text(&r);
    assert!(!text.is_empty(), "{r}");
    // `instructions` are the system message: the prompt is chat's.
    let chat = s.post_ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Say hello."}],
                "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(chat["usage"]["prompt_tokens"], u["input_tokens"]);
    assert_eq!(chat["choices"][0]["message"]["content"], text.as_str());
    // Streamed: the same text and the same final object (ids aside).
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (stext, _, sr) = fold_response(&s.stream_typed("/v1/responses", &sb));
    assert_eq!(stext, text);
    assert_eq!(without_ids(&sr), without_ids(&r));
    // (Cached tokens differ: the prefix cache holds the first request's prompt.)
    for k in ["input_tokens", "output_tokens", "total_tokens"] {
        assert_eq!(sr["usage"][k], r["usage"][k], "{k}");
    }
    // Stored: GET returns it; `store: false` is not kept.
    let (code, got) = s.get(&format!("/v1/responses/{}", r["id"].as_str().unwrap()));
    assert_eq!(code, 200, "{got}");
    assert_eq!(serde_json::from_str::<Value>(&got).unwrap(), r);
    let (code, _) = s.get(&format!("/v1/responses/{}", sr["id"].as_str().unwrap()));
    assert_eq!(code, 200, "a streamed response is stored too");
    let mut nb = body.clone();
    nb["store"] = json!(false);
    let n = s.post_ok("/v1/responses", &nb);
    assert_eq!(n["store"], false);
    let (code, text404) = s.get(&format!("/v1/responses/{}", n["id"].as_str().unwrap()));
    common::assert_error(code, &text404, 404, "store: false");
    forced_call_round_trip(&s);
    response_errors(&s);
}

fn forced_call_round_trip(s: &Server) {
    let body = json!({
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}],
        "tools": flat_tools(),
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 60, "temperature": 0,
    });
    let r = s.post_ok("/v1/responses", &body);
    let calls: Vec<&Value> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{r}");
    let call = calls[0];
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["status"], "completed");
    let args = call["arguments"].as_str().unwrap();
    check_weather(&serde_json::from_str(args).unwrap());
    assert_eq!(r["tool_choice"], body["tool_choice"]);
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (_, sargs, sr) = fold_response(&s.stream_typed("/v1/responses", &sb));
    assert_eq!(sargs, args, "streamed arguments");
    assert_eq!(without_ids(&sr), without_ids(&r));
    // The call's output, after the stored conversation: the history is in the prompt.
    let follow = json!({
        "previous_response_id": r["id"],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "21 degrees"}],
        "max_output_tokens": 8, "temperature": 0,
    });
    let f = s.post_ok("/v1/responses", &follow);
    assert_eq!(f["previous_response_id"], r["id"]);
    assert!(
        f["usage"]["input_tokens"].as_u64().unwrap()
            > r["usage"]["input_tokens"].as_u64().unwrap()
                + r["usage"]["output_tokens"].as_u64().unwrap() / 2,
        "the follow-up's prompt holds the first turn: {f}"
    );
    assert_eq!(f["output"][0]["type"], "message", "{f}");
    // The same history sent by hand renders to the same prompt length.
    let by_hand = json!({
        "input": [
            body["input"][0],
            {"type": "function_call", "call_id": call["call_id"], "name": "get_weather", "arguments": args},
            follow["input"][0],
        ],
        "max_output_tokens": 8, "temperature": 0,
    });
    let h = s.post_ok("/v1/responses", &by_hand);
    assert_eq!(
        h["usage"]["input_tokens"], f["usage"]["input_tokens"],
        "{h}\n{f}"
    );
    assert_eq!(output_text(&h), output_text(&f));
}

fn response_errors(s: &Server) {
    let path = "/v1/responses";
    let cases = [
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            400,
            "web_search",
        ),
        (json!({"input": "x", "background": true}), 400, "background"),
        (json!({}), 400, "input"),
        (json!({"input": 7}), 400, "input"),
        (
            json!({"input": [{"type": "input_image", "image_url": "u"}]}),
            400,
            "input_image",
        ),
        // `tools` alone mean `auto`, which needs the parser flags (as chat).
        (
            json!({"input": "x", "tools": flat_tools()}),
            400,
            "--enable-auto-tool-choice",
        ),
        (
            json!({"input": "x", "previous_response_id": "resp_nope"}),
            404,
            "resp_nope",
        ),
        (
            json!({"input": "x", "model": "other-model"}),
            404,
            "other-model",
        ),
        (json!({"input": "x", "temperature": -1}), 400, "temperature"),
    ];
    for (body, code, needle) in cases {
        let (status, text) = s.post_raw(path, body.to_string().as_bytes());
        common::assert_error(status, &text, code, &body.to_string());
        assert!(text.contains(needle), "{body}: {text} lacks {needle:?}");
    }
    let (code, text) = s.get("/v1/responses/resp_missing");
    common::assert_error(code, &text, 404, "GET unknown");
}

/// POST with `x-api-key` (Anthropic's header) instead of Bearer.
fn post_x_api_key(s: &Server, path: &str, key: &str, body: &Value) -> (u16, Value) {
    let r = ureq::post(&s.url(path))
        .set("x-api-key", key)
        .set("anthropic-version", "2023-06-01")
        .send_string(&body.to_string());
    let (code, text) = match r {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap()),
        Err(e) => panic!("{e}"),
    };
    (code, serde_json::from_str(&text).unwrap())
}

/// A streamed message folded: (text, thinking, tool_use inputs as JSON text,
/// stop_reason), with the event order asserted.
fn fold_message(events: &[Value]) -> (String, String, Vec<(String, String)>, Value) {
    assert_eq!(events[0]["type"], "message_start", "{:?}", events[0]);
    assert!(
        events[0]["message"]["usage"]["input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let n = events.len();
    assert_eq!(events[n - 1]["type"], "message_stop");
    assert_eq!(events[n - 2]["type"], "message_delta");
    let (mut text, mut thinking, mut tools) = (String::new(), String::new(), Vec::new());
    let mut open: Option<u64> = None;
    let mut next = 0;
    for e in &events[1..n - 2] {
        match e["type"].as_str().unwrap() {
            "content_block_start" => {
                assert_eq!((open, e["index"].as_u64()), (None, Some(next)), "{e}");
                open = Some(next);
                let b = &e["content_block"];
                if b["type"] == "tool_use" {
                    assert!(b["id"].as_str().unwrap().starts_with("toolu_"));
                    tools.push((b["name"].as_str().unwrap().to_string(), String::new()));
                }
            }
            "content_block_delta" => {
                assert_eq!(open, e["index"].as_u64(), "{e}");
                let d = &e["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => text.push_str(d["text"].as_str().unwrap()),
                    "thinking_delta" => thinking.push_str(d["thinking"].as_str().unwrap()),
                    "input_json_delta" => tools
                        .last_mut()
                        .unwrap()
                        .1
                        .push_str(d["partial_json"].as_str().unwrap()),
                    other => panic!("delta {other}"),
                }
            }
            "content_block_stop" => {
                assert_eq!(open, e["index"].as_u64(), "{e}");
                open = None;
                next += 1;
            }
            "ping" => {}
            other => panic!("event {other}"),
        }
    }
    (text, thinking, tools, events[n - 2].clone())
}

#[test]
fn messages_text_stop_tools_and_errors() {
    let s = Server::start(&["--kv-cache-memory-mib", "64", "--api-key", KEY]);
    let body = json!({"max_tokens": 16, "temperature": 0,
                      "system": [{"type": "text", "text": "Be brief."}],
                      "messages": [{"role": "user", "content": "Say hello."}]});
    let m = s.post_ok("/v1/messages", &body);
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(m["content"][0]["type"], "text", "{m}");
    let text = m["content"][0]["text"].as_str().unwrap().to_string();
    let out = m["usage"]["output_tokens"].as_u64().unwrap();
    match m["stop_reason"].as_str().unwrap() {
        "max_tokens" => assert_eq!(out, 16),
        "end_turn" => assert!(out < 16),
        other => panic!("stop_reason {other}: {m}"),
    }
    assert!(m["stop_sequence"].is_null());
    // Streamed: the same text and stop reason.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (stext, _, _, delta) = fold_message(&s.stream_typed("/v1/messages", &sb));
    assert_eq!(stext, text);
    assert_eq!(delta["delta"]["stop_reason"], m["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"], m["usage"]["output_tokens"]);
    // A stop sequence from inside the greedy answer ends it there.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 6, "{text:?}");
    let stop: String = chars[3..5].iter().collect();
    let mut stopped = body.clone();
    stopped["stop_sequences"] = json!([stop]);
    let st = s.post_ok("/v1/messages", &stopped);
    assert_eq!(st["stop_reason"], "stop_sequence", "{st}");
    assert_eq!(st["stop_sequence"], stop.as_str());
    // count_tokens: the prompt the message was answered from.
    let (code, c) = post_x_api_key(&s, "/v1/messages/count_tokens", KEY, &body);
    assert_eq!(code, 200, "{c}");
    assert_eq!(c["input_tokens"], m["usage"]["input_tokens"]);
    // `x-api-key`: the right key passes, a wrong one is Anthropic's 401.
    let (code, v) = post_x_api_key(&s, "/v1/messages", KEY, &body);
    assert_eq!(code, 200, "{v}");
    let (code, v) = post_x_api_key(&s, "/v1/messages", "wrong", &body);
    assert_eq!(code, 401);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");
    tool_use_round_trip(&s);
    message_errors(&s);
}

fn tool_use_round_trip(s: &Server) {
    let body = json!({
        "max_tokens": 60, "temperature": 0, "tools": anthropic_tools(),
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}],
    });
    let m = s.post_ok("/v1/messages", &body);
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let uses: Vec<&Value> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(uses.len(), 1, "{m}");
    assert_eq!(uses[0]["name"], "get_weather");
    check_weather(&uses[0]["input"]);
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (_, _, tools, delta) = fold_message(&s.stream_typed("/v1/messages", &sb));
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(tools.len(), 1);
    let streamed: Value = serde_json::from_str(&tools[0].1).unwrap();
    assert_eq!(streamed, uses[0]["input"], "streamed input_json_delta");
    // The result goes back as a tool_result block.
    let follow = json!({
        "max_tokens": 8, "temperature": 0, "tools": anthropic_tools(),
        "tool_choice": {"type": "none"},
        "messages": [
            body["messages"][0],
            {"role": "assistant", "content": m["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0]["id"],
                                          "content": "21 degrees"}]},
        ],
    });
    let f = s.post_ok("/v1/messages", &follow);
    assert!(
        f["usage"]["input_tokens"].as_u64() > m["usage"]["input_tokens"].as_u64(),
        "{f}"
    );
    assert_ne!(f["stop_reason"], "tool_use");
}

fn message_errors(s: &Server) {
    let msgs = json!([{"role": "user", "content": "x"}]);
    let cases = [
        (json!({"messages": msgs}), 400, "max_tokens"),
        (
            json!({"max_tokens": 4, "messages": msgs, "tools": [{"type": "bash_20250124", "name": "bash"}]}),
            400,
            "bash_20250124",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            400,
            "image",
        ),
        (
            json!({"max_tokens": 4, "messages": msgs, "tools": anthropic_tools()}),
            400,
            "--enable-auto-tool-choice",
        ),
        (
            json!({"max_tokens": 4, "messages": msgs, "model": "nope"}),
            404,
            "nope",
        ),
    ];
    for (body, code, needle) in cases {
        let (status, v) = s.post("/v1/messages", &body);
        assert_eq!(status, code, "{body}: {v}");
        assert_eq!(v["type"], "error", "{v}");
        let want = if code == 404 {
            "not_found_error"
        } else {
            "invalid_request_error"
        };
        assert_eq!(v["error"]["type"], want, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(needle),
            "{body}: {v}"
        );
    }
    let (status, _) = s.post_raw("/v1/messages", b"{not json");
    assert_eq!(status, 400);
}

/// A ChatML template (SmolLM2's has no tools): shows `tools` and the calls.
const TEMPLATE: &str = r#"{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

#[test]
fn reasoning_and_auto_tool_calls_in_both_apis() {
    let tmpl = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tmpl.path(), TEMPLATE).unwrap();
    let s = Server::start(&[
        "--kv-cache-memory-mib",
        "64",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
        "--chat-template",
        tmpl.path().to_str().unwrap(),
    ]);
    let regex = r#"<think>Paris needs a lookup\.</think>Let me check\. <tool_call>\{"name": "get_weather", "arguments": \{"city": "Paris", "unit": "celsius"\}\}</tool_call>"#;
    let so = json!({"regex": regex});
    // Responses: reasoning, message and function_call items.
    let body = json!({"input": "Weather in Paris?", "tools": flat_tools(), "structured_outputs": so,
                      "max_output_tokens": 80, "temperature": 0});
    let r = s.post_ok("/v1/responses", &body);
    let kinds: Vec<&str> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["reasoning", "message", "function_call"], "{r}");
    assert_eq!(
        r["output"][0]["content"][0]["text"],
        "Paris needs a lookup."
    );
    assert_eq!(output_text(&r).trim(), "Let me check.");
    let args: Value = serde_json::from_str(r["output"][2]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris", "unit": "celsius"}));
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let events = s.stream_typed("/v1/responses", &sb);
    let reasoning: String = events
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(reasoning, "Paris needs a lookup.");
    let (_, _, sr) = fold_response(&events);
    assert_eq!(without_ids(&sr), without_ids(&r));
    // Messages: thinking, text and tool_use blocks.
    let body = json!({"max_tokens": 80, "temperature": 0, "tools": anthropic_tools(), "structured_outputs": so,
                      "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let m = s.post_ok("/v1/messages", &body);
    let kinds: Vec<&str> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use"], "{m}");
    assert_eq!(m["content"][0]["thinking"], "Paris needs a lookup.");
    assert_eq!(
        m["content"][2]["input"],
        json!({"city": "Paris", "unit": "celsius"})
    );
    assert_eq!(m["stop_reason"], "tool_use");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (text, thinking, tools, delta) = fold_message(&s.stream_typed("/v1/messages", &sb));
    assert_eq!(thinking, "Paris needs a lookup.");
    assert_eq!(text, m["content"][1]["text"].as_str().unwrap());
    assert_eq!(
        serde_json::from_str::<Value>(&tools[0].1).unwrap(),
        m["content"][2]["input"]
    );
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
}

/// Every chunk of a stream with choices carries usage (the role chunk with no
/// completion tokens yet), counts never go down, and the usage chunk ends it.
fn assert_usage_everywhere(events: &[Value], max_tokens: u64) {
    let mut last = 0;
    let with_choices: Vec<&Value> = events
        .iter()
        .filter(|e| e["choices"] != json!([]))
        .collect();
    assert!(with_choices.len() >= 2, "{events:?}");
    assert_eq!(with_choices[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        with_choices[0]["usage"]["completion_tokens"], 0,
        "{}",
        with_choices[0]
    );
    for e in &with_choices {
        let u = &e["usage"];
        let done = u["completion_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no usage: {e}"));
        assert!(done >= last, "{e}");
        assert!(u["prompt_tokens"].as_u64().unwrap() > 0);
        assert_eq!(
            u["total_tokens"],
            u["prompt_tokens"].as_u64().unwrap() + done
        );
        last = done;
    }
    let end = events.last().unwrap();
    assert_eq!(end["choices"], json!([]), "{end}");
    assert_eq!(end["usage"]["completion_tokens"], max_tokens);
}

#[test]
fn continuous_usage_and_string_booleans() {
    let chat = |opts: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Count to ten."}],
                           "max_tokens": 4, "ignore_eos": "true", "stream": "true"});
        if !opts.is_null() {
            b["stream_options"] = opts;
        }
        b
    };
    let s = Server::start(&["--kv-cache-memory-mib", "64"]);
    // String booleans, as vLLM's pydantic models take them.
    let events = s.stream(
        "/v1/chat/completions",
        &chat(json!({"include_usage": "true", "continuous_usage_stats": "True"})),
    );
    assert_usage_everywhere(&events, 4);
    let v = s.post_ok(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2, "echo": "false", "skip_special_tokens": "0"}),
    );
    assert!(
        !v["choices"][0]["text"].as_str().unwrap().starts_with("Hi"),
        "{v}"
    );
    let (status, text) = s.post_raw(
        "/v1/completions",
        br#"{"prompt": "Hi", "max_tokens": 2, "echo": "perhaps"}"#,
    );
    common::assert_error(status, &text, 400, "echo: perhaps");
    // Out-of-vocabulary ids in vLLM's words; every bad logit_bias key named.
    let (status, text) = s.post_raw(
        "/v1/completions",
        br#"{"prompt": [1, 999999], "max_tokens": 1}"#,
    );
    common::assert_error(status, &text, 400, "prompt id out of vocabulary");
    assert!(
        text.contains("token id 999999 is out of vocabulary"),
        "{text}"
    );
    let (status, text) = s.post_raw(
        "/v1/completions",
        br#"{"prompt": "Hi", "logit_bias": {"x": 1, "999999": 1, "7": 500}}"#,
    );
    common::assert_error(status, &text, 400, "logit_bias");
    for want in ["`x`", "999999", "7 (500)", "\"param\":\"logit_bias\""] {
        assert!(text.contains(want), "{text} lacks {want}");
    }
    drop(s);
    // --enable-force-include-usage: every stream ends with usage; asked for,
    // continuous usage without `include_usage` (vLLM's should_include_usage).
    let f = Server::start(&[
        "--kv-cache-memory-mib",
        "64",
        "--enable-force-include-usage",
    ]);
    let events = f.stream(
        "/v1/chat/completions",
        &chat(json!({"continuous_usage_stats": true})),
    );
    assert_usage_everywhere(&events, 4);
    let events = f.stream("/v1/chat/completions", &chat(Value::Null));
    let (end, rest) = events.split_last().unwrap();
    assert_eq!(end["usage"]["completion_tokens"], 4, "{end}");
    assert!(rest.iter().all(|e| e["usage"].is_null()), "{rest:?}");
}
