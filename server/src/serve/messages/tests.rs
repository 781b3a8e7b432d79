//! The Messages translation without an engine.

use super::*;

fn chat_of(body: Value) -> Value {
    translate(body.to_string().as_bytes(), false).unwrap().chat
}

#[test]
fn blocks_become_chat_messages() {
    let chat = chat_of(json!({
        "model": "m", "max_tokens": 10, "stop_sequences": ["END"], "top_k": 5,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "need a tool", "signature": "x"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21C"}]},
                {"type": "text", "text": "Thanks"}]},
        ],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
    }));
    let m = chat["messages"].as_array().unwrap();
    assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
    assert_eq!(
        m[1],
        json!({"role": "user", "content": "Weather in Paris?"})
    );
    assert_eq!(m[2]["content"], "Checking.");
    assert_eq!(m[2]["reasoning"], "need a tool");
    assert_eq!(m[2]["tool_calls"][0]["id"], "toolu_1");
    let args: Value = serde_json::from_str(
        m[2]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "21C"})
    );
    assert_eq!(m[4], json!({"role": "user", "content": "Thanks"}));
    assert_eq!(chat["stop"], json!(["END"]));
    assert_eq!(chat["top_k"], 5);
    assert_eq!(chat["max_tokens"], 10);
    assert_eq!(
        chat["tools"][0]["function"],
        json!({"name": "get_weather", "parameters": {"type": "object"}})
    );
    assert_eq!(
        chat["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    assert_eq!(chat["parallel_tool_calls"], false);
    for (c, want) in [("auto", "auto"), ("any", "required"), ("none", "none")] {
        assert_eq!(chat_tool_choice(&json!({"type": c})).unwrap().0, want);
    }
}

#[test]
fn bad_requests_name_the_field() {
    let msgs = json!([{"role": "user", "content": "x"}]);
    for (body, param) in [
        (json!({"messages": msgs}), "max_tokens"),
        (json!({"messages": msgs, "max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": 5, "messages": []}), "messages"),
        (
            json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
            "messages",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            "messages",
        ),
        (
            json!({"max_tokens": 5, "messages": msgs, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "tools",
        ),
        (
            json!({"max_tokens": 5, "messages": msgs, "tool_choice": {"type": "tool"}}),
            "tool_choice",
        ),
    ] {
        let e = translate(body.to_string().as_bytes(), false)
            .err()
            .unwrap_or_else(|| panic!("{body} passed"));
        assert_eq!(e.param(), Some(param), "{body}: {e}");
    }
    // count_tokens needs no max_tokens.
    assert!(translate(json!({"messages": msgs}).to_string().as_bytes(), true).is_ok());
}

#[test]
fn stop_reasons_follow_anthropic() {
    let null = Value::Null;
    assert_eq!(stop_reason("stop", &null, false).0, "end_turn");
    assert_eq!(stop_reason("length", &null, false).0, "max_tokens");
    assert_eq!(stop_reason("tool_calls", &null, true).0, "tool_use");
    // A named tool's call ends on a plain stop: still tool_use.
    assert_eq!(stop_reason("stop", &null, true).0, "tool_use");
    assert_eq!(
        stop_reason("stop", &json!("END"), false),
        ("stop_sequence", json!("END"))
    );
    assert_eq!(tool_input("{\"a\": 1}"), json!({"a": 1}));
    assert_eq!(tool_input("{\"a\": "), json!({}));
}
