//! The reliability suite's load half: a property-based fuzzer over every endpoint,
//! a disconnect storm, and a soak (60 s x 64 streams by default; the long run is
//! `scripts/soak.sh`, which sets `PAGODA_SOAK_SECS` / `PAGODA_SOAK_STREAMS`).
//! Each ends with the engine alive, nothing running or waiting and no KV block held.

mod common;

use common::{assert_error, metric, Server};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn idle_gauges() -> [(&'static str, f64); 3] {
    [
        ("vllm:num_requests_running", 0.0),
        ("vllm:num_requests_waiting", 0.0),
        ("vllm:kv_cache_usage_perc", 0.0),
    ]
}

/// Any JSON value, with the extremes that break arithmetic and parsers.
fn any_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..70).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop_oneof![
            Just(0.0f64),
            Just(1e-38),
            Just(-1e-38),
            Just(1e38),
            Just(-1e308),
            Just(f64::MIN_POSITIVE),
            -3.0f64..3.0
        ]
        .prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::from),
        prop::collection::vec(0u32..60000, 0..6).prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "n",
    "logit_bias",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "echo",
    "priority",
    "cache_salt",
    "tokens",
    "add_special_tokens",
    "return_token_strs",
    "include_stop_str_in_output",
];

/// A body for one endpoint: a plausible base (so many cases get past parsing)
/// with random fields overwritten by random values, or raw bytes.
fn body(path: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let base = match path {
        "/v1/chat/completions" => {
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        }
        "/tokenize" => json!({"prompt": "Hello world"}),
        "/detokenize" => json!({"tokens": [19556, 905]}),
        _ => json!({"prompt": "Hello", "max_tokens": 3}),
    };
    let fields = prop::collection::vec((prop::sample::select(FIELDS), any_value()), 0..4);
    prop_oneof![
        8 => fields.prop_map(move |f| {
            let mut m: Map<String, Value> = base.as_object().cloned().unwrap_or_default();
            for (k, v) in f {
                m.insert(k.to_string(), v);
            }
            Value::Object(m).to_string().into_bytes()
        }),
        1 => prop::collection::vec(any::<u8>(), 0..64),
        1 => any_value().prop_map(|v| v.to_string().into_bytes()),
    ]
}

/// One fuzz case: a 4xx error object or a well-formed 200, never a 5xx.
fn check_answer(s: &Server, path: &str, body: &[u8]) -> Result<(), TestCaseError> {
    let (status, text) = s.post_raw(path, body);
    prop_assert!(
        status < 500,
        "{path} {} -> {status} {text}",
        String::from_utf8_lossy(body)
    );
    if status != 200 {
        assert_error(status, &text, status, path);
        return Ok(());
    }
    if text.starts_with("data: ") || text.starts_with(": keep-alive") {
        prop_assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if line != "[DONE]" {
                let v: Value = serde_json::from_str(line).expect("SSE JSON");
                prop_assert!(v.get("error").is_none(), "{path}: error event {v}");
            }
        }
        return Ok(());
    }
    let v: Value = serde_json::from_str(&text).expect("200 body is JSON");
    let key = match path {
        "/tokenize" => "tokens",
        "/detokenize" => "prompt",
        _ => "choices",
    };
    prop_assert!(v.get(key).is_some(), "{path}: {v}");
    Ok(())
}

#[test]
fn fuzzed_bodies_get_4xx_or_valid_200() {
    // A short context bounds the work a random max_tokens can ask for.
    let s = Server::start(&["--kv-cache-memory-mib", "64", "--max-model-len", "128"]);
    let cases: u32 = std::env::var("PAGODA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    for path in [
        "/v1/completions",
        "/v1/chat/completions",
        "/tokenize",
        "/detokenize",
    ] {
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&body(path), |b| check_answer(&s, path, &b))
            .unwrap_or_else(|e| panic!("{path}: {e}\nlog:\n{}", s.log_text()));
    }
    assert_eq!(s.get("/health").0, 200);
    s.expect_metrics(&idle_gauges());
}

/// 64 streams opened at once and dropped after their first event, twice over.
#[test]
fn disconnect_storm_leaves_nothing_behind() {
    let s = Arc::new(Server::start(&["--kv-cache-memory-mib", "128"]));
    for round in 0..2 {
        let threads: Vec<_> = (0..64)
            .map(|i| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let body = json!({"prompt": format!("Storm {round} client {i}:"),
                        "max_tokens": 500, "ignore_eos": true, "stream": true});
                    let mut r = s.open_stream("/v1/completions", &body);
                    let _ = r.next_event();
                })
            })
            .collect();
        for t in threads {
            t.join().expect("client");
        }
    }
    s.expect_metrics(&idle_gauges());
    assert_eq!(s.get("/health").0, 200);
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

#[derive(Default)]
struct Tally {
    ok: u64,
    aborted: u64,
    client_errors: u64,
    server_errors: Vec<String>,
    latencies: Vec<f64>,
    tokens: u64,
}

/// Runs prompts whose blocks add up to more than the whole KV cache, so every
/// block's pages are resident before RSS is measured: growth after that is the
/// server's, not first touches of the preallocated cache. (Freed blocks go to the
/// tail of the free queue, so allocations walk through every block.)
fn touch_whole_kv_cache(s: &Server, kv_mib: u64) {
    // SmolLM2: 30 layers x 3 KV heads x 64 dims x (K + V) x 4 bytes per token.
    let tokens = (kv_mib << 20) / (30 * 3 * 64 * 2 * 4);
    let per_prompt = 1000;
    for i in 0..(tokens * 5 / 4).div_ceil(per_prompt) {
        let prompt: Vec<u32> = (0..per_prompt)
            .map(|j| 300 + ((i * 7919 + j * 31) % 39000) as u32)
            .collect();
        s.post_ok(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 1}),
        );
    }
}

/// One soak client: random prompt lengths, output lengths, streaming or not, and
/// hang-ups, until `stop`.
fn soak_client(s: &Server, seed: u64, stop: &AtomicBool, tally: &Mutex<Tally>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    while !stop.load(Ordering::Acquire) {
        let prompt_len = rng.gen_range(4..200);
        let prompt: Vec<u32> = (0..prompt_len).map(|_| rng.gen_range(300..40000)).collect();
        let max_tokens = rng.gen_range(1..64);
        let stream = rng.gen_bool(0.6);
        let hangup = stream && rng.gen_bool(0.2);
        let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.7,
                          "seed": seed, "ignore_eos": rng.gen_bool(0.5), "stream": stream,
                          "n": if rng.gen_bool(0.1) { 2 } else { 1 }});
        let t0 = Instant::now();
        if stream {
            let mut r = s.open_stream("/v1/completions", &body);
            let mut n = 0;
            let mut error = None;
            while let Some(e) = r.next_event() {
                if e.get("error").is_some() {
                    error = Some(e.to_string());
                }
                n += 1;
                if hangup && n >= 2 {
                    break;
                }
            }
            let mut t = tally.lock().unwrap();
            match error {
                Some(e) => t.server_errors.push(e),
                None if hangup => t.aborted += 1,
                None => {
                    t.ok += 1;
                    t.tokens += n as u64;
                    t.latencies.push(t0.elapsed().as_secs_f64());
                }
            }
        } else {
            let (status, text) = s.post_raw("/v1/completions", body.to_string().as_bytes());
            let mut t = tally.lock().unwrap();
            match status {
                200 => {
                    t.ok += 1;
                    t.latencies.push(t0.elapsed().as_secs_f64());
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    t.tokens += v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
                }
                400..=499 => t.client_errors += 1,
                _ => t.server_errors.push(format!("{status} {text}")),
            }
        }
    }
}

/// The soak: `PAGODA_SOAK_SECS` (60) seconds of `PAGODA_SOAK_STREAMS` (64)
/// concurrent clients. Prints a summary line for RELIABILITY.md.
#[test]
fn soak_random_load_with_aborts() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let secs = env("PAGODA_SOAK_SECS", 60);
    let streams = env("PAGODA_SOAK_STREAMS", 64) as usize;
    let kv_mib = env("PAGODA_SOAK_KV_MIB", 128);
    let kv = kv_mib.to_string();
    let s = Arc::new(Server::start(&[
        "--kv-cache-memory-mib",
        &kv,
        "--max-num-seqs",
        "64",
    ]));
    touch_whole_kv_cache(&s, kv_mib);
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let t0 = Instant::now();
    let clients: Vec<_> = (0..streams)
        .map(|i| {
            let (s, stop, tally) = (s.clone(), stop.clone(), tally.clone());
            std::thread::spawn(move || soak_client(&s, i as u64, &stop, &tally))
        })
        .collect();
    let warm = Duration::from_secs(secs.min(20));
    std::thread::sleep(warm);
    let rss_warm = rss_mib(s.pid());
    let mut rss_max = rss_warm;
    while t0.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(1));
        rss_max = rss_max.max(rss_mib(s.pid()));
        assert_eq!(s.get("/health").0, 200, "{}", s.log_text());
    }
    stop.store(true, Ordering::Release);
    for c in clients {
        c.join().expect("soak client");
    }
    let m = s.expect_metrics(&idle_gauges());
    let rss_end = rss_mib(s.pid());
    let t = tally.lock().unwrap();
    let mut lat = t.latencies.clone();
    lat.sort_by(f64::total_cmp);
    let p99 = lat.get(lat.len() * 99 / 100).copied().unwrap_or(0.0);
    let growth = rss_max.max(rss_end) - rss_warm;
    println!(
        "SOAK secs={secs} streams={streams} ok={} aborted={} client_errors={} server_errors={} \
         tokens={} p99_latency_s={p99:.2} rss_after_warmup_mib={rss_warm:.0} rss_max_mib={rss_max:.0} \
         rss_end_mib={rss_end:.0} growth_mib={growth:.0} running={:?} waiting={:?} kv_usage={:?} preemptions={:?}",
        t.ok,
        t.aborted,
        t.client_errors,
        t.server_errors.len(),
        t.tokens,
        metric(&m, "vllm:num_requests_running"),
        metric(&m, "vllm:num_requests_waiting"),
        metric(&m, "vllm:kv_cache_usage_perc"),
        metric(&m, "vllm:num_preemptions_total"),
    );
    assert!(
        t.server_errors.is_empty(),
        "{:?}",
        &t.server_errors[..t.server_errors.len().min(5)]
    );
    assert!(t.ok > 0);
    // Bound: after the warm-up (KV cache pages touched, buffers grown) the server
    // may still settle a little, but not grow with the number of requests.
    assert!(growth < 64.0, "RSS grew {growth:.0} MiB after warm-up");
}
