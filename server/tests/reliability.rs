//! Reliability: each request that once stopped or degraded the whole server, run
//! against it again. The offending client must get a clear error, the engine must
//! stay healthy and other clients must not notice (issue 9's reproductions).
//! Faults inside the engine are provoked through the debug-only
//! `--debug-inject-fault` hook (the test profile keeps debug assertions on).

mod common;

use common::{assert_error, metric, Server};
use serde_json::{json, Value};
use std::sync::Arc;

/// A small KV cache keeps several test servers cheap side by side.
const SMALL: &[&str] = &["--kv-cache-memory-mib", "128"];

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    SMALL.iter().chain(extra).copied().collect()
}

fn assert_healthy(s: &Server) {
    assert_eq!(s.get("/health").0, 200, "log:\n{}", s.log_text());
    let v = s.post_ok(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

/// Reproduction 1: a tiny repetition penalty overflowed a logit to +inf, failed
/// the batch and stopped the engine. Now it is refused at the door, and a stream
/// running beside it is untouched.
#[test]
fn tiny_repetition_penalty_is_refused_and_others_run_on() {
    let s = Arc::new(Server::start(&with(&[])));
    let s2 = s.clone();
    let other = std::thread::spawn(move || {
        s2.stream(
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0,
                    "ignore_eos": true, "stream": true}),
        )
    });
    for rp in [1e-38, 0.0, -1.0, 1e-3, 1e30] {
        let (st, body) = s.post_raw(
            "/v1/completions",
            json!({"prompt": "The capital of France is", "max_tokens": 5, "repetition_penalty": rp})
                .to_string()
                .as_bytes(),
        );
        assert_error(st, &body, 400, &format!("repetition_penalty {rp}"));
        assert!(body.contains("repetition_penalty"), "{body}");
    }
    let events = other.join().expect("stream thread");
    assert!(
        events.iter().all(|e| e.get("error").is_none()),
        "{events:?}"
    );
    let last = events.last().expect("events");
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_healthy(&s);
}

/// Reproduction 2: masking every token (min_tokens with all ids as stop ids) left
/// nothing to sample and stopped the engine. Now it is a 400 naming the field.
#[test]
fn masking_every_token_is_refused() {
    let s = Server::start(&with(&[]));
    let all: Vec<u32> = (0..49152).collect();
    let (st, body) = s.post_raw(
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 4, "min_tokens": 2, "stop_token_ids": all})
            .to_string()
            .as_bytes(),
    );
    assert_error(st, &body, 400, "all tokens masked");
    assert!(body.contains("stop_token_ids"), "{body}");
    // Without min_tokens the same stop ids are fine: the first token stops it.
    let v = s.post_ok(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 4, "stop_token_ids": all}),
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_healthy(&s);
}

/// A row that cannot be sampled fails its own request only: 31 concurrent
/// streams finish with exactly the tokens they get without the failure.
#[test]
fn one_failing_request_leaves_31_streams_untouched() {
    let s = Arc::new(Server::start(&with(&[
        "--debug-inject-fault",
        "sampler-error=FAILME",
    ])));
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time",
        "The three primary colors are",
    ];
    let body = |p: &str, stream: bool| json!({"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": true, "stream": stream});
    let baseline: Vec<String> = prompts
        .iter()
        .map(|p| {
            s.post_ok("/v1/completions", &body(p, false))["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let threads: Vec<_> = (0..31)
        .map(|i| {
            let s = s.clone();
            let b = body(prompts[i % prompts.len()], true);
            std::thread::spawn(move || {
                let events = s.stream("/v1/completions", &b);
                let text: String = events
                    .iter()
                    .filter_map(|e| e["choices"][0]["text"].as_str())
                    .collect();
                let errors = events.iter().filter(|e| e.get("error").is_some()).count();
                (text, errors)
            })
        })
        .collect();
    // The failing requests, streamed and not, while the others run.
    let (st, text) = s.post_raw(
        "/v1/completions",
        body("FAILME now", false).to_string().as_bytes(),
    );
    assert_error(st, &text, 500, "injected sampler fault");
    assert!(text.contains("injected sampler fault"), "{text}");
    let events = s.stream("/v1/completions", &body("FAILME streamed", true));
    assert!(
        events.iter().any(|e| e.get("error").is_some()),
        "the failing stream gets an error event: {events:?}"
    );
    for (i, t) in threads.into_iter().enumerate() {
        let (text, errors) = t.join().expect("client thread");
        assert_eq!(errors, 0, "client {i}");
        assert_eq!(text, baseline[i % prompts.len()], "client {i}");
    }
    let m = s.expect_metrics(&[
        ("vllm:num_requests_running", 0.0),
        ("vllm:num_requests_waiting", 0.0),
        ("vllm:kv_cache_usage_perc", 0.0),
    ]);
    let errors = m
        .lines()
        .find(|l| l.starts_with("vllm:request_success_total") && l.contains("\"error\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert_eq!(errors, Some(2.0), "{m}");
    assert_healthy(&s);
}

/// A real engine fault (a panic inside a step) is fatal: `/health` turns 503,
/// requests in flight get an error and new ones fail at once, naming the fault.
#[test]
fn engine_panic_turns_health_red_and_fails_requests_fast() {
    let s = Server::start(&with(&["--debug-inject-fault", "panic=PANICME"]));
    let (st, body) = s.post_raw(
        "/v1/completions",
        json!({"prompt": "PANICME", "max_tokens": 4})
            .to_string()
            .as_bytes(),
    );
    assert_error(st, &body, 500, "panicking request");
    let (st, body) = s.get("/health");
    // vLLM's status for a dead engine, which routers and probes act on.
    assert_error(st, &body, 503, "/health after a fault");
    assert!(body.contains("panic"), "{body}");
    assert!(!body.contains("engine fault: engine fault"), "{body}");
    let (st, body) = s.post_raw(
        "/v1/completions",
        json!({"prompt": "Hello", "max_tokens": 4})
            .to_string()
            .as_bytes(),
    );
    assert_error(st, &body, 500, "request after a fault");
}

/// Reproduction 5: one request asking for 896 sequences filled the queue. The
/// per-request cap refuses it with a 400 naming `n`; a small request still runs.
#[test]
fn one_request_cannot_fill_the_queue() {
    let s = Server::start(&with(&[]));
    let lists: Vec<Vec<u32>> = (0..7).map(|i| vec![504 + i, 3458, 314]).collect();
    let (st, body) = s.post_raw(
        "/v1/completions",
        json!({"prompt": lists, "n": 128, "max_tokens": 2000})
            .to_string()
            .as_bytes(),
    );
    assert_error(st, &body, 400, "896 sequences");
    assert!(body.contains("--max-seqs-per-request"), "{body}");
    let (st, body) = s.post_raw(
        "/v1/completions",
        json!({"prompt": "Hi", "n": 65, "max_tokens": 1})
            .to_string()
            .as_bytes(),
    );
    assert_error(st, &body, 400, "65 > --max-num-seqs 64");
    let v = s.post_ok(
        "/v1/completions",
        &json!({"prompt": "Hi", "n": 64, "max_tokens": 1}),
    );
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(64));
    assert_healthy(&s);
}

/// `priority` needs `--scheduling-policy priority`, as in vLLM; with it, a late
/// urgent request overtakes queued ones.
#[test]
fn priority_field_and_policy() {
    let s = Server::start(&with(&[]));
    let (st, body) = s.post_raw(
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 2, "priority": -5})
            .to_string()
            .as_bytes(),
    );
    assert_error(st, &body, 400, "priority under fcfs");
    assert!(body.contains("--scheduling-policy priority"), "{body}");
    drop(s);
    // One running slot: whoever waits is ordered by priority.
    let s = Arc::new(Server::start(&with(&[
        "--scheduling-policy",
        "priority",
        "--max-num-seqs",
        "1",
    ])));
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    // The blocker holds the slot until its client hangs up (no timing assumption:
    // a fast machine finishes a short blocker before the others queue).
    let mut blocker = s.open_stream(
        "/v1/completions",
        &json!({"prompt": "Count:", "max_tokens": 1000, "ignore_eos": true, "stream": true}),
    );
    assert!(blocker.next_event().is_some());
    let spawn = |name: &'static str, priority: i64| {
        let (s, order) = (s.clone(), order.clone());
        std::thread::spawn(move || {
            s.post_ok(
                "/v1/completions",
                &json!({"prompt": name, "max_tokens": 1, "priority": priority}),
            );
            order.lock().unwrap().push(name);
        })
    };
    let low = spawn("low", 10);
    s.expect_metrics(&[("vllm:num_requests_waiting", 1.0)]);
    let urgent = spawn("urgent", -10);
    s.expect_metrics(&[("vllm:num_requests_waiting", 2.0)]);
    drop(blocker);
    for t in [low, urgent] {
        t.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec!["urgent", "low"]);
}

/// Reproduction 6: a KV cache smaller than the context used to truncate silently
/// (16 blocks of 16 announced 8192 tokens and stopped generating at 240). The
/// default context is lowered to what the cache holds, with one block count.
#[test]
fn small_kv_cache_lowers_max_model_len_honestly() {
    let s = Server::start(&["--num-kv-blocks", "16", "--block-size", "16"]);
    let (_, models) = s.get("/v1/models");
    let v: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(v["data"][0]["max_model_len"], 15 * 16, "{v}");
    assert!(s.log_text().contains("max_model_len lowered to 240"));
    let prompt: Vec<u32> = (0..200).map(|i| 300 + i).collect();
    let (st, body) = s.post_raw(
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 200})
            .to_string()
            .as_bytes(),
    );
    assert_error(st, &body, 400, "prompt 200 + max_tokens 200 > 240");
    let v = s.post_ok(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 40, "ignore_eos": true}),
    );
    assert_eq!(v["usage"]["completion_tokens"], 40);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

/// Runs `pagoda serve` expecting it to refuse to start; returns its stderr.
fn refuses_to_start(args: &[&str], envs: &[(&str, &str)]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .args(["serve", "--port", "0", "--model"])
        .arg(common::model_path())
        .args(args)
        .envs(envs.iter().copied())
        .env_remove("PAGODA_ALLOW_LONG_MAX_MODEL_LEN")
        .env_remove("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
        .output()
        .expect("running pagoda");
    assert!(!out.status.success(), "{args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn impossible_context_lengths_refuse_to_start() {
    let err = refuses_to_start(&["--max-model-len", "10000"], &[]);
    assert!(
        err.contains("PAGODA_ALLOW_LONG_MAX_MODEL_LEN") && err.contains("8192"),
        "{err}"
    );
    let err = refuses_to_start(&["--max-model-len", "4096", "--num-kv-blocks", "16"], &[]);
    assert!(
        err.contains("--num-kv-blocks") && err.contains("--max-model-len"),
        "{err}"
    );
    // Explicitly allowed, a longer context starts (the cache holds it).
    let s = Server::start_with_env(
        &["--max-model-len", "10000"],
        &[("PAGODA_ALLOW_LONG_MAX_MODEL_LEN", "1")],
    );
    let (_, models) = s.get("/v1/models");
    assert!(models.contains("\"max_model_len\":10000"), "{models}");
}

/// Bodies that are not JSON by their label are refused (415), as in vLLM.
#[test]
fn non_json_content_type_is_415() {
    let s = Server::start(&with(&[]));
    let r = ureq::post(&s.url("/v1/completions"))
        .set("Content-Type", "text/plain")
        .send_string(r#"{"prompt": "Hi", "max_tokens": 2}"#);
    match r {
        Err(ureq::Error::Status(code, resp)) => {
            let body = resp.into_string().unwrap();
            assert_error(code, &body, 415, "text/plain");
        }
        other => panic!("expected 415, got {other:?}"),
    }
    // Parameters such as a charset are fine.
    let r = ureq::post(&s.url("/v1/completions"))
        .set("Content-Type", "application/json; charset=utf-8")
        .send_string(r#"{"prompt": "Hi", "max_tokens": 2}"#)
        .expect("JSON with a charset");
    assert_eq!(r.status(), 200);
}

/// Reproduction 4: megabyte prompts were tokenized on the async threads, stalling
/// `/health`. Text that cannot fit the context is refused before tokenizing, the
/// rest is tokenized on the blocking pool, and `/health` answers throughout.
#[test]
fn huge_prompts_are_refused_without_stalling_health() {
    let s = Arc::new(Server::start(&with(&[])));
    let big = "lorem ipsum dolor sit amet ".repeat(7 * 1024 * 1024 / 27);
    let body = Arc::new(json!({"prompt": big, "max_tokens": 4}).to_string());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let prober = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                assert_eq!(s.get("/health").0, 200);
                n += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            n
        })
    };
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (s, body) = (s.clone(), body.clone());
            std::thread::spawn(move || s.post_raw("/v1/completions", body.as_bytes()))
        })
        .collect();
    for c in clients {
        let (st, text) = c.join().unwrap();
        assert_error(st, &text, 400, "7 MB prompt");
        assert!(text.contains("maximum context length"), "{text}");
    }
    // Just under the byte bound: tokenized (on the pool), then too many tokens.
    let tokens_too_many = "word ".repeat(20_000);
    let (st, text) = s.post_raw(
        "/v1/completions",
        json!({"prompt": tokens_too_many, "max_tokens": 4})
            .to_string()
            .as_bytes(),
    );
    assert_error(st, &text, 400, "20000-token prompt");
    stop.store(true, std::sync::atomic::Ordering::Release);
    assert!(prober.join().unwrap() > 0);
    assert_healthy(&s);
}

/// Reproduction (smaller): a non-streaming request cut by shutdown got a 200 with
/// partial text; now a 503 error object. A second SIGTERM ends the grace period.
#[test]
fn shutdown_cuts_non_streaming_with_503_and_second_signal_is_immediate() {
    let mut s = Server::start_with_env(&with(&[]), &[("PAGODA_SHUTDOWN_GRACE_SECS", "600")]);
    let url = s.url("/v1/completions");
    let client = std::thread::spawn(move || {
        let r = ureq::post(&url)
            .set("Content-Type", "application/json")
            .send_string(
                &json!({"prompt": "Tell me a story:", "max_tokens": 2000, "ignore_eos": true})
                    .to_string(),
            );
        match r {
            Ok(resp) => (resp.status(), resp.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(c, resp)) => (c, resp.into_string().unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        }
    });
    // Wait until it runs, then signal twice.
    s.wait_metrics(|m| metric(m, "vllm:num_requests_running") == Some(1.0));
    let term = |pid: u32| {
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill")
    };
    term(s.pid());
    std::thread::sleep(std::time::Duration::from_millis(500));
    term(s.pid());
    let (st, body) = client.join().unwrap();
    assert_error(st, &body, 503, "request cut by shutdown");
    // The grace period is 600 s: exiting within a minute shows the second signal ended it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(st) = s.child.try_wait().expect("try_wait") {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running after a second SIGTERM\n{}",
            s.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}\n{}", s.log_text());
}
