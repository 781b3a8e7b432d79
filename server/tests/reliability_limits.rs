//! Reliability, third round (issue 29): structured-output constraints and
//! amplifying fields, each reproduction of the probe run against the server.
//! D1: a deep constraint aborted the process; D2: `prompt_logprobs: -1` skipped
//! `--max-logprobs`; D3: `logprob_token_ids` had no cap; D4: a compile held a
//! request-preparation slot; D8: a constraint that cannot start failed as a 500
//! after queueing. Each must now be a clear 400 (or a normal answer), the server
//! healthy, other clients untouched.

mod common;

use common::{assert_error, Server};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SMALL: &[&str] = &["--kv-cache-memory-mib", "64"];

fn ref_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let next = if i + 1 < n {
            json!({"$ref": format!("#/$defs/d{}", i + 1)})
        } else {
            json!({"type": "integer"})
        };
        defs.insert(format!("d{i}"), json!({"type": "array", "items": next}));
    }
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

fn lark_chain(n: usize) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..n - 1 {
        g.push_str(&format!("r{i}: r{}\n", i + 1));
    }
    g.push_str(&format!("r{}: \"x\"\n", n - 1));
    g
}

fn assert_healthy(s: &Server) {
    assert_eq!(s.get("/health").0, 200, "log:\n{}", s.log_text());
    let v = s.post_ok(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

fn post(s: &Server, path: &str, body: &Value) -> (u16, String) {
    s.post_raw(path, body.to_string().as_bytes())
}

/// D1: the chains that aborted the server (700 `$ref`s through `items`, 24 KB;
/// 1000 Lark rules) are answered, by every route a schema takes, while a stream
/// runs beside them; past `--structured-outputs-max-depth` they are a 400.
#[test]
fn deep_constraints_are_answered_or_refused_never_abort() {
    let s = Arc::new(Server::start(SMALL));
    let s2 = s.clone();
    let other = std::thread::spawn(move || {
        s2.stream(
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0,
                    "ignore_eos": true, "stream": true}),
        )
    });
    let chain = ref_chain(700);
    let bodies = [
        (
            "/v1/completions",
            json!({"prompt": "List:", "max_tokens": 4, "structured_outputs": {"json": chain}}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "List:", "max_tokens": 4,
                   "structured_outputs": {"json": chain.to_string()}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "List"}], "max_tokens": 4,
                   "response_format": {"type": "json_schema",
                                       "json_schema": {"name": "x", "schema": chain}}}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "X:", "max_tokens": 4,
                   "structured_outputs": {"grammar": lark_chain(1000)}}),
        ),
    ];
    for (path, body) in &bodies {
        let (st, text) = post(&s, path, body);
        assert_eq!(st, 200, "{path}: {text}\nlog:\n{}", s.log_text());
    }
    let deep = [
        // 3000 links of two levels each, and 5100 rules: past the default 5000.
        json!({"prompt": "List:", "max_tokens": 4, "structured_outputs": {"json": ref_chain(3000)}}),
        json!({"prompt": "X:", "max_tokens": 4,
               "structured_outputs": {"grammar": lark_chain(5100)}}),
    ];
    for body in &deep {
        let (st, text) = post(&s, "/v1/completions", body);
        assert_error(st, &text, 400, "past the depth bound");
        assert!(text.contains("--structured-outputs-max-depth"), "{text}");
    }
    let events = other.join().expect("stream thread");
    assert!(
        events.iter().all(|e| e.get("error").is_none()),
        "{events:?}"
    );
    assert_healthy(&s);
}

/// D8: a `$ref` self-cycle and an exploding regex are refused with a 400 before
/// the request is queued, instead of a 500 at their first step.
#[test]
fn constraints_that_cannot_start_are_400_before_queueing() {
    let s = Server::start(SMALL);
    let cases = [
        (
            json!({"json": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}),
            "cannot generate any output",
        ),
        (
            json!({"regex": "(a{1000}){1000}"}),
            "--structured-outputs-max-regex-size",
        ),
    ];
    for (so, needle) in cases {
        let t0 = Instant::now();
        let (st, text) = post(
            &s,
            "/v1/completions",
            &json!({"prompt": "X:", "max_tokens": 4, "structured_outputs": so}),
        );
        assert_error(st, &text, 400, needle);
        assert!(text.contains(needle), "{text}");
        assert!(t0.elapsed() < Duration::from_secs(60));
    }
    // Nothing reached the engine.
    let m = s.get("/metrics").1;
    assert_eq!(
        common::metric(&m, "vllm:prompt_tokens_total"),
        Some(0.0),
        "{m}"
    );
    assert_healthy(&s);
}

/// D2 and D3: `prompt_logprobs: -1` (the whole vocabulary) is checked against
/// `--max-logprobs` as vLLM does; `logprob_token_ids` is capped at 128; other
/// lists at their flags. Each is a 400 naming the field.
#[test]
fn amplifying_fields_are_capped_with_a_400_naming_them() {
    let s = Server::start(SMALL);
    let (st, text) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 1, "prompt_logprobs": -1}),
    );
    assert_error(st, &text, 400, "prompt_logprobs -1");
    assert!(
        text.contains("prompt_logprobs") && text.contains("greater than max allowed: 20"),
        "{text}"
    );
    let vocab: Vec<u32> = (0..49152).collect();
    let too_many = [
        (
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 2, "logprob_token_ids": vocab}),
            "logprob_token_ids",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "n": 8,
                   "logprob_token_ids": vocab}),
            "logprob_token_ids",
        ),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 2,
                   "logit_bias": (0..2000).map(|i| (i.to_string(), serde_json::Value::from(1.0))).collect::<serde_json::Map<_, _>>()}),
            "logit_bias",
        ),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 2, "bad_words": vec!["spam"; 300]}),
            "bad_words",
        ),
    ];
    for (path, body, field) in too_many {
        let (st, text) = post(&s, path, &body);
        assert_error(st, &text, 400, field);
        let v: Value = serde_json::from_str(&text).expect("JSON error");
        assert_eq!(v["error"]["param"], field, "{text}");
    }
    // At the cap it works, and the answer has those 128 logprobs per position.
    let ids: Vec<u32> = (0..128).collect();
    let v = s.post_ok(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2, "logprob_token_ids": ids}),
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_healthy(&s);
}

/// D4: constraint compiles no longer hold the request-preparation pool: with
/// one compile thread kept busy by 24 queued compiles, a plain completion is
/// answered at once; a compile that cannot finish within
/// `--structured-outputs-compile-timeout` is a 400 naming it.
#[test]
fn compiles_do_not_hold_request_preparation() {
    let s = Arc::new(Server::start(&[
        "--kv-cache-memory-mib",
        "64",
        "--structured-outputs-compile-threads",
        "1",
        "--structured-outputs-compile-timeout",
        "3",
    ]));
    // Warm the token trie so the timings below are the compiles'.
    let (st, text) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": "X:", "max_tokens": 2, "structured_outputs": {"regex": "[0-9]+"}}),
    );
    assert_eq!(st, 200, "{text}");
    let mut heavy = Vec::new();
    // 24 chains near the depth bound (~0.3 s of compiling each on a quiet core), queued
    // on one compile thread: seconds of work.
    for _ in 0..24 {
        let s2 = s.clone();
        heavy.push(std::thread::spawn(move || {
            post(
                &s2,
                "/v1/completions",
                &json!({"prompt": "List:", "max_tokens": 2,
                        "structured_outputs": {"json": ref_chain(2400)}}),
            )
        }));
    }
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    assert_healthy(&s);
    let plain = t0.elapsed();
    // The plain request was answered while compiles were still queued or running
    // (an ordering, not a timing: before, it queued behind them).
    let pending = heavy.iter().filter(|h| !h.is_finished()).count();
    assert!(
        pending > 0,
        "every compile finished before the plain request ({plain:?})"
    );
    let mut outcomes = Vec::new();
    for h in heavy {
        let (st, text) = h.join().expect("heavy thread");
        if st != 200 {
            assert_error(st, &text, 400, "heavy compile");
            assert!(
                text.contains("--structured-outputs-compile-timeout"),
                "{text}"
            );
        }
        outcomes.push(st);
    }
    eprintln!(
        "plain request beside 24 compiles: {plain:?} ({pending} still pending); outcomes {outcomes:?}"
    );
}

/// Issue 26: the fields a router adds (vllm-router's `no_stop_trim`, ...) pass and
/// are ignored, as vLLM ignores unknown fields; `--strict-request-fields` keeps
/// the 400 naming the field. Known fields Pagoda does not implement stay refused.
#[test]
fn unknown_fields_pass_unless_strict() {
    let body = json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0, "no_stop_trim": true});
    let lenient = Server::start(SMALL);
    let (st, text) = post(&lenient, "/v1/completions", &body);
    assert_eq!(st, 200, "{text}");
    let (st, text) = post(
        &lenient,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2, "best_of": 3}),
    );
    assert_error(st, &text, 400, "best_of");
    drop(lenient);
    let strict = Server::start(&["--kv-cache-memory-mib", "64", "--strict-request-fields"]);
    let (st, text) = post(&strict, "/v1/completions", &body);
    assert_error(st, &text, 400, "strict");
    assert!(text.contains("no_stop_trim"), "{text}");
}
