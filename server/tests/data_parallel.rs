//! Issue 26: `pagoda serve --data-parallel-size 2` (`-dp 2`), through the binary.
//!
//! Two engine cores behind one API server on this 2-core machine: concurrent
//! requests are spread over both (each rank's `/metrics` samples, `engine="0"` and
//! `engine="1"`, count generated tokens), every answer equals the single-engine
//! server's (greedy; batch invariance makes it bit-exact whichever rank runs it),
//! and each rank publishes its KV-cache events on its own port with its `dp_rank`.

mod common;

use common::{metric, Server};
use serde_json::{json, Value};
use std::time::Duration;
use zeromq::{Socket, SocketRecv};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn prompts() -> Vec<String> {
    (0..6)
        .map(|i| {
            format!(
                "Story {i}. Once upon a time, in a small harbour town by the grey northern \
                 sea, there lived an old lighthouse keeper who every evening climbed the \
                 stairs and"
            )
        })
        .collect()
}

fn answers(s: &Server) -> Vec<String> {
    let texts = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts()
            .into_iter()
            .map(|p| {
                scope.spawn(move || {
                    let body = json!({"prompt": p, "max_tokens": 12, "temperature": 0,
                                      "ignore_eos": true});
                    let (st, v) = s.post("/v1/completions", &body);
                    assert_eq!(st, 200, "{v}");
                    v["choices"][0]["text"].as_str().unwrap().to_string()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<String>>()
    });
    assert!(texts.iter().all(|t| !t.is_empty()), "{texts:?}");
    texts
}

fn rank_metric(text: &str, name: &str, rank: usize) -> f64 {
    let prefix = format!("{name}{{");
    let label = format!("engine=\"{rank}\"");
    text.lines()
        .find(|l| l.starts_with(&prefix) && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} for engine {rank} missing:\n{text}"))
}

/// Decodes the `dp_rank` (the batch's third element) of one payload.
fn dp_rank(payload: &[u8]) -> u64 {
    let v = rmpv::decode::read_value(&mut &payload[..]).unwrap();
    v.as_array().unwrap()[2].as_u64().unwrap()
}

#[test]
fn two_ranks_share_the_work_and_answer_as_one_engine() {
    let single = Server::start(&[]);
    let want = answers(&single);
    drop(single);

    let port = free_port();
    // Rank 1 publishes on port + 1: both must be free.
    let port = if std::net::TcpListener::bind(("0.0.0.0", port + 1)).is_ok() {
        port
    } else {
        free_port()
    };
    let cfg = json!({"enable_kv_cache_events": true, "endpoint": format!("tcp://*:{port}"),
                     "topic": "kv"});
    let s = Server::start(&["-dp", "2", "--kv-events-config", &cfg.to_string()]);
    let log = s.log_text();
    assert!(log.contains("data-parallel rank 1: CPUs"), "{log}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut subs: Vec<zeromq::SubSocket> = (0..2)
        .map(|r| {
            rt.block_on(async {
                let mut sub = zeromq::SubSocket::new();
                sub.connect(&format!("tcp://127.0.0.1:{}", port + r))
                    .await
                    .unwrap();
                sub.subscribe("kv").await.unwrap();
                sub
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));

    for round in 0..3 {
        assert_eq!(answers(&s), want, "round {round}");
    }
    let (_, text) = s.get("/metrics");
    let per_rank: Vec<f64> = (0..2)
        .map(|r| rank_metric(&text, "vllm:generation_tokens_total", r))
        .collect();
    assert!(
        per_rank.iter().all(|&t| t > 0.0),
        "both ranks must run requests: {per_rank:?}\n{text}"
    );
    // /v1/models and the aggregate views still see one server.
    let (st, models) = s.get("/v1/models");
    assert_eq!(st, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"].as_array().unwrap().len(), 1);
    assert!(metric(&text, "vllm:num_requests_running").is_some());

    // Each rank's publisher: batches carry its rank.
    for (r, sub) in subs.iter_mut().enumerate() {
        let m = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(5), sub.recv()).await })
            .unwrap_or_else(|_| panic!("no KV events from rank {r}"))
            .unwrap()
            .into_vec();
        assert_eq!(dp_rank(&m[2]), r as u64);
    }
}

#[test]
fn more_ranks_than_cpus_is_a_clear_error() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus >= 64 {
        eprintln!("skipped: this machine has {cpus} CPUs, 64 ranks fit");
        return;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .args(["serve", "--port", &free_port().to_string()])
        .arg("--model")
        .arg(common::model_path())
        .args(["--data-parallel-size", "64"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs at least 64 CPUs"), "{err}");
}
