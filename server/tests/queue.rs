//! A bounded waiting queue: when it is full, new requests get 503 with an error
//! object, and the server recovers once it drains.

mod common;

use common::{assert_error, metric, Server};
use serde_json::json;

#[test]
fn full_queue_answers_503() {
    let s = Server::start(&["--max-num-seqs", "1", "--max-waiting-requests", "1"]);
    let long = json!({"prompt": "Count:", "max_tokens": 2000, "ignore_eos": true, "stream": true});
    // One request runs (max_num_seqs 1); read a chunk so it surely left the queue.
    let mut running = s.open_stream("/v1/completions", &long);
    assert!(running.next_event().is_some());
    // A second waits: poll until the engine reports it waiting.
    let waiting = s.open_stream("/v1/completions", &long);
    s.expect_metrics(&[("vllm:num_requests_waiting", 1.0)]);
    // The queue (1) is full: the third is refused.
    let (st, body) = s.post_raw(
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 2})
            .to_string()
            .as_bytes(),
    );
    assert_error(st, &body, 503, "queue full");
    // A client that hangs up while queued is noticed (keep-alives) and dequeued,
    // while the running request goes on.
    drop(waiting);
    s.expect_metrics(&[
        ("vllm:num_requests_waiting", 0.0),
        ("vllm:num_requests_running", 1.0),
    ]);
    assert!(
        running.next_event().is_some(),
        "the running request goes on"
    );
    // Hanging up the running one leaves the engine idle; then requests are served again.
    drop(running);
    s.expect_metrics(&[
        ("vllm:num_requests_running", 0.0),
        ("vllm:kv_cache_usage_perc", 0.0),
    ]);
    let v = s.post_ok("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}));
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

/// A non-streaming client that gives up: its request is aborted, not run to the end.
#[test]
fn non_streaming_disconnect_aborts() {
    let s = Server::start(&[]);
    let agent = ureq::AgentBuilder::new()
        .timeout_read(std::time::Duration::from_millis(500))
        .build();
    let body = json!({"prompt": "Hi", "max_tokens": 3000, "ignore_eos": true});
    let r = agent
        .post(&s.url("/v1/completions"))
        .send_string(&body.to_string());
    assert!(r.is_err(), "the client times out first");
    let text = s.expect_metrics(&[
        ("vllm:num_requests_running", 0.0),
        ("vllm:kv_cache_usage_perc", 0.0),
    ]);
    let generated = metric(&text, "vllm:generation_tokens_total").unwrap();
    assert!(
        generated < 1500.0,
        "{generated} tokens: the request was not aborted"
    );
}
