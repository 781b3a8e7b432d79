//! The parser kit: one macro runs the same properties over every registered
//! tool parser and reasoning parser (`every_registered_parser_has_a_kit` fails
//! when a new one is registered without it):
//! - recorded outputs parse to what they should, one shot;
//! - for recorded, generated well-formed and random markup-laden outputs, every
//!   cut of the text into deltas (every single and double cut of short texts,
//!   random multi-cuts of all) gives deltas that concatenate to the one-shot
//!   parse;
//! - well-formed outputs: no markup in the content, every call's arguments
//!   concatenate to JSON equal to what was written.

use super::{collapse, lookup, ToolParser, ToolStream};
use crate::serve::reasoning::{self, ReasoningStream};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::sync::Arc;

/// Content and calls `(name, arguments)`.
type ToolOut = (String, Vec<(String, String)>);

fn tool_parser(name: &str) -> Arc<dyn ToolParser> {
    Arc::new(lookup(name).unwrap_or_else(|| panic!("{name} is not registered")))
}

/// Feeds `chunks` as deltas, then the end.
fn run_tool(p: &Arc<dyn ToolParser>, chunks: &[&str]) -> ToolOut {
    let mut s = ToolStream::new(p.clone(), true);
    let mut items = Vec::new();
    for c in chunks {
        items.extend(s.push(c, false));
    }
    items.extend(s.push("", true));
    collapse(items)
}

fn run_reasoning(name: &str, chunks: &[&str]) -> ToolOut {
    let p = reasoning::lookup(name).unwrap_or_else(|| panic!("{name} is not registered"));
    let mut s = ReasoningStream::new(p);
    let (mut r, mut c) = (String::new(), String::new());
    for (i, ch) in chunks.iter().chain([&""]).enumerate() {
        let (a, b) = s.push(ch, i == chunks.len());
        r.push_str(&a);
        c.push_str(&b);
    }
    // Reasoning as a pseudo-call, so both kinds share the comparisons.
    (c, vec![("reasoning".into(), r)])
}

/// Cuts `text` at the given char-boundary positions.
fn cut<'a>(text: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|&c| c.min(text.len()))
        .filter(|&c| text.is_char_boundary(c))
        .collect();
    at.sort_unstable();
    at.dedup();
    let mut out = Vec::new();
    let mut prev = 0;
    for c in at.into_iter().chain([text.len()]) {
        out.push(&text[prev..c]);
        prev = c;
    }
    out
}

/// Every single and double cut of a short text, plus one delta per char.
fn exhaustive_cuts(text: &str, mut check: impl FnMut(&[&str])) {
    let b: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    check(
        &text
            .char_indices()
            .map(|(i, c)| &text[i..i + c.len_utf8()])
            .collect::<Vec<_>>(),
    );
    for (x, &i) in b.iter().enumerate() {
        check(&cut(text, &[i]));
        if text.len() <= 160 {
            for &j in &b[x..] {
                check(&cut(text, &[i, j]));
            }
        }
    }
}

fn args_equal(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Random texts over these fragments: markup, pieces of JSON and Python, text.
fn fragments() -> Vec<&'static str> {
    vec![
        "<tool_call>",
        "</tool_call>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "<|python_tag|>",
        "<|python_start|>",
        "<|python_end|>",
        "<think>",
        "</think>",
        "<tool",
        "</th",
        "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
        "{\"name\": \"g\", \"parameters\": {}}",
        "[{\"name\": \"h\", \"arguments\": {\"x\": \"}\"}}]",
        "f(a=1)",
        "[",
        "]",
        "{",
        "}",
        "(",
        ")",
        "\"",
        "'",
        ",",
        ";",
        " ",
        "\n",
        "hi",
        "é",
        "get",
        "=",
        "1",
        "True",
    ]
}

fn random_text() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(fragments()), 0..14).prop_map(|v| v.concat())
}

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..400, 0..24)
}

/// A call's arguments: flat objects of strings, integers and booleans (what
/// every format, Python included, can write).
fn gen_args() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        "[a-z_]{1,6}",
        prop_oneof![
            "[ a-zA-Z0-9é\"\\\\{}<>\\[\\]]{0,8}".prop_map(Value::String),
            (-1000i64..1000).prop_map(|n| json!(n)),
            any::<bool>().prop_map(Value::Bool),
        ],
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()))
}

fn gen_calls() -> impl Strategy<Value = Vec<(String, Value)>> {
    prop::collection::vec(("[a-z][a-z_0-9]{0,8}", gen_args()), 1..4)
}

/// Content that holds no markup and does not look like a call's start.
fn gen_content() -> impl Strategy<Value = String> {
    "[A-Za-z][A-Za-z ,.!é\n]{0,30}"
}

fn py_literal(v: &Value) -> String {
    match v {
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        other => other.to_string(),
    }
}

/// Writes content and calls as each format does: `(text, expected content)`.
fn render(format: &str, content: &str, calls: &[(String, Value)]) -> (String, String) {
    match format {
        "hermes" => {
            let mut t = content.to_string();
            for (n, a) in calls {
                t += &format!(
                    "<tool_call>\n{}\n</tool_call>\n",
                    json!({"name": n, "arguments": a})
                );
            }
            (t, content.to_string())
        }
        "mistral" => {
            let list: Vec<Value> = calls
                .iter()
                .map(|(n, a)| json!({"name": n, "arguments": a}))
                .collect();
            (
                format!("{content}[TOOL_CALLS]{}", Value::Array(list)),
                content.to_string(),
            )
        }
        "llama3_json" => {
            let parts: Vec<String> = calls
                .iter()
                .map(|(n, a)| json!({"name": n, "parameters": a}).to_string())
                .collect();
            (parts.join("; "), String::new())
        }
        "pythonic" => {
            let parts: Vec<String> = calls
                .iter()
                .map(|(n, a)| {
                    let kw: Vec<String> = a
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| format!("{k}={}", py_literal(v)))
                        .collect();
                    format!("{n}({})", kw.join(", "))
                })
                .collect();
            (format!("[{}]", parts.join(", ")), String::new())
        }
        other => panic!("no renderer for {other}"),
    }
}

const MARKUP: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|python_tag|>",
    "<|python_start|>",
    "<|python_end|>",
    "<think>",
    "</think>",
];

/// The properties for one tool parser; `$corpus` holds recorded outputs and
/// their parse: `(text, content, [(name, arguments JSON)])`.
macro_rules! tool_kit {
    ($module:ident, $name:literal, $corpus:expr) => {
        mod $module {
            use super::*;

            #[test]
            fn recorded_outputs_parse_and_stream_alike() {
                let p = tool_parser($name);
                let corpus: &[(&str, &str, &[(&str, &str)])] = $corpus;
                for (text, content, calls) in corpus {
                    let one = run_tool(&p, &[text]);
                    assert_eq!(one.0, *content, "content of {text:?}");
                    assert_eq!(one.1.len(), calls.len(), "calls of {text:?}: {one:?}");
                    for ((n, a), (en, ea)) in one.1.iter().zip(calls.iter()) {
                        assert_eq!(n, en);
                        assert!(args_equal(a, ea), "{a} vs {ea}");
                    }
                    exhaustive_cuts(text, |chunks| {
                        assert_eq!(run_tool(&p, chunks), one, "{chunks:?}");
                    });
                }
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(256))]
                #[test]
                fn any_cut_of_any_text_streams_as_one_shot(text in random_text(), cuts in cuts()) {
                    let p = tool_parser($name);
                    let one = run_tool(&p, &[&text]);
                    prop_assert_eq!(run_tool(&p, &cut(&text, &cuts)), one.clone());
                    for (_, a) in &one.1 {
                        prop_assert!(serde_json::from_str::<Value>(a).is_ok(), "{}", a);
                    }
                }

                #[test]
                fn well_formed_calls_round_trip(content in gen_content(), calls in gen_calls(), cuts in cuts()) {
                    let p = tool_parser($name);
                    let (text, want) = render($name, &content, &calls);
                    let got = run_tool(&p, &cut(&text, &cuts));
                    prop_assert_eq!(&got, &run_tool(&p, &[&text]));
                    prop_assert_eq!(&got.0, &want);
                    for m in MARKUP {
                        prop_assert!(!got.0.contains(m), "markup {} in {:?}", m, got.0);
                    }
                    prop_assert_eq!(got.1.len(), calls.len());
                    for ((n, a), (en, ea)) in got.1.iter().zip(&calls) {
                        prop_assert_eq!(n, en);
                        let parsed = serde_json::from_str::<Value>(a).ok();
                        prop_assert_eq!(parsed.as_ref(), Some(ea));
                    }
                }
            }
        }
    };
}

/// The properties for one reasoning parser: `(text, reasoning, content)`.
macro_rules! reasoning_kit {
    ($module:ident, $name:literal, $corpus:expr) => {
        mod $module {
            use super::*;

            #[test]
            fn recorded_outputs_parse_and_stream_alike() {
                let corpus: &[(&str, &str, &str)] = $corpus;
                for (text, reasoning, content) in corpus {
                    let one = run_reasoning($name, &[text]);
                    assert_eq!(one.1[0].1, *reasoning, "reasoning of {text:?}");
                    assert_eq!(one.0, *content, "content of {text:?}");
                    exhaustive_cuts(text, |chunks| {
                        assert_eq!(run_reasoning($name, chunks), one, "{chunks:?}");
                    });
                }
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(256))]
                #[test]
                fn any_cut_of_any_text_streams_as_one_shot(text in random_text(), cuts in cuts()) {
                    let one = run_reasoning($name, &[&text]);
                    prop_assert_eq!(run_reasoning($name, &cut(&text, &cuts)), one);
                }

                #[test]
                fn well_formed_thinking_splits(r in gen_content(), c in gen_content(), cuts in cuts()) {
                    let text = format!("<think>{r}</think>{c}");
                    let got = run_reasoning($name, &cut(&text, &cuts));
                    prop_assert_eq!(&got.1[0].1, &r);
                    prop_assert_eq!(&got.0, &c);
                }
            }
        }
    };
}

/// Parsers with a kit below; a registered parser missing here fails the test.
const KITTED_TOOLS: &[&str] = &["hermes", "llama3_json", "mistral", "pythonic"];
const KITTED_REASONING: &[&str] = &["deepseek_r1", "qwen3"];

#[test]
fn every_registered_parser_has_a_kit() {
    assert_eq!(super::names(), KITTED_TOOLS);
    assert_eq!(reasoning::names(), KITTED_REASONING);
}

tool_kit!(
    hermes,
    "hermes",
    &[
        // Qwen2.5-7B-Instruct, two parallel calls.
        (
            "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_temperature_date\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", \"date\": \"2024-10-01\"}}\n</tool_call>",
            "",
            &[
                ("get_current_temperature", "{\"location\": \"San Francisco, CA, USA\"}"),
                ("get_temperature_date", "{\"location\": \"San Francisco, CA, USA\", \"date\": \"2024-10-01\"}"),
            ],
        ),
        // Text before the call is content.
        (
            "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"</tool\"}}\n</tool_call>",
            "Let me check.\n",
            &[("f", "{\"q\": \"</tool\"}")],
        ),
        // A broken block stays content, markup included.
        ("<tool_call>{\"name\": 3}</tool_call> ok", "<tool_call>{\"name\": 3}</tool_call> ok", &[]),
        // Cut by max_tokens before the close tag: read as closed.
        ("<tool_call>{\"name\": \"f\", \"arguments\": {}}", "", &[("f", "{}")]),
        ("Just an answer, no tools. <b>bold</b>", "Just an answer, no tools. <b>bold</b>", &[]),
        // Arguments given as a JSON string.
        ("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>", "", &[("f", "{\"a\": 1}")]),
    ]
);

tool_kit!(
    mistral,
    "mistral",
    &[
        // Mistral-7B-Instruct-v0.3 (tokenizer v3).
        (
            "[TOOL_CALLS] [{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Dallas, TX\", \"unit\": \"fahrenheit\"}}]",
            "",
            &[("get_current_weather", "{\"location\": \"Dallas, TX\", \"unit\": \"fahrenheit\"}")],
        ),
        // Mistral-Small-3.2 (tokenizer v11+): name[ARGS]{...}, repeated.
        (
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}",
            "",
            &[("get_weather", "{\"city\": \"Paris\"}"), ("get_time", "{}")],
        ),
        ("Sure. [TOOL_CALLS]f{\"a\": [1, 2]}", "Sure. ", &[("f", "{\"a\": [1, 2]}")]),
        ("[TOOL_CALLS] nope", "[TOOL_CALLS] nope", &[]),
        ("No tools [here]", "No tools [here]", &[]),
    ]
);

tool_kit!(
    llama3_json,
    "llama3_json",
    &[
        // Llama-3.1-8B-Instruct.
        (
            "{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"Boston, MA\", \"unit\": \"celsius\"}}",
            "",
            &[("get_current_conditions", "{\"location\": \"Boston, MA\", \"unit\": \"celsius\"}")],
        ),
        (
            "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"x\": 1}}",
            "",
            &[("a", "{}"), ("b", "{\"x\": 1}")],
        ),
        ("The answer is {x}.", "The answer is {x}.", &[]),
        ("{\"not\": \"a call\"}", "{\"not\": \"a call\"}", &[]),
    ]
);

tool_kit!(
    pythonic,
    "pythonic",
    &[
        // Llama-3.2-3B-Instruct.
        (
            "[get_weather(city='San Francisco', metric='celsius'), get_weather(city=\"Seattle\", days=3)]",
            "",
            &[
                ("get_weather", "{\"city\": \"San Francisco\", \"metric\": \"celsius\"}"),
                ("get_weather", "{\"city\": \"Seattle\", \"days\": 3}"),
            ],
        ),
        // Llama 4, with its markers and nested literals.
        (
            "<|python_start|>[register(user={'name': 'Ann', 'tags': ['a', 'b']}, active=True, score=-1.5, note=None)]<|python_end|>",
            "",
            &[("register", "{\"user\": {\"name\": \"Ann\", \"tags\": [\"a\", \"b\"]}, \"active\": true, \"score\": -1.5, \"note\": null}")],
        ),
        ("[1, 2, 3] are numbers", "[1, 2, 3] are numbers", &[]),
        ("Plain text.", "Plain text.", &[]),
    ]
);

reasoning_kit!(
    deepseek_r1,
    "deepseek_r1",
    &[
        // DeepSeek-R1-Distill: the template opened <think> already.
        (
            "Okay, 9.11 < 9.8.\n</think>\n\n9.8 is greater.",
            "Okay, 9.11 < 9.8.\n",
            "\n\n9.8 is greater."
        ),
        ("<think>hmm</think>done", "hmm", "done"),
        // Never closed (max_tokens): all reasoning.
        ("still thinking <", "still thinking <", ""),
    ]
);

reasoning_kit!(
    qwen3,
    "qwen3",
    &[
        (
            "<think>\nThe user greets.\n</think>\n\nHello!",
            "\nThe user greets.\n",
            "\n\nHello!"
        ),
        // enable_thinking: false: no think block in the output.
        ("Hello! <think> is a tag.", "", "Hello! <think> is a tag."),
        ("<think>cut by max_tok", "cut by max_tok", ""),
    ]
);
