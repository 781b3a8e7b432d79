//! Issue 29: one request's `n` samples cannot hold every seat of the batch. With
//! `--max-num-seqs 4`, an `n: 4` stream runs 4 wide while alone; a plain request
//! arriving beside it gets a seat at once (one sample steps back and resumes
//! later with the same tokens) instead of waiting for the whole generation.

mod common;

use common::{metric, Server};
use serde_json::json;

#[test]
fn a_plain_request_is_served_while_an_n_request_holds_the_batch() {
    let s = Server::start(&["--max-num-seqs", "4", "--kv-cache-memory-mib", "256"]);
    let wide = json!({"prompt": "Write a long story about a dragon.", "max_tokens": 1000,
                      "temperature": 0, "ignore_eos": true, "n": 4, "stream": true});
    let mut stream = s.open_stream("/v1/completions", &wide);
    // All four samples run (the share is not a reservation) before the newcomer.
    let mut started = [false; 4];
    while !started.iter().all(|&b| b) {
        let e = stream.next_event().expect("the n=4 stream runs");
        let i = e["choices"][0]["index"].as_u64().unwrap() as usize;
        started[i] = true;
    }
    assert_eq!(
        metric(&s.get("/metrics").1, "vllm:num_requests_running"),
        Some(4.0)
    );
    let plain = s.post_ok(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(plain["usage"]["completion_tokens"], 4);
    // Served while the n=4 request still runs: none of its samples has finished.
    let mut finished = 0;
    for _ in 0..16 {
        let e = stream.next_event().expect("the n=4 stream still runs");
        if !e["choices"][0]["finish_reason"].is_null() {
            finished += 1;
        }
    }
    assert_eq!(finished, 0, "the plain request waited for the n=4 request");
    let m = s.get("/metrics").1;
    assert!(
        metric(&m, "vllm:num_preemptions_total").unwrap_or(0.0) >= 1.0,
        "one sample stepped back for the newcomer:\n{m}"
    );
}

/// The share off (`--max-running-seqs-per-request` = `--max-num-seqs`): the old
/// behaviour, the newcomer waits for a free seat and no sample steps back.
#[test]
fn the_share_can_be_turned_off() {
    let s = Server::start(&[
        "--max-num-seqs",
        "2",
        "--max-running-seqs-per-request",
        "2",
        "--kv-cache-memory-mib",
        "64",
    ]);
    let wide = json!({"prompt": "Write a story.", "max_tokens": 40, "temperature": 0,
                      "ignore_eos": true, "n": 2, "stream": true});
    let mut stream = s.open_stream("/v1/completions", &wide);
    stream.next_event().expect("the n=2 stream runs");
    let plain = s.post_ok(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(plain["usage"]["completion_tokens"], 2);
    while stream.next_event().is_some() {}
    assert!(stream.done);
    assert_eq!(
        metric(&s.get("/metrics").1, "vllm:num_preemptions_total"),
        Some(0.0)
    );
}
