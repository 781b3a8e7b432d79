//! Amplifying fields (issue 29 D5, D6): what one request holds is shared by its
//! `n` samples, not copied into each, and the number and length of stop strings
//! are bounded (`--max-stop-strings`, `--max-stop-string-len`), refused with a 400
//! naming `stop` and the limit.

mod common;

use common::{assert_error, Server};
use serde_json::{json, Value};

fn status_kb(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading /proc status");
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// D6: more stop strings than the limit, or a longer one, is a 400 naming `stop`
/// and the flag; at the limits the request runs.
#[test]
fn stop_strings_are_bounded() {
    let s = Server::start(&[
        "--kv-cache-memory-mib",
        "64",
        "--max-stop-strings",
        "8",
        "--max-stop-string-len",
        "16",
    ]);
    let body = |stop: Value| {
        json!({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0,
               "stop": stop})
        .to_string()
    };
    let nine: Vec<String> = (0..9).map(|i| format!("zq{i}")).collect();
    for (stop, flag) in [
        (json!(nine), "--max-stop-strings"),
        (json!(["x".repeat(17)]), "--max-stop-string-len"),
        (json!(["é".repeat(9)]), "--max-stop-string-len"), // 18 bytes, 9 characters
    ] {
        for path in ["/v1/completions", "/v1/chat/completions"] {
            let b = if path.contains("chat") {
                json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                       "stop": stop})
                .to_string()
            } else {
                body(stop.clone())
            };
            let (st, text) = s.post_raw(path, b.as_bytes());
            assert_error(st, &text, 400, flag);
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["error"]["param"], "stop", "{text}");
            assert!(text.contains(flag), "{text}");
        }
    }
    // At the limits: 8 strings, one of 16 bytes.
    let mut eight: Vec<String> = (0..7).map(|i| format!("zq{i}")).collect();
    eight.push("y".repeat(16));
    let (st, text) = s.post_raw("/v1/completions", body(json!(eight)).as_bytes());
    assert_eq!(st, 200, "{text}");
}

/// D5: a request's lists are held once, not once per sample. 64 samples of a
/// request carrying ~0.45 MB of lists (256 stop strings of 1000 bytes, and
/// 24,576 ids each in `stop_token_ids` and `allowed_token_ids`) raised the
/// server's peak RSS by 105 MB before the lists were shared (2-3 copies per
/// sample: the sample's parameters, the runner's, the detokenizer's stop list);
/// shared, 11 MB (the lists once, the stop automaton, the body). The bound stated
/// here is 40 MB over the RSS after the same request without the lists.
#[test]
fn n_samples_share_the_request_lists() {
    let s = Server::start(&[
        "--kv-cache-memory-mib",
        "128",
        "--max-num-seqs",
        "64",
        "--max-seqs-per-request",
        "64",
    ]);
    let pid = s.pid();
    let vocab = 49152u32;
    let half = vocab / 2;
    let base = json!({"prompt": "Once upon a time", "max_tokens": 4, "n": 64,
                      "temperature": 0.8, "seed": 1, "ignore_eos": true});
    // Warm-up with the same shape: batch buffers, KV, threads. The KV pool's pages
    // become resident only once written, and each request takes fresh blocks from
    // the free queue's head: four rounds of 64 samples write every block of the
    // 128 MiB pool (~175 blocks of 16), so first writes are not counted below.
    for _ in 0..4 {
        let v = s.post_ok("/v1/completions", &base);
        assert_eq!(v["choices"].as_array().map(Vec::len), Some(64));
    }
    let mut big = base.clone();
    // 256 distinct stop strings of 1000 bytes: longer than 4 tokens of text, so
    // none can match.
    let stop: Vec<String> = (0..256)
        .map(|i| format!("{i:04}{}", "x".repeat(996)))
        .collect();
    big["stop"] = json!(stop);
    big["stop_token_ids"] = json!((0..half).collect::<Vec<u32>>());
    big["allowed_token_ids"] = json!((half..vocab).collect::<Vec<u32>>());
    let body = big.to_string();
    assert!(body.len() < 1 << 20, "body {} bytes", body.len());
    // Reset the peak to the current RSS ("5" clears VmHWM).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("resetting VmHWM");
    let before = status_kb(pid, "VmRSS:");
    let (st, text) = s.post_raw("/v1/completions", body.as_bytes());
    assert_eq!(st, 200, "{}", &text[..text.len().min(500)]);
    let v: Value = serde_json::from_str(&text).unwrap();
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 64);
    assert!(
        choices.iter().all(|c| c["finish_reason"] == "length"),
        "{v}"
    );
    let peak = status_kb(pid, "VmHWM:");
    let grew_mb = peak.saturating_sub(before) as f64 / 1024.0;
    eprintln!(
        "peak RSS grew by {grew_mb:.1} MB for n=64 with {} bytes of lists",
        body.len()
    );
    assert!(
        grew_mb < 40.0,
        "peak RSS grew by {grew_mb:.1} MB (bound 40 MB): the lists are copied per sample"
    );
}
