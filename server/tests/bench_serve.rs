//! `pagoda bench serve` against a fake OpenAI-compatible SSE server on loopback:
//! request counts, failure accounting, concurrency bound, prompt shape, the JSON
//! report and the PNG plot. Needs no model.

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Seen {
    prompts: Vec<Vec<u32>>,
    /// Requests the fake server made fail (HTTP 500 or an error event).
    failures: usize,
    in_flight: usize,
    max_in_flight: usize,
    peers: HashSet<SocketAddr>,
    bad_bodies: Vec<String>,
}

type Shared = Arc<Mutex<Seen>>;

struct InFlight(Shared);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().unwrap().in_flight -= 1;
    }
}

fn sse(v: Value) -> String {
    format!("data: {v}\n\n")
}

async fn completions(
    State(s): State<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Json(b): Json<Value>,
) -> Response {
    let prompt: Vec<u32> = b["prompt"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect()
        })
        .unwrap_or_default();
    let max_tokens = b["max_tokens"].as_u64().unwrap_or(0) as usize;
    {
        let mut g = s.lock().unwrap();
        g.peers.insert(peer);
        let ok_body = b["stream"] == json!(true)
            && b["ignore_eos"] == json!(true)
            && b["temperature"].as_f64() == Some(0.0)
            && b["stream_options"]["include_usage"] == json!(true)
            && max_tokens > 0;
        if !ok_body {
            g.bad_bodies.push(b.to_string());
        }
        if b["model"] != json!("fake") {
            return (
                StatusCode::NOT_FOUND,
                Json(json!({"error": {"message": "no such model"}})),
            )
                .into_response();
        }
        g.prompts.push(prompt.clone());
        g.in_flight += 1;
        g.max_in_flight = g.max_in_flight.max(g.in_flight);
    }
    let guard = InFlight(s.clone());
    // The prompt picks the behaviour, so failures are spread over the run; the
    // first request (the client's warm-up) always succeeds.
    let first = s.lock().unwrap().prompts.len() == 1;
    let kind = if first {
        3
    } else {
        prompt.iter().map(|&t| t as u64).sum::<u64>() % 7
    };
    if kind == 0 {
        s.lock().unwrap().failures += 1;
        drop(guard);
        return (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response();
    }
    if kind == 1 {
        s.lock().unwrap().failures += 1;
    }
    let plen = prompt.len();
    // The request stops counting as in flight just before the event that ends it
    // for the client goes out, so the server's count never lags the client's.
    let stream = futures::stream::unfold((0usize, Some(guard)), move |(i, mut guard)| async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let ev = if i < max_tokens {
            if kind == 1 && i == 2 {
                guard.take();
                sse(json!({"error": {"message": "engine died"}}))
            } else {
                sse(json!({"choices": [{"index": 0, "text": "t", "finish_reason": null}]}))
            }
        } else if i == max_tokens {
            sse(json!({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}))
        } else if i == max_tokens + 1 {
            // Some requests report no usage: the client must count chunks.
            if kind == 2 {
                String::new()
            } else {
                sse(
                    json!({"choices": [], "usage": {"prompt_tokens": plen, "completion_tokens": max_tokens}}),
                )
            }
        } else if i == max_tokens + 2 {
            guard.take();
            "data: [DONE]\n\n".to_string()
        } else {
            return None;
        };
        Some((Ok::<_, std::io::Error>(ev), (i + 1, guard)))
    });
    let body = Body::from_stream(stream);
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(body)
        .unwrap()
}

/// Starts the fake server on a loopback port in a background thread.
fn start_fake() -> (String, Shared) {
    let seen: Shared = Arc::default();
    let s2 = seen.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = Router::new()
                .route("/v1/completions", post(completions))
                .route(
                    "/v1/models",
                    get(|| async { Json(json!({"object": "list", "data": [{"id": "fake"}]})) }),
                )
                .with_state(s2);
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            axum::serve(l, app.into_make_service_with_connect_info::<SocketAddr>())
                .await
                .unwrap();
        });
    });
    let addr = rx.recv().unwrap();
    (format!("http://{addr}"), seen)
}

fn pagoda(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .arg("bench")
        .arg("serve")
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .output()
        .expect("runs pagoda")
}

#[test]
fn counts_failures_concurrency_json_and_plot() {
    let (base, seen) = start_fake();
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("out.json");
    let png_path = dir.path().join("out.png");
    let out = pagoda(&[
        "--base-url",
        &base,
        "--model",
        "fake",
        "--concurrency",
        "1,4",
        "--num-prompts",
        "14",
        "--input-len",
        "8",
        "--output-len",
        "5",
        "--shared-prefix-len",
        "3",
        "--seed",
        "7",
        "--json",
        json_path.to_str().unwrap(),
        "--plot",
        png_path.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("Serving Benchmark Result (concurrency 4)"),
        "{stdout}"
    );

    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let g = seen.lock().unwrap();
    assert!(
        g.bad_bodies.is_empty(),
        "malformed requests: {:?}",
        g.bad_bodies
    );
    let levels = report["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    let mut failed_total = 0;
    for (l, c) in levels.iter().zip([1u64, 4]) {
        let s = &l["summary"];
        assert_eq!(s["concurrency"].as_u64(), Some(c));
        assert_eq!(s["num_prompts"].as_u64(), Some(14));
        let (ok, failed) = (
            s["completed"].as_u64().unwrap(),
            s["failed"].as_u64().unwrap(),
        );
        assert_eq!(ok + failed, 14);
        failed_total += failed as usize;
        assert_eq!(s["total_output_tokens"].as_u64(), Some(5 * ok));
        let reqs = l["requests"].as_array().unwrap();
        assert_eq!(reqs.len(), 14);
        for r in reqs.iter().filter(|r| r["ok"] == json!(true)) {
            assert_eq!(r["output_tokens"].as_u64(), Some(5));
            assert_eq!(r["chunks"].as_u64(), Some(5));
            assert_eq!(r["itl_s"].as_array().unwrap().len(), 4);
            assert!(r["ttft_s"].as_f64().unwrap() <= r["e2e_s"].as_f64().unwrap());
        }
        for r in reqs.iter().filter(|r| r["ok"] != json!(true)) {
            assert!(r["error"].as_str().is_some_and(|e| !e.is_empty()));
        }
        assert_eq!(s["ttft_ms"]["count"].as_u64(), Some(ok));
    }
    // The warm-up never fails, so every failure the server caused is one the
    // report counts.
    assert_eq!(failed_total, g.failures);
    assert!(g.failures > 0, "the seed should exercise failures");
    assert!(
        g.max_in_flight <= 4,
        "at most 4 in flight, saw {}",
        g.max_in_flight
    );

    // 1 warm-up + 28 measured prompts: distinct, 3 + 8 tokens, one shared prefix.
    assert_eq!(g.prompts.len(), 29);
    let distinct: HashSet<_> = g.prompts.iter().collect();
    assert_eq!(distinct.len(), 29);
    assert!(g
        .prompts
        .iter()
        .all(|p| p.len() == 11 && p[..3] == g.prompts[0][..3]));
    assert!(g
        .prompts
        .iter()
        .flatten()
        .all(|&t| (1000..10000).contains(&t)));

    let png = std::fs::read(&png_path).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
}

#[test]
fn new_connection_per_request_and_model_discovery() {
    let (base, seen) = start_fake();
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("r.json");
    // No --model: it comes from /v1/models.
    let out = pagoda(&[
        "--base-url",
        &format!("{base}/v1"),
        "--concurrency",
        "2",
        "--num-prompts",
        "6",
        "--input-len",
        "4",
        "--output-len",
        "3",
        "--new-connection-per-request",
        "--quiet",
        "--json",
        json_path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(report["model"], json!("fake"));
    assert_eq!(report["new_connection_per_request"], json!(true));
    let g = seen.lock().unwrap();
    // Every completion (warm-up included) came over its own connection.
    assert_eq!(g.prompts.len(), 7);
    assert!(
        g.peers.len() >= 7,
        "{} connections for 7 requests",
        g.peers.len()
    );
}

#[test]
fn wrong_model_fails_cleanly_and_bad_url_is_rejected() {
    let (base, _seen) = start_fake();
    let out = pagoda(&[
        "--base-url",
        &base,
        "--model",
        "nope",
        "--num-prompts",
        "2",
        "--warmup",
        "0",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("every request failed") && err.contains("404"),
        "{err}"
    );

    let out = pagoda(&["--base-url", "https://127.0.0.1:1", "--model", "x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("plain http only"));
}
