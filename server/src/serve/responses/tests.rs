//! The Responses translation without an engine: input items to chat messages,
//! tools and tool_choice to chat's, output items back to a follow-up's messages.

use super::object::output_messages;
use super::*;

#[test]
fn input_items_become_chat_messages() {
    let input = json!([
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "21C"},
    ]);
    let mut out = Vec::new();
    input_messages(&input, &mut out).unwrap();
    assert_eq!(out[0], json!({"role": "system", "content": "Be brief."}));
    assert_eq!(
        out[1],
        json!({"role": "user", "content": "Weather in Paris?"})
    );
    assert_eq!(out[2]["role"], "assistant");
    assert_eq!(out[2]["tool_calls"].as_array().unwrap().len(), 2, "{out:?}");
    assert_eq!(out[2]["tool_calls"][1]["function"]["name"], "get_time");
    assert_eq!(
        out[3],
        json!({"role": "tool", "tool_call_id": "c1", "content": "21C"})
    );
    assert_eq!(out.len(), 4);
    let mut one = Vec::new();
    input_messages(&json!("hi"), &mut one).unwrap();
    assert_eq!(one, vec![json!({"role": "user", "content": "hi"})]);
}

#[test]
fn bad_input_is_a_400_naming_input() {
    for bad in [
        json!(7),
        json!([{"role": "robot", "content": "x"}]),
        json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
        json!([{"type": "item_reference", "id": "x"}]),
        json!([{"type": "function_call", "name": "f"}]),
    ] {
        let e = input_messages(&bad, &mut Vec::new()).unwrap_err();
        assert_eq!(e.param(), Some("input"), "{bad}: {e}");
    }
}

#[test]
fn tools_and_choice_become_chat_shapes() {
    let t = chat_tools(
        &json!([{"type": "function", "name": "f", "description": "d",
                                  "parameters": {"type": "object"}, "strict": true}]),
    )
    .unwrap();
    assert_eq!(
        t,
        json!([{"type": "function", "function": {"name": "f", "description": "d",
                 "parameters": {"type": "object"}, "strict": true}}])
    );
    let e = chat_tools(&json!([{"type": "web_search"}])).unwrap_err();
    assert!(e.to_string().contains("web_search"), "{e}");
    assert_eq!(
        chat_tool_choice(&json!({"type": "function", "name": "f"})).unwrap(),
        json!({"type": "function", "function": {"name": "f"}})
    );
    assert_eq!(
        chat_tool_choice(&json!("required")).unwrap(),
        json!("required")
    );
    assert!(chat_tool_choice(&json!({"type": "file_search"})).is_err());
    assert_eq!(
        response_format(
            &json!({"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}})
        )
        .unwrap(),
        Some(
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})
        )
    );
}

#[test]
fn output_items_round_trip_to_messages() {
    let m = json!({"role": "assistant", "content": "Let me check.", "reasoning": "hmm",
                   "tool_calls": [{"id": "c1", "type": "function",
                                   "function": {"name": "f", "arguments": "{\"a\":1}"}}]});
    let items = output_items(&m);
    let kinds: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reasoning", "message", "function_call"]);
    assert_eq!(items[2]["call_id"], "c1");
    assert!(items[1]["id"].as_str().unwrap().starts_with("msg_"));
    let back = output_messages(&items);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0]["content"], "Let me check.");
    assert_eq!(
        back[0]["tool_calls"][0]["function"]["arguments"],
        "{\"a\":1}"
    );
    // No calls: always one message item, even empty.
    let empty = output_items(&json!({"role": "assistant", "content": ""}));
    assert_eq!(empty.len(), 1);
    assert_eq!(empty[0]["content"][0]["text"], "");
}
