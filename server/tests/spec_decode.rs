//! `pagoda serve --speculative-config` end to end on the real model: greedy answers
//! (text and usage, streamed or not) are the same as without speculation, the
//! `vllm:spec_decode_*` counters move, and a bad config stops the server at start
//! with the reason.

mod common;

use common::{metric, Server};
use serde_json::{json, Value};

const SPEC: &str =
    r#"{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":4}"#;

fn prompts() -> Vec<String> {
    let text = "The quick brown fox jumps over the lazy dog near the river bank, \
                and the lazy dog sleeps in the warm afternoon sun.";
    vec![
        format!("Repeat this sentence exactly, word for word: \"{text}\""),
        format!("Here is a text: \"{text}\"\nRewrite it with every \"dog\" replaced by \"cat\"."),
        "What is the capital of France?".to_string(),
    ]
}

fn ask(s: &Server, prompt: &str) -> (String, u64) {
    let v = s.post_ok(
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 48,
            "temperature": 0,
        }),
    );
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    (text, v["usage"]["completion_tokens"].as_u64().unwrap())
}

fn ask_streamed(s: &Server, prompt: &str) -> String {
    let events = s.stream(
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 48,
            "temperature": 0,
            "stream": true,
        }),
    );
    events
        .iter()
        .filter_map(|e: &Value| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

#[test]
fn greedy_answers_are_identical_and_metrics_move() {
    let plain: Vec<(String, u64)> = {
        let s = Server::start(&["--max-model-len", "1024"]);
        prompts().iter().map(|p| ask(&s, p)).collect()
    };
    let s = Server::start(&["--max-model-len", "1024", "--speculative-config", SPEC]);
    for (p, want) in prompts().iter().zip(&plain) {
        assert_eq!(&ask(&s, p), want, "answer to {p:?}");
        assert_eq!(ask_streamed(&s, p), want.0, "streamed answer to {p:?}");
    }
    // A seeded sampled request speculates too and is reproducible (its acceptance
    // tests and draws are counter-based, keyed by the seed and the output index).
    let sampled = |seed: u64| {
        let v = s.post_ok(
            "/v1/chat/completions",
            &json!({
                "messages": [{"role": "user", "content": prompts()[0]}],
                "max_tokens": 32, "temperature": 0.7, "seed": seed,
            }),
        );
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(sampled(5), sampled(5), "a seeded request replays");
    let m = s.get("/metrics").1;
    let drafts = metric(&m, "vllm:spec_decode_num_drafts_total").unwrap();
    let drafted = metric(&m, "vllm:spec_decode_num_draft_tokens_total").unwrap();
    let accepted = metric(&m, "vllm:spec_decode_num_accepted_tokens_total").unwrap();
    assert!(drafts > 0.0 && drafted >= drafts, "{m}");
    assert!(accepted > 0.0 && accepted <= drafted, "{m}");
    let pos0 = metric(&m, "vllm:spec_decode_num_accepted_tokens_per_pos_total").unwrap();
    assert!(pos0 > 0.0 && pos0 <= drafts, "{m}");
    assert!(m.contains("position=\"0\""), "{m}");
}

#[test]
fn a_bad_config_is_refused_at_start() {
    for (config, needle) in [
        (
            r#"{"method":"eagle","num_speculative_tokens":3}"#,
            "not supported",
        ),
        (
            r#"{"method":"ngram","num_speculative_tokens":3,"draft_model":"x"}"#,
            "unknown field",
        ),
        (r#"{"method":"ngram"}"#, "num_speculative_tokens"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagoda"))
            .args(["serve", "--host", "127.0.0.1", "--port", "18999"])
            .args([
                "--model",
                "/nonexistent.gguf",
                "--speculative-config",
                config,
            ])
            .output()
            .expect("running pagoda");
        assert!(!out.status.success(), "{config} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--speculative-config") && err.contains(needle),
            "{config}: {err}"
        );
    }
}
