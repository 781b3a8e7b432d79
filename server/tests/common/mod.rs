//! Shared harness for the server's integration tests: starts the real `pagoda`
//! binary on the real model on a free loopback port and talks plain HTTP to it.

#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The model the tests run: `$PAGODA_MODEL` or the cache default.
pub fn model_path() -> PathBuf {
    let p = std::env::var_os("PAGODA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."));
            home.join(".cache/pagoda/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        p.exists(),
        "the test model {} is missing: run scripts/fetch-model.sh or set PAGODA_MODEL",
        p.display()
    );
    p
}

/// The reference greedy outputs (`tests/data/smollm2-greedy.json`).
pub fn reference() -> Value {
    let candidates = [
        std::env::var_os("PAGODA_REFERENCE").map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/smollm2-greedy.json")),
    ];
    for c in candidates.into_iter().flatten() {
        if let Ok(text) = std::fs::read_to_string(&c) {
            return serde_json::from_str(&text).expect("reference JSON parses");
        }
    }
    panic!("smollm2-greedy.json not found (set PAGODA_REFERENCE)");
}

/// A running server; killed on drop.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub key: Option<String>,
    log: PathBuf,
    agent: ureq::Agent,
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("binding an ephemeral port");
    l.local_addr().unwrap().port()
}

impl Server {
    /// Starts `pagoda serve` with extra flags and waits until `/health` answers 200.
    pub fn start(extra: &[&str]) -> Server {
        Self::start_with_env(extra, &[])
    }

    /// [`Server::start`] with extra environment variables.
    pub fn start_with_env(extra: &[&str], envs: &[(&str, &str)]) -> Server {
        Self::start_full(extra, envs, None)
    }

    /// [`Server::start`] with the server's open-file limit (soft and hard) set to `nofile`.
    pub fn start_with_nofile(extra: &[&str], nofile: u32) -> Server {
        Self::start_full(extra, &[], Some(nofile))
    }

    fn start_full(extra: &[&str], envs: &[(&str, &str)], nofile: Option<u32>) -> Server {
        let model = model_path();
        let key = extra
            .windows(2)
            .find(|w| w[0] == "--api-key")
            .map(|w| w[1].to_string());
        for _attempt in 0..3 {
            let port = free_port();
            let log =
                std::env::temp_dir().join(format!("pagoda-test-{}-{port}.log", std::process::id()));
            let logf = std::fs::File::create(&log).expect("creating the server log");
            let bin = env!("CARGO_BIN_EXE_pagoda");
            let mut cmd = match nofile {
                // `ulimit -n` in sh sets the soft and the hard limit.
                Some(n) => {
                    let mut c = Command::new("sh");
                    c.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\""), bin]);
                    c
                }
                None => Command::new(bin),
            };
            let child = cmd
                .args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()])
                .arg("--model")
                .arg(&model)
                .args(extra)
                .env_remove("PAGODA_API_KEY")
                .envs(envs.iter().copied())
                .stdout(Stdio::null())
                .stderr(logf)
                .spawn()
                .expect("spawning the pagoda binary");
            let agent = ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(5))
                .timeout_read(Duration::from_secs(300))
                .build();
            let mut s = Server {
                child,
                base: format!("http://127.0.0.1:{port}"),
                key: key.clone(),
                log,
                agent,
            };
            if s.wait_healthy() {
                return s;
            }
            eprintln!("server did not come up; log:\n{}", s.log_text());
        }
        panic!("could not start the server");
    }

    fn wait_healthy(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(300);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok((200, _)) = self.try_get("/health") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn auth(&self, r: ureq::Request) -> ureq::Request {
        match &self.key {
            Some(k) => r.set("Authorization", &format!("Bearer {k}")),
            None => r,
        }
    }

    fn finish(r: Result<ureq::Response, ureq::Error>) -> Result<(u16, String), String> {
        match r {
            Ok(resp) => {
                let s = resp.status();
                Ok((s, resp.into_string().map_err(|e| e.to_string())?))
            }
            Err(ureq::Error::Status(code, resp)) => {
                Ok((code, resp.into_string().unwrap_or_default()))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    pub fn try_get(&self, path: &str) -> Result<(u16, String), String> {
        Self::finish(self.auth(self.agent.get(&self.url(path))).call())
    }

    /// GET with the key (if any); panics on transport errors.
    pub fn get(&self, path: &str) -> (u16, String) {
        self.try_get(path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// GET without any Authorization header.
    pub fn get_no_auth(&self, path: &str, header: Option<&str>) -> (u16, String) {
        let mut r = self.agent.get(&self.url(path));
        if let Some(h) = header {
            r = r.set("Authorization", h);
        }
        Self::finish(r.call()).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// POST a raw body (any bytes) with the key.
    pub fn post_raw(&self, path: &str, body: &[u8]) -> (u16, String) {
        let r = self
            .auth(self.agent.post(&self.url(path)))
            .set("Content-Type", "application/json");
        Self::finish(r.send_bytes(body)).unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }

    /// POST JSON; returns the status and the parsed JSON body.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (s, text) = self.post_raw(path, body.to_string().as_bytes());
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("POST {path} -> {s}: non-JSON body {text:?}: {e}"));
        (s, v)
    }

    /// POST JSON and expect 200.
    pub fn post_ok(&self, path: &str, body: &Value) -> Value {
        let (s, v) = self.post(path, body);
        assert_eq!(s, 200, "POST {path} {body} -> {v}");
        v
    }

    /// Opens a streaming POST; the caller reads events from it.
    pub fn open_stream(&self, path: &str, body: &Value) -> SseReader {
        let r = self
            .auth(self.agent.post(&self.url(path)))
            .set("Content-Type", "application/json");
        let resp = r
            .send_string(&body.to_string())
            .unwrap_or_else(|e| panic!("POST {path} (stream): {e}"));
        assert_eq!(resp.status(), 200);
        assert!(
            resp.content_type().starts_with("text/event-stream"),
            "content type {}",
            resp.content_type()
        );
        SseReader {
            lines: BufReader::new(resp.into_reader()),
            done: false,
        }
    }

    /// Streams a request to the end: every JSON event, and whether `[DONE]` came last.
    pub fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let mut r = self.open_stream(path, body);
        let mut events = Vec::new();
        while let Some(e) = r.next_event() {
            events.push(e);
        }
        assert!(r.done, "the stream ended without data: [DONE]");
        events
    }

    /// Streams a request whose body ends without `[DONE]` (Responses,
    /// Messages): every JSON event up to the end of the body.
    pub fn stream_typed(&self, path: &str, body: &Value) -> Vec<Value> {
        let mut r = self.open_stream(path, body);
        let mut events = Vec::new();
        while let Some(e) = r.next_event() {
            events.push(e);
        }
        assert!(!r.done, "typed streams send no [DONE]");
        events
    }

    /// Polls `/metrics` until `pred` holds for it (bounded), returning the last text.
    pub fn wait_metrics(&self, pred: impl Fn(&str) -> bool) -> String {
        let mut text = String::new();
        for _ in 0..300 {
            text = self.get("/metrics").1;
            if pred(&text) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        text
    }

    /// Waits (bounded) until every `(metric, value)` pair holds, then asserts them all.
    pub fn expect_metrics(&self, want: &[(&str, f64)]) -> String {
        let text = self.wait_metrics(|m| want.iter().all(|&(n, v)| metric(m, n) == Some(v)));
        for &(n, v) in want {
            assert_eq!(metric(&text, n), Some(v), "{n}\n{text}");
        }
        text
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Reads `data: ...` events from an SSE body.
pub struct SseReader {
    lines: BufReader<Box<dyn Read + Send + Sync + 'static>>,
    /// Set once `data: [DONE]` was read.
    pub done: bool,
}

impl SseReader {
    /// The next JSON event; None after `[DONE]` or at the end of the body.
    pub fn next_event(&mut self) -> Option<Value> {
        if self.done {
            return None;
        }
        let mut line = String::new();
        loop {
            line.clear();
            if self.lines.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let l = line.trim_end_matches(['\r', '\n']);
            // Blank lines end events; `:` lines are comments (keep-alives);
            // `event:` names a typed event (Responses, Messages), whose data has a `type`.
            if l.is_empty() || l.starts_with(':') || l.starts_with("event: ") {
                continue;
            }
            let data = l
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data line: {l:?}"));
            if data == "[DONE]" {
                self.done = true;
                return None;
            }
            return Some(
                serde_json::from_str(data).unwrap_or_else(|e| panic!("bad SSE JSON {data:?}: {e}")),
            );
        }
    }
}

/// The value of a metric sample line `name{...} value` (the first that matches).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Checks an error answer: the status and the four-field error object.
pub fn assert_error(status: u16, body: &str, want: u16, what: &str) {
    assert_eq!(
        status, want,
        "{what}: expected {want}, got {status} with {body}"
    );
    let v: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {body}"));
    let e = &v["error"];
    assert!(
        e["message"].is_string() && !e["message"].as_str().unwrap().is_empty(),
        "{what}: no message in {v}"
    );
    assert!(e["type"].is_string(), "{what}: no type in {v}");
    assert!(e.get("param").is_some(), "{what}: no param in {v}");
    assert_eq!(e["code"], want, "{what}: code in {v}");
}
