//! Issue 26: Pagoda as a worker behind vLLM's router, llm-d and the Gateway API
//! Inference Extension, through `pagoda serve`.
//!
//! - The fields a router adds to every request it forwards (`no_stop_trim`, ...)
//!   pass and are ignored, logged once per name, as vLLM does; known fields keep
//!   their checks; `--strict-request-fields` refuses the unknown ones.
//! - `/metrics` carries what the endpoint picker and the routers scrape, with
//!   values that follow the engine (the legacy names the production-stack router
//!   reads agree with the current ones).
//!
//! `/health` turning 503 once the engine is dead is `reliability.rs`'s
//! `engine_fault_*` test; `/tokenize` and `/detokenize` are `api.rs`'s.

mod common;

use common::{assert_error, metric, Server};
use serde_json::{json, Value};

fn post(s: &Server, path: &str, body: &Value) -> (u16, String) {
    s.post_raw(path, body.to_string().as_bytes())
}

/// Adds the fields vllm-router (and a made-up client) put beside the request's own.
fn routed(mut body: Value) -> Value {
    let o = body.as_object_mut().unwrap();
    o.insert("no_stop_trim".into(), json!(true));
    o.insert("separate_reasoning".into(), json!(false));
    o.insert("frobnicate".into(), json!({"x": 1}));
    body
}

fn completion() -> Value {
    routed(json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0}))
}

fn chat() -> Value {
    routed(
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                  "temperature": 0}),
    )
}

#[test]
fn router_fields_pass_logged_once_unless_strict() {
    let s = Server::start(&["--kv-cache-memory-mib", "64"]);
    for _ in 0..2 {
        let (st, text) = post(&s, "/v1/completions", &completion());
        assert_eq!(st, 200, "{text}");
        let (st, text) = post(&s, "/v1/chat/completions", &chat());
        assert_eq!(st, 200, "{text}");
    }
    let mut stream = completion();
    stream["stream"] = json!(true);
    let events = s.stream("/v1/completions", &stream);
    assert!(!events.is_empty());
    let (st, text) = post(&s, "/tokenize", &routed(json!({"prompt": "Hi"})));
    assert_eq!(st, 200, "{text}");
    // Only the refusal of unknown names changed: known fields keep their checks.
    for (bad, field) in [
        (json!({"best_of": 3}), "best_of"),
        (json!({"temperature": -1.0}), "temperature"),
        (json!({"guided_json": {"type": "object"}}), "guided_json"),
    ] {
        let mut body = completion();
        for (k, v) in bad.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (st, text) = post(&s, "/v1/completions", &body);
        assert_error(st, &text, 400, field);
        assert!(text.contains(field), "{text}");
    }
    // Logged once per field name, however many requests carried it.
    let log = s.log_text();
    for name in ["no_stop_trim", "separate_reasoning", "frobnicate"] {
        let line = format!("ignored: {{\"{name}\"}}");
        assert_eq!(log.matches(&line).count(), 1, "{line} in\n{log}");
    }
    drop(s);

    let strict = Server::start(&["--kv-cache-memory-mib", "64", "--strict-request-fields"]);
    for (path, body) in [
        ("/v1/completions", completion()),
        ("/v1/chat/completions", chat()),
    ] {
        let (st, text) = post(&strict, path, &body);
        assert_error(st, &text, 400, path);
        assert!(
            text.contains("Unrecognized request argument supplied: "),
            "{text}"
        );
    }
    let plain = json!({"prompt": "Hi", "max_tokens": 2});
    let (st, text) = post(&strict, "/v1/completions", &plain);
    assert_eq!(st, 200, "strict still serves plain requests: {text}");
}

/// Every `vllm:` sample except the info gauge (which vLLM labels with the
/// config, not the model) carries `model_name`.
fn assert_model_label(text: &str, model: &str) {
    let label = format!("model_name=\"{model}\"");
    for l in text.lines().filter(|l| l.starts_with("vllm:")) {
        if !l.starts_with("vllm:cache_config_info{") {
            assert!(l.contains(&label), "{l}");
        }
    }
}

fn value(text: &str, name: &str) -> f64 {
    metric(text, name).unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// The legacy names agree with the current ones, and the hit rate is hits/queries.
fn assert_legacy_agree(text: &str) {
    for (old, new) in [
        ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
        (
            "vllm:gpu_prefix_cache_hits_total",
            "vllm:prefix_cache_hits_total",
        ),
        (
            "vllm:gpu_prefix_cache_queries_total",
            "vllm:prefix_cache_queries_total",
        ),
    ] {
        assert_eq!(value(text, old), value(text, new), "{old} vs {new}");
    }
    let (hits, queries) = (
        value(text, "vllm:prefix_cache_hits_total"),
        value(text, "vllm:prefix_cache_queries_total"),
    );
    let rate = value(text, "vllm:gpu_prefix_cache_hit_rate");
    let want = if queries == 0.0 { 0.0 } else { hits / queries };
    assert!((rate - want).abs() < 1e-9, "{rate} vs {hits}/{queries}");
    let usage = value(text, "vllm:kv_cache_usage_perc");
    assert!((0.0..=1.0).contains(&usage), "{usage}");
}

#[test]
fn router_metrics_render_and_move() {
    let s = Server::start(&[
        "--num-kv-blocks",
        "96",
        "--served-model-name",
        "routed-smol",
    ]);
    let idle = s.expect_metrics(&[
        ("vllm:num_requests_running", 0.0),
        ("vllm:num_requests_waiting", 0.0),
        ("vllm:kv_cache_usage_perc", 0.0),
        ("vllm:gpu_prefix_cache_hits_total", 0.0),
    ]);
    assert_model_label(&idle, "routed-smol");
    assert_legacy_agree(&idle);
    let info = idle
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .unwrap_or_else(|| panic!("no cache_config_info:\n{idle}"));
    for label in ["block_size=\"16\"", "num_gpu_blocks=\"96\"", "engine=\"0\""] {
        assert!(info.contains(label), "{label} in {info}");
    }
    assert!(info.ends_with("} 1.0"), "{info}");

    // A running request holds blocks: usage is above 0 (and at most 1).
    let long = json!({"prompt": "Count:", "max_tokens": 1000, "ignore_eos": true,
                      "stream": true, "model": "routed-smol"});
    let mut running = s.open_stream("/v1/completions", &long);
    assert!(running.next_event().is_some());
    let busy = s.wait_metrics(|m| {
        metric(m, "vllm:num_requests_running") == Some(1.0)
            && metric(m, "vllm:kv_cache_usage_perc").is_some_and(|u| u > 0.0)
    });
    assert_eq!(value(&busy, "vllm:num_requests_running"), 1.0, "{busy}");
    assert!(value(&busy, "vllm:kv_cache_usage_perc") > 0.0, "{busy}");
    assert_legacy_agree(&busy);
    assert_model_label(&busy, "routed-smol");
    drop(running);
    s.expect_metrics(&[("vllm:num_requests_running", 0.0)]);

    // A repeated prompt of several blocks hits the prefix cache the second time.
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(12);
    let body = json!({"prompt": prompt, "max_tokens": 1, "temperature": 0});
    let (st, text) = post(&s, "/v1/completions", &body);
    assert_eq!(st, 200, "{text}");
    let first = s.get("/metrics").1;
    let (st, text) = post(&s, "/v1/completions", &body);
    assert_eq!(st, 200, "{text}");
    let second = s.get("/metrics").1;
    let hits = |t: &str| value(t, "vllm:gpu_prefix_cache_hits_total");
    let queries = |t: &str| value(t, "vllm:gpu_prefix_cache_queries_total");
    assert!(
        hits(&second) >= hits(&first) + 16.0,
        "{} -> {}",
        hits(&first),
        hits(&second)
    );
    assert!(queries(&second) > queries(&first));
    assert!(value(&second, "vllm:gpu_prefix_cache_hit_rate") > 0.0);
    assert_legacy_agree(&second);
    assert_model_label(&second, "routed-smol");
}
