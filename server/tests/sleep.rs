//! Issue 26: vLLM's sleep mode from `pagoda serve --enable-sleep-mode` under
//! `VLLM_SERVER_DEV_MODE=1`: level 1 frees the KV cache, level 2 the weights too
//! (the process's resident memory falls), requests while asleep are a 503 that
//! says so, a wake-up gives the same greedy text as before, the counters of
//! `/metrics` survive a level-2 rebuild, and a sleep while a request runs is
//! refused (409) without harming that request.

mod common;

use common::{metric, Server};
use serde_json::{json, Value};

const DEV: &[(&str, &str)] = &[("VLLM_SERVER_DEV_MODE", "1")];

fn greedy(s: &Server) -> String {
    let body = json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0});
    let v = s.post_ok("/v1/completions", &body);
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

fn is_sleeping(s: &Server) -> bool {
    let (st, body) = s.get("/is_sleeping");
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["is_sleeping"].as_bool().expect("is_sleeping is a bool")
}

fn post_empty(s: &Server, path: &str) -> (u16, String) {
    s.post_raw(path, b"")
}

/// The server's resident set in KiB (Linux).
fn rss_kib(s: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// A ~900-token prompt: its KV blocks (about 40 MiB of the 64) are written, so
/// resident, and stay cached after it (the pool's pages are only resident once
/// written: a fresh cache costs no memory until used).
fn fill_kv(s: &Server) {
    let prompt = "the quick brown fox jumps over a lazy dog ".repeat(100);
    s.post_ok(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 1, "temperature": 0}),
    );
}

fn assert_asleep_refuses(s: &Server) {
    let body = json!({"prompt": "Hello", "max_tokens": 4});
    let (st, v) = s.post("/v1/completions", &body);
    assert_eq!(st, 503, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("sleeping"), "{msg}");
    // What needs no weights keeps answering.
    let (st, _) = s.get("/health");
    assert_eq!(st, 200);
    s.post_ok("/tokenize", &json!({"prompt": "Hello"}));
    let (st, _) = s.get("/metrics");
    assert_eq!(st, 200);
}

#[test]
fn sleep_levels_free_memory_and_wake_up_gives_the_same_text() {
    // 64 MiB of KV cache: large enough that level 1 visibly frees memory.
    let s = Server::start_with_env(&["--enable-sleep-mode", "--kv-cache-memory-mib", "64"], DEV);
    let before = greedy(&s);
    assert!(!is_sleeping(&s));

    fill_kv(&s);
    let rss_awake = rss_kib(&s);
    assert_eq!(post_empty(&s, "/sleep?level=1").0, 200);
    assert!(is_sleeping(&s));
    let rss_level1 = rss_kib(&s);
    eprintln!("RSS KiB: awake {rss_awake}, level 1 {rss_level1}");
    assert_asleep_refuses(&s);
    assert!(
        rss_level1 + 24 * 1024 < rss_awake,
        "level 1 frees the KV cache's written blocks (~40 MiB): {rss_awake} -> {rss_level1} KiB"
    );
    assert_eq!(post_empty(&s, "/wake_up").0, 200);
    assert!(!is_sleeping(&s));
    assert_eq!(greedy(&s), before, "level 1 keeps the weights");

    let served = metric(&s.get("/metrics").1, "vllm:generation_tokens_total").unwrap_or(0.0);
    fill_kv(&s);
    let rss_awake = rss_kib(&s);
    assert_eq!(post_empty(&s, "/sleep?level=2").0, 200);
    assert!(is_sleeping(&s));
    let rss_level2 = rss_kib(&s);
    eprintln!("RSS KiB: awake {rss_awake}, level 2 {rss_level2}");
    assert_asleep_refuses(&s);
    assert!(
        rss_level2 + 96 * 1024 < rss_awake,
        "level 2 frees the weights and the KV cache: {rss_awake} -> {rss_level2} KiB"
    );
    // The KV cache belongs to the engine: not before the weights.
    let (st, body) = post_empty(&s, "/wake_up?tags=kv_cache");
    assert_eq!(st, 409, "{body}");
    assert_eq!(post_empty(&s, "/wake_up?tags=weights").0, 200);
    assert!(is_sleeping(&s), "the KV cache still sleeps");
    assert_asleep_refuses(&s);
    assert_eq!(post_empty(&s, "/wake_up?tags=kv_cache").0, 200);
    assert!(!is_sleeping(&s));
    assert_eq!(greedy(&s), before, "the reloaded model answers the same");
    let after = metric(&s.get("/metrics").1, "vllm:generation_tokens_total").unwrap_or(0.0);
    assert!(
        after >= served + 12.0,
        "counters carry over the rebuild: {served} then {after}"
    );

    // Bad queries are 400s naming the parameter.
    let (st, body) = post_empty(&s, "/sleep?level=3");
    assert_eq!(st, 400, "{body}");
    let (st, body) = post_empty(&s, "/wake_up?tags=gpu");
    assert_eq!(st, 400, "{body}");
    assert!(!is_sleeping(&s));
}

#[test]
fn sleep_is_refused_while_a_request_runs_and_without_the_flag() {
    let s = Server::start_with_env(&["--enable-sleep-mode"], DEV);
    let body = json!({"prompt": "Count: 1, 2, 3,", "max_tokens": 200, "stream": true,
                      "ignore_eos": true});
    let mut stream = s.open_stream("/v1/completions", &body);
    stream.next_event().expect("a first chunk");
    let (st, body) = post_empty(&s, "/sleep?level=1");
    assert_eq!(st, 409, "{body}");
    assert!(body.contains("running"), "{body}");
    assert!(!is_sleeping(&s));
    let mut n = 1;
    while stream.next_event().is_some() {
        n += 1;
    }
    assert!(
        n > 100,
        "the running request finished untouched ({n} chunks)"
    );
    assert_eq!(post_empty(&s, "/sleep").0, 200, "idle now");
    assert_eq!(post_empty(&s, "/wake_up").0, 200);
    drop(s);

    let plain = Server::start_with_env(&[], DEV);
    let (st, body) = post_empty(&plain, "/sleep");
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("--enable-sleep-mode"), "{body}");
    drop(plain);

    // Without the dev mode the endpoints are not there, as in vLLM.
    let closed = Server::start(&["--enable-sleep-mode"]);
    assert_eq!(post_empty(&closed, "/sleep").0, 404);
}
