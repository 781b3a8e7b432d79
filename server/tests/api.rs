//! The OpenAI API end to end: the real binary, the real model, plain HTTP.
//!
//! One server serves every check below, in sequence (the model runs on few
//! cores; loading it once keeps the suite fast).

mod common;

use common::{assert_error, metric, Server};
use serde_json::{json, Value};

const KEY: &str = "test-key-123";
const MAX_BODY: usize = 64 * 1024;

fn text_of(events: &[Value]) -> String {
    events
        .iter()
        .flat_map(|e| e["choices"].as_array().cloned().unwrap_or_default())
        .map(|c| {
            c["text"]
                .as_str()
                .or(c["delta"]["content"].as_str())
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

fn ids_from_logprobs(choice: &Value) -> Vec<u32> {
    choice["logprobs"]["tokens"]
        .as_array()
        .expect("logprobs.tokens")
        .iter()
        .map(|t| {
            t.as_str()
                .unwrap()
                .strip_prefix("token_id:")
                .expect("token_id: prefix")
                .parse()
                .unwrap()
        })
        .collect()
}

#[test]
fn openai_api_end_to_end() {
    // f32 weights: the exact path, which the reference's greedy ids are checked on
    // (the default, a GGUF's own quantization, moves log-probs by up to ~0.6).
    let s = Server::start(&[
        "--api-key",
        KEY,
        "--max-body-bytes",
        &MAX_BODY.to_string(),
        "--dtype",
        "float32",
    ]);
    let (_, models) = s.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    let model = models["data"][0]["id"]
        .as_str()
        .expect("a model id")
        .to_string();
    let max_model_len = models["data"][0]["max_model_len"].as_u64().unwrap() as usize;

    auth(&s);
    greedy_matches_reference(&s, &model);
    streaming_equals_non_streaming(&s, &model);
    chat(&s, &model);
    sampling_features(&s, &model);
    tokenize_roundtrip(&s);
    bad_inputs(&s, &model, max_model_len);
    // Still serving after all the errors.
    let v = s.post_ok(
        "/v1/completions",
        &json!({"model": model, "prompt": "Hello", "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(v["usage"]["completion_tokens"], 3);
    // The model's file name is accepted as an alias of the served name.
    let file = common::model_path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    s.post_ok(
        "/v1/completions",
        &json!({"model": file, "prompt": "Hi", "max_tokens": 1}),
    );
    let (st, _) = s.get("/health");
    assert_eq!(st, 200);
    let m = s.get("/metrics").1;
    assert!(
        metric(&m, "vllm:generation_tokens_total").unwrap() > 0.0,
        "{m}"
    );
    assert!(
        metric(&m, "vllm:time_to_first_token_seconds_count").unwrap() > 0.0,
        "{m}"
    );
    assert!(
        metric(&m, "vllm:e2e_request_latency_seconds_count").unwrap() > 0.0,
        "{m}"
    );
    let (st, v) = s.get("/version");
    assert_eq!(st, 200, "{v}");
}

fn auth(s: &Server) {
    // Probes stay open; the API needs the key.
    assert_eq!(s.get_no_auth("/health", None).0, 200);
    assert_eq!(s.get_no_auth("/metrics", None).0, 200);
    let (st, body) = s.get_no_auth("/v1/models", None);
    assert_error(st, &body, 401, "missing key");
    let (st, body) = s.get_no_auth("/v1/models", Some("Bearer wrong"));
    assert_error(st, &body, 401, "wrong key");
    let (st, _) = s.get_no_auth("/v1/models", Some(&format!("Bearer {KEY}")));
    assert_eq!(st, 200);
}

fn greedy_matches_reference(s: &Server, model: &str) {
    let reference = common::reference();
    for case in reference["cases"].as_array().unwrap() {
        let prompt_ids: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        let greedy: Vec<u32> = serde_json::from_value(case["greedy_ids"].clone()).unwrap();
        let safe = case["safe_len"].as_u64().unwrap() as usize;
        let want = &greedy[..safe];
        let ends_eos = want.last() == Some(&2);
        // Past an EOS nothing is generated, so room beyond it is safe (and shows "stop").
        let max_tokens = if ends_eos { safe + 4 } else { safe };
        let v = s.post_ok(
            "/v1/completions",
            &json!({"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
                    "logprobs": 0, "return_tokens_as_token_ids": true}),
        );
        let got = ids_from_logprobs(&v["choices"][0]);
        assert_eq!(got, want, "greedy ids for {:?}", case["prompt"]);
        assert_eq!(
            v["choices"][0]["finish_reason"],
            if ends_eos { "stop" } else { "length" }
        );
        // The text is the reference ids decoded (special tokens skipped).
        let text_ids: Vec<u32> = want
            .iter()
            .copied()
            .filter(|&t| !(ends_eos && t == 2))
            .collect();
        let decoded = s.post_ok("/detokenize", &json!({"tokens": text_ids}));
        assert_eq!(
            v["choices"][0]["text"], decoded["prompt"],
            "text for {:?}",
            case["prompt"]
        );
        assert_eq!(v["usage"]["prompt_tokens"], prompt_ids.len());
        assert_eq!(v["usage"]["completion_tokens"], safe);
    }
    // A text prompt tokenizes to the reference ids and continues the same way.
    let case = &reference["cases"][0];
    let tok = s.post_ok("/tokenize", &json!({"prompt": case["prompt"]}));
    assert_eq!(tok["tokens"], case["prompt_ids"]);
    let v = s.post_ok(
        "/v1/completions",
        &json!({"model": model, "prompt": case["prompt"], "max_tokens": 5, "temperature": 0}),
    );
    let d = s.post_ok(
        "/detokenize",
        &json!({"tokens": case["greedy_ids"].as_array().unwrap()[..5]}),
    );
    assert_eq!(v["choices"][0]["text"], d["prompt"]);
}

fn streaming_equals_non_streaming(s: &Server, model: &str) {
    for prompt in ["def fibonacci(n):", "Once upon a time, in a small village,"] {
        let body = json!({"model": model, "prompt": prompt, "max_tokens": 20, "temperature": 0});
        let full = s.post_ok("/v1/completions", &body);
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        sb["stream_options"] = json!({"include_usage": true});
        let events = s.stream("/v1/completions", &sb);
        assert_eq!(
            text_of(&events),
            full["choices"][0]["text"].as_str().unwrap(),
            "streamed text for {prompt:?}"
        );
        let usage = events.last().unwrap();
        assert_eq!(
            usage["choices"],
            json!([]),
            "the last event is the usage chunk"
        );
        assert_eq!(
            usage["usage"]["completion_tokens"],
            full["usage"]["completion_tokens"]
        );
        assert_eq!(
            usage["usage"]["prompt_tokens"],
            full["usage"]["prompt_tokens"]
        );
        assert!(usage["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
        let finals: Vec<&Value> = events
            .iter()
            .filter(|e| !e["choices"][0]["finish_reason"].is_null())
            .collect();
        assert_eq!(finals.len(), 1, "exactly one chunk carries finish_reason");
        assert_eq!(
            finals[0]["choices"][0]["finish_reason"],
            full["choices"][0]["finish_reason"]
        );
        assert!(events.iter().all(|e| e["object"] == "text_completion"));
        // Without include_usage there is no usage chunk.
        sb["stream_options"] = json!({"include_usage": false});
        let events = s.stream("/v1/completions", &sb);
        assert!(events
            .iter()
            .all(|e| e["choices"].as_array().is_some_and(|c| !c.is_empty())));
    }
    // Emoji take several byte-level tokens each: no delta splits a character.
    let body = json!({"model": model, "prompt": "Emoji list: \u{1F600} \u{1F603} \u{1F604} \u{1F601}",
                      "max_tokens": 16, "temperature": 0, "stream": true});
    let events = s.stream("/v1/completions", &body);
    let deltas: Vec<&str> = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert!(
        deltas.iter().all(|d| !d.contains('\u{FFFD}')),
        "a delta split a character: {deltas:?}"
    );
    assert!(
        deltas.concat().chars().any(|c| (c as u32) > 0xFFFF),
        "expected emoji in {deltas:?}"
    );
    let mut nb = body.clone();
    nb["stream"] = json!(false);
    assert_eq!(
        s.post_ok("/v1/completions", &nb)["choices"][0]["text"],
        deltas.concat()
    );
    // The prefix cache shows in usage for a repeated long prompt.
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let body = json!({"model": model, "prompt": long, "max_tokens": 2, "temperature": 0});
    s.post_ok("/v1/completions", &body);
    let v = s.post_ok("/v1/completions", &body);
    assert!(cached(&v) > 0, "{v}");
    // A cache salt keeps tenants apart: the same prompt with a new salt hits nothing.
    let mut salted = body.clone();
    salted["cache_salt"] = json!("tenant-a");
    let v = s.post_ok("/v1/completions", &salted);
    assert_eq!(cached(&v), 0, "{v}");
    let v = s.post_ok("/v1/completions", &salted);
    assert!(cached(&v) > 0, "{v}");
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens")
}

fn chat(s: &Server, model: &str) {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "max_completion_tokens": 16, "temperature": 0});
    let full = s.post_ok("/v1/chat/completions", &body);
    assert_eq!(full["object"], "chat.completion");
    let msg = &full["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let content = msg["content"].as_str().unwrap();
    assert!(!content.is_empty());
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let events = s.stream("/v1/chat/completions", &sb);
    assert_eq!(
        events[0]["choices"][0]["delta"]["role"], "assistant",
        "the first chunk carries the role"
    );
    assert!(events
        .iter()
        .all(|e| e["object"] == "chat.completion.chunk"));
    assert_eq!(text_of(&events), content);
    assert!(!events.last().unwrap()["choices"][0]["finish_reason"].is_null());
    // Chat logprobs.
    let mut lb = body.clone();
    lb["logprobs"] = json!(true);
    lb["top_logprobs"] = json!(2);
    lb["max_completion_tokens"] = json!(3);
    let v = s.post_ok("/v1/chat/completions", &lb);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert!(content[0]["logprob"].as_f64().unwrap() <= 0.0);
}

fn sampling_features(s: &Server, model: &str) {
    // n samples with a seed: reproducible, indexed, seeds offset per sample.
    let body = json!({"model": model, "prompt": "My favourite colour is", "max_tokens": 8, "temperature": 1.0,
                      "n": 3, "seed": 1234});
    let a = s.post_ok("/v1/completions", &body);
    let b = s.post_ok("/v1/completions", &body);
    let texts = |v: &Value| {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(texts(&a).len(), 3);
    assert_eq!(texts(&a), texts(&b), "same seed, same samples");
    let idx: Vec<_> = a["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, vec![0, 1, 2]);
    assert_eq!(a["usage"]["completion_tokens"], 24);
    // Sample 1 of seed s equals sample 0 of seed s+1.
    let one = s.post_ok(
        "/v1/completions",
        &json!({"model": model, "prompt": "My favourite colour is",
        "max_tokens": 8, "temperature": 1.0, "seed": 1235}),
    );
    assert_eq!(one["choices"][0]["text"], a["choices"][1]["text"]);
    // Several prompts in one request.
    let v = s.post_ok(
        "/v1/completions",
        &json!({"model": model, "prompt": ["Hello", "Goodbye"], "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    // Echo.
    let v = s.post_ok("/v1/completions", &json!({"model": model, "prompt": "Hello there", "max_tokens": 2, "echo": true, "temperature": 0}));
    assert!(v["choices"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("Hello there"));
    // Stop strings are cut, and named in stop_reason.
    let v = s.post_ok(
        "/v1/completions",
        &json!({"model": model, "prompt": "The capital of France is", "max_tokens": 20,
        "temperature": 0, "stop": ["\n"]}),
    );
    assert_eq!(v["choices"][0]["text"], " Paris.");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], "\n");
    // ignore_eos + min_tokens run to max_tokens; logit_bias forces a token.
    let v = s.post_ok("/v1/completions", &json!({"model": model, "prompt": [504, 3575, 282, 4649, 314], "max_tokens": 4,
        "temperature": 0, "logit_bias": {"28": 100}, "logprobs": 1, "return_tokens_as_token_ids": true,
        "ignore_eos": true, "min_tokens": 4, "user": "ignored"}));
    assert_eq!(ids_from_logprobs(&v["choices"][0]), vec![28, 28, 28, 28]);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // A field nobody defines is ignored and logged once, as vLLM does (routers add
    // their own); `--strict-request-fields` refuses it (tests/python, flags).
    let (st, text) = s.post_raw(
        "/v1/completions",
        json!({"model": model, "prompt": "Hi", "max_tokens": 2, "some_unknown_field": [1, 2]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(st, 200, "unknown field: {text}");
    assert!(
        s.log_text().contains("ignored: {\"some_unknown_field\"}"),
        "{}",
        s.log_text()
    );
}

fn tokenize_roundtrip(s: &Server) {
    let t = s.post_ok("/tokenize", &json!({"prompt": "Hello, world!"}));
    assert_eq!(t["count"], t["tokens"].as_array().unwrap().len());
    assert!(t["max_model_len"].as_u64().unwrap() > 0);
    let d = s.post_ok("/detokenize", &json!({"tokens": t["tokens"]}));
    assert_eq!(d["prompt"], "Hello, world!");
    let t = s.post_ok(
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert!(t["count"].as_u64().unwrap() > 2);
}

fn bad_inputs(s: &Server, model: &str, max_model_len: usize) {
    let cases: Vec<(Value, u16, &str)> = vec![
        (
            json!({"model": model, "prompt": "x", "max_tokens": -1}),
            400,
            "negative max_tokens",
        ),
        (
            json!({"model": model, "prompt": "x", "temperature": -0.1}),
            400,
            "negative temperature",
        ),
        (
            json!({"model": model, "prompt": "x", "top_p": 0}),
            400,
            "top_p 0",
        ),
        (
            json!({"model": model, "prompt": "x", "top_p": 1.5}),
            400,
            "top_p > 1",
        ),
        (json!({"model": model, "prompt": ""}), 400, "empty prompt"),
        (
            json!({"model": model, "prompt": []}),
            400,
            "empty prompt list",
        ),
        (
            json!({"model": model, "prompt": vec![504u32; max_model_len + 1]}),
            400,
            "prompt longer than the context",
        ),
        (
            json!({"model": model, "prompt": "x", "max_tokens": max_model_len}),
            400,
            "prompt + max_tokens over the context",
        ),
        (
            json!({"model": model, "prompt": [999_999]}),
            400,
            "token id outside the vocabulary",
        ),
        (json!({"model": model, "prompt": "x", "n": 0}), 400, "n = 0"),
        (
            json!({"model": model, "prompt": "x", "logprobs": 50}),
            400,
            "too many logprobs",
        ),
        (
            json!({"model": "no-such-model", "prompt": "x"}),
            404,
            "unknown model",
        ),
    ];
    for (body, want, what) in cases {
        let (st, text) = s.post_raw("/v1/completions", body.to_string().as_bytes());
        assert_error(st, &text, want, what);
    }
    let chat_cases: Vec<(Value, u16, &str)> = vec![
        (json!({"model": model, "messages": []}), 400, "no messages"),
        (
            json!({"model": model, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -5}),
            400,
            "negative max_completion_tokens",
        ),
        (
            json!({"model": model, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}),
            400,
            "top_logprobs without logprobs",
        ),
        (
            json!({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}),
            404,
            "unknown chat model",
        ),
    ];
    for (body, want, what) in chat_cases {
        let (st, text) = s.post_raw("/v1/chat/completions", body.to_string().as_bytes());
        assert_error(st, &text, want, what);
    }
    let (st, text) = s.post_raw("/v1/completions", b"{\"prompt\": ");
    assert_error(st, &text, 400, "malformed JSON");
    let (st, text) = s.post_raw("/v1/chat/completions", b"not json");
    assert_error(st, &text, 400, "malformed chat JSON");
    let big = json!({"model": model, "prompt": "a ".repeat(MAX_BODY)});
    let (st, text) = s.post_raw("/v1/completions", big.to_string().as_bytes());
    assert_error(st, &text, 413, "oversized body");
    let (st, text) = s.get("/v1/no-such-route");
    assert_error(st, &text, 404, "unknown route");
    let (st, text) = s.post_raw("/nope", b"{}");
    assert_error(st, &text, 404, "unknown POST route");
    // Streaming requests fail before the stream starts, with the same errors.
    let (st, text) = s.post_raw(
        "/v1/completions",
        json!({"model": model, "prompt": "x", "stream": true, "top_p": 2})
            .to_string()
            .as_bytes(),
    );
    assert_error(st, &text, 400, "bad streaming request");
}
