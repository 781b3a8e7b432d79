//! 64 concurrent streaming clients, a third of which hang up mid-stream: the rest
//! complete, and afterwards no request runs and no KV block is held.

mod common;

use common::{metric, Server};
use serde_json::json;
use std::sync::Arc;

const CLIENTS: usize = 64;
const MAX_TOKENS: usize = 24;
/// Clients that hang up ask for many tokens: if their requests were not aborted,
/// the token count (and the time to idle) would show it.
const HANGUP_MAX_TOKENS: usize = 400;

#[test]
fn many_streams_with_disconnects() {
    let s = Arc::new(Server::start(&["--max-num-seqs", "64"]));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                let hangup = i % 3 == 0;
                let body = json!({
                    "prompt": format!("Client {i} says: once upon a time there was a"),
                    "max_tokens": if hangup { HANGUP_MAX_TOKENS } else { MAX_TOKENS }, "temperature": 0.8, "seed": i, "ignore_eos": true,
                    "stream": true, "stream_options": {"include_usage": true},
                });
                let mut r = s.open_stream("/v1/completions", &body);
                if hangup {
                    // Read a couple of chunks, then hang up.
                    for _ in 0..2 {
                        assert!(r.next_event().is_some());
                    }
                    drop(r);
                    return None;
                }
                let mut events = Vec::new();
                while let Some(e) = r.next_event() {
                    events.push(e);
                }
                assert!(r.done, "client {i}: no [DONE]");
                Some(events)
            })
        })
        .collect();
    let mut completed = 0;
    for (i, t) in threads.into_iter().enumerate() {
        let Some(events) = t.join().expect("client thread panicked") else {
            continue;
        };
        let finish: Vec<_> = events
            .iter()
            .filter_map(|e| e["choices"][0]["finish_reason"].as_str())
            .collect();
        assert_eq!(finish, vec!["length"], "client {i}");
        let usage = &events.last().unwrap()["usage"];
        assert_eq!(usage["completion_tokens"], MAX_TOKENS, "client {i}");
        completed += 1;
    }
    assert_eq!(completed, CLIENTS - CLIENTS.div_ceil(3));
    // Aborts land at the next engine step; poll (bounded) until the engine is idle.
    let text = s.expect_metrics(&[
        ("vllm:num_requests_running", 0.0),
        ("vllm:num_requests_waiting", 0.0),
        ("vllm:kv_cache_usage_perc", 0.0),
    ]);
    // The hung-up requests were cut short, not run to their max_tokens.
    let generated = metric(&text, "vllm:generation_tokens_total").unwrap();
    eprintln!("generated {generated} tokens in all");
    let hung_up = CLIENTS.div_ceil(3);
    let bound = completed * MAX_TOKENS + hung_up * HANGUP_MAX_TOKENS / 4;
    assert!(
        generated < bound as f64,
        "{generated} tokens generated; aborts should keep it under {bound}"
    );
    // And the server still serves.
    let v = s.post_ok("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(v["usage"]["completion_tokens"], 2);
}
