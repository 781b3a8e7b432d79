//! SIGTERM: the server stops accepting, lets the in-flight stream finish, and
//! exits with status 0.

mod common;

use common::Server;
use serde_json::json;

#[test]
fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let mut s = Server::start(&[]);
    let body = json!({"prompt": "Tell me a story:", "max_tokens": 32, "temperature": 0, "ignore_eos": true,
                      "stream": true});
    let mut r = s.open_stream("/v1/completions", &body);
    assert!(r.next_event().is_some(), "a first chunk before the signal");
    let st = std::process::Command::new("kill")
        .args(["-TERM", &s.pid().to_string()])
        .status()
        .expect("running kill");
    assert!(st.success());
    let mut finish = None;
    while let Some(e) = r.next_event() {
        if let Some(f) = e["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    assert!(r.done, "the in-flight stream completes");
    assert_eq!(
        finish.as_deref(),
        Some("length"),
        "it ran to max_tokens, not aborted"
    );
    let status = s.child.wait().expect("waiting for the server");
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        s.log_text()
    );
}

/// Past the grace period, in-flight requests are aborted (finish_reason "abort")
/// and the server still exits with status 0.
#[test]
fn sigterm_aborts_requests_that_outlast_the_grace_period() {
    aborts_after_grace(Server::start_with_env(
        &[],
        &[("PAGODA_SHUTDOWN_GRACE_SECS", "1")],
    ));
}

/// vLLM's `--shutdown-timeout` sets the grace period (and wins over the variable).
#[test]
fn shutdown_timeout_flag_sets_the_grace_period() {
    aborts_after_grace(Server::start_with_env(
        &["--shutdown-timeout", "1"],
        &[("PAGODA_SHUTDOWN_GRACE_SECS", "600")],
    ));
}

fn aborts_after_grace(mut s: Server) {
    let body = json!({"prompt": "Tell me a story:", "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let mut r = s.open_stream("/v1/completions", &body);
    assert!(r.next_event().is_some(), "a first chunk before the signal");
    let st = std::process::Command::new("kill")
        .args(["-TERM", &s.pid().to_string()])
        .status()
        .expect("running kill");
    assert!(st.success());
    let mut finish = None;
    while let Some(e) = r.next_event() {
        if let Some(f) = e["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    assert!(r.done, "the aborted stream still ends with [DONE]");
    assert_eq!(finish.as_deref(), Some("abort"));
    let status = s.child.wait().expect("waiting for the server");
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        s.log_text()
    );
}
