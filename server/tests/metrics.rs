//! `/metrics` after real requests: vLLM's per-request and per-step histograms
//! hold the right counts and sums (checked against the responses' usage), their
//! buckets are cumulative with vLLM's bounds, and the phase times add up.

mod common;

use common::{metric, Server};
use serde_json::{json, Value};

/// The `(le, cumulative count)` pairs of a histogram, in exposition order.
fn buckets(text: &str, name: &str) -> Vec<(String, f64)> {
    let prefix = format!("{name}_bucket{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| {
            let le = l.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
            let v: f64 = l.rsplit(' ').next().unwrap().parse().unwrap();
            (le.to_string(), v)
        })
        .collect()
}

/// Checks a histogram against the values observed: every bucket counts the
/// values at or under its bound (so counts are cumulative), +Inf and `_count`
/// count them all, `_sum` adds them up.
fn check_histogram(text: &str, name: &str, values: &[f64]) {
    let b = buckets(text, name);
    assert!(!b.is_empty(), "{name} missing:\n{text}");
    assert_eq!(b.last().unwrap().0, "+Inf", "{name}");
    for (le, count) in &b {
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap()
        };
        let want = values.iter().filter(|&&v| v <= bound).count() as f64;
        assert_eq!(*count, want, "{name} le={le} (values {values:?})");
    }
    assert_eq!(
        metric(text, &format!("{name}_count")),
        Some(values.len() as f64),
        "{name}_count"
    );
    let sum: f64 = values.iter().sum();
    let got = metric(text, &format!("{name}_sum")).unwrap();
    assert!((got - sum).abs() < 1e-6, "{name}_sum {got} != {sum}");
}

fn bounds(text: &str, name: &str) -> Vec<String> {
    buckets(text, name).into_iter().map(|(le, _)| le).collect()
}

#[test]
fn request_histograms_match_the_requests() {
    let s = Server::start(&["--max-model-len", "1000"]);
    let (_, models) = s.get("/v1/models");
    let model: Value = serde_json::from_str(&models).unwrap();
    let model = model["data"][0]["id"].as_str().unwrap().to_string();
    // Engine requests: (prompt tokens, generation tokens, max_tokens).
    let mut seen: Vec<(f64, f64, f64)> = Vec::new();
    let mut n_params = Vec::new();
    for (prompt, max_tokens) in [
        ("Hello", 3),
        ("The capital of France is", 7),
        ("Write a poem about the sea and the sky and the wind.", 12),
    ] {
        let r = s.post_ok(
            "/v1/completions",
            &json!({"model": model, "prompt": prompt, "max_tokens": max_tokens}),
        );
        let u = &r["usage"];
        seen.push((
            u["prompt_tokens"].as_f64().unwrap(),
            u["completion_tokens"].as_f64().unwrap(),
            max_tokens as f64,
        ));
        n_params.push(1.0);
    }
    // A streamed chat request, with usage in the stream.
    let events = s.stream(
        "/v1/chat/completions",
        &json!({"model": model, "messages": [{"role": "user", "content": "Hi there"}],
                "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let u = &events.last().unwrap()["usage"];
    seen.push((
        u["prompt_tokens"].as_f64().unwrap(),
        u["completion_tokens"].as_f64().unwrap(),
        5.0,
    ));
    n_params.push(1.0);
    // n = 3: one `n` observation, three engine requests sharing the prompt (vLLM
    // counts each child request in the per-request histograms).
    let r = s.post_ok(
        "/v1/completions",
        &json!({"model": model, "prompt": "Pick a number:", "max_tokens": 4, "n": 3, "seed": 1}),
    );
    let prompt = r["usage"]["prompt_tokens"].as_f64().unwrap();
    for _ in r["choices"].as_array().unwrap() {
        seen.push((prompt, 0.0, 4.0));
    }
    let completion_total = r["usage"]["completion_tokens"].as_f64().unwrap();
    n_params.push(3.0);

    let engine_requests = seen.len() as f64;
    // Every token of every request went through some step: the steps' tokens add
    // up to the prompts (each counted in the step of its first token) and the
    // generated tokens. The engine's gauges and step counts reach `/metrics` after
    // its loop's next turn, which may come after the last response: wait for it.
    let want_steps = seen.iter().map(|s| s.0 + s.1).sum::<f64>() + completion_total;
    let text = s.wait_metrics(|m| {
        metric(m, "vllm:request_prompt_tokens_count") == Some(engine_requests)
            && metric(m, "vllm:iteration_tokens_total_sum") == Some(want_steps)
            && metric(m, "vllm:num_requests_running") == Some(0.0)
    });
    let prompts: Vec<f64> = seen.iter().map(|s| s.0).collect();
    check_histogram(&text, "vllm:request_prompt_tokens", &prompts);
    let max_tokens: Vec<f64> = seen.iter().map(|s| s.2).collect();
    check_histogram(&text, "vllm:request_params_max_tokens", &max_tokens);
    check_histogram(&text, "vllm:request_params_n", &n_params);
    // Generation tokens: per request for n = 1; the n = 3 total from usage.
    let gen_sum = metric(&text, "vllm:request_generation_tokens_sum").unwrap();
    let want: f64 = seen.iter().map(|s| s.1).sum::<f64>() + completion_total;
    assert_eq!(gen_sum, want, "generation tokens sum");
    assert_eq!(
        metric(&text, "vllm:request_generation_tokens_count"),
        Some(engine_requests)
    );
    // vLLM's bounds: 1-2-5 up to max_model_len for token counts, its lists otherwise.
    let one_two_five: Vec<String> = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
        .iter()
        .map(|v| format!("{v}.0"))
        .chain(["+Inf".to_string()])
        .collect();
    assert_eq!(bounds(&text, "vllm:request_prompt_tokens"), one_two_five);
    assert_eq!(
        bounds(&text, "vllm:request_generation_tokens"),
        one_two_five
    );
    assert_eq!(
        bounds(&text, "vllm:request_params_n"),
        ["1.0", "2.0", "5.0", "10.0", "20.0", "+Inf"]
    );
    assert_eq!(
        bounds(&text, "vllm:iteration_tokens_total"),
        [
            "1.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "512.0", "1024.0", "2048.0",
            "4096.0", "8192.0", "16384.0", "+Inf"
        ]
    );
    let latency: Vec<String> = [
        "0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0",
        "40.0", "50.0", "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0", "+Inf",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for name in [
        "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ] {
        assert_eq!(bounds(&text, name), latency, "{name}");
        assert_eq!(
            metric(&text, &format!("{name}_count")),
            Some(engine_requests),
            "{name}"
        );
        let b = buckets(&text, name);
        assert!(b.windows(2).all(|w| w[0].1 <= w[1].1), "{name} cumulative");
    }
    // Phases: inference = prefill + decode for each request, so for the sums; the
    // server-side e2e latency covers queue + inference.
    let sum = |n: &str| metric(&text, &format!("{n}_sum")).unwrap();
    let (queue, prefill, decode, inference) = (
        sum("vllm:request_queue_time_seconds"),
        sum("vllm:request_prefill_time_seconds"),
        sum("vllm:request_decode_time_seconds"),
        sum("vllm:request_inference_time_seconds"),
    );
    assert!(
        (inference - (prefill + decode)).abs() < 1e-6,
        "{inference} != {prefill} + {decode}"
    );
    assert!(prefill > 0.0 && decode > 0.0 && queue >= 0.0);
    let e2e = sum("vllm:e2e_request_latency_seconds");
    assert!(
        e2e + 1e-6 >= queue + inference,
        "e2e {e2e} < queue {queue} + inference {inference}"
    );
    let step_tokens = sum("vllm:iteration_tokens_total");
    assert_eq!(step_tokens, prompts.iter().sum::<f64>() + want, "{text}");
    assert_eq!(step_tokens, want_steps);
    let b = buckets(&text, "vllm:iteration_tokens_total");
    assert!(b.windows(2).all(|w| w[0].1 <= w[1].1));
    assert_eq!(
        b.last().unwrap().1,
        metric(&text, "vllm:iteration_tokens_total_count").unwrap()
    );
    // The cache configuration, as vLLM's info gauge.
    let info = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .unwrap_or_else(|| panic!("no cache_config_info:\n{text}"));
    for label in [
        "block_size=\"16\"",
        "cache_dtype=\"auto\"",
        "enable_prefix_caching=\"True\"",
        "engine=\"0\"",
        "gpu_memory_utilization=\"0.9\"",
    ] {
        assert!(info.contains(label), "{label} in {info}");
    }
    assert!(info.ends_with("} 1.0"), "{info}");
}
