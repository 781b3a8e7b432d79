//! A minimal streaming HTTP/1.1 client for OpenAI-compatible completions, built on
//! hyper, that timestamps every server-sent event as it arrives.

use crate::error::BenchError;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::{Duration, Instant};

/// One benchmark request's outcome and timings (seconds).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RequestResult {
    pub ok: bool,
    pub error: Option<String>,
    /// When the request was sent, relative to the start of its concurrency level.
    pub start_s: f64,
    /// Time to the first chunk carrying a generated token.
    pub ttft_s: f64,
    /// Gaps between successive token chunks.
    pub itl_s: Vec<f64>,
    pub e2e_s: f64,
    pub prompt_tokens: usize,
    /// From `usage.completion_tokens` when the server reports it, else counted chunks.
    pub output_tokens: usize,
    /// Token chunks received.
    pub chunks: usize,
}

/// HTTP client for one benchmark run.
pub struct BenchClient {
    http: Client<HttpConnector, Full<Bytes>>,
    /// `scheme://authority`, no trailing slash.
    origin: String,
    /// Path prefix of the base URL (e.g. `""` or `/v1` stripped of its end slash).
    prefix: String,
    api_key: Option<String>,
    new_connection_per_request: bool,
    timeout: Duration,
}

impl BenchClient {
    /// `base_url` is `http://host:port` (optionally with a path prefix, a trailing
    /// `/v1` is dropped since endpoints include it).
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        new_connection_per_request: bool,
        timeout: Duration,
    ) -> Result<Self, BenchError> {
        let bad = |reason: &str| BenchError::BadUrl {
            url: base_url.to_string(),
            reason: reason.to_string(),
        };
        let uri: Uri = base_url
            .parse()
            .map_err(|e: hyper::http::uri::InvalidUri| bad(&e.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(bad(&format!(
                    "scheme {other:?} unsupported (plain http only)"
                )))
            }
            None => return Err(bad("missing http:// scheme")),
        }
        let authority = uri
            .authority()
            .ok_or_else(|| bad("missing host"))?
            .to_string();
        let mut prefix = uri.path().trim_end_matches('/').to_string();
        if prefix.ends_with("/v1") {
            prefix.truncate(prefix.len() - 3);
        }
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let mut b = Client::builder(TokioExecutor::new());
        if new_connection_per_request {
            // Nothing idles in the pool: every request dials afresh.
            b.pool_max_idle_per_host(0);
        }
        Ok(BenchClient {
            http: b.build(conn),
            origin: format!("http://{authority}"),
            prefix,
            api_key,
            new_connection_per_request,
            timeout,
        })
    }

    fn uri(&self, path: &str) -> String {
        format!("{}{}{}", self.origin, self.prefix, path)
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Request<Full<Bytes>>, BenchError> {
        let mut r = Request::builder().method(method).uri(self.uri(path));
        if body.is_some() {
            r = r.header(CONTENT_TYPE, "application/json");
        }
        if let Some(k) = &self.api_key {
            r = r.header(AUTHORIZATION, format!("Bearer {k}"));
        }
        if self.new_connection_per_request {
            r = r.header(CONNECTION, HeaderValue::from_static("close"));
        }
        r.body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| BenchError::Transport(e.to_string()))
    }

    /// GET a JSON document (e.g. `/v1/models`).
    pub async fn get_json(&self, path: &str) -> Result<Value, BenchError> {
        let req = self.request(Method::GET, path, None)?;
        let fut = async {
            let resp = self
                .http
                .request(req)
                .await
                .map_err(|e| BenchError::Transport(format!("{e:#}")))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| BenchError::Transport(e.to_string()))?
                .to_bytes();
            if !status.is_success() {
                return Err(BenchError::Status {
                    status: status.as_u16(),
                    body: snippet(&body),
                });
            }
            serde_json::from_slice(&body).map_err(|e| BenchError::BadEvent {
                detail: e.to_string(),
            })
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| BenchError::Timeout {
                secs: self.timeout.as_secs_f64(),
            })?
    }

    /// POSTs a streaming completion and records the timings. Never fails: errors
    /// land in the result.
    pub async fn stream_completion(&self, body: &Value, level_start: Instant) -> RequestResult {
        let sent = Instant::now();
        let mut r = RequestResult {
            start_s: (sent - level_start).as_secs_f64(),
            ..Default::default()
        };
        let out = tokio::time::timeout(self.timeout, self.stream_inner(body, sent, &mut r)).await;
        r.e2e_s = sent.elapsed().as_secs_f64();
        let res = match out {
            Err(_) => Err(BenchError::Timeout {
                secs: self.timeout.as_secs_f64(),
            }),
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) if r.chunks == 0 => Err(BenchError::NoTokens),
            Ok(Ok(())) => Ok(()),
        };
        match res {
            Ok(()) => r.ok = true,
            Err(e) => r.error = Some(e.to_string()),
        }
        r
    }

    async fn stream_inner(
        &self,
        body: &Value,
        sent: Instant,
        r: &mut RequestResult,
    ) -> Result<(), BenchError> {
        let bytes = serde_json::to_vec(body).map_err(|e| BenchError::Transport(e.to_string()))?;
        let req = self.request(Method::POST, "/v1/completions", Some(bytes))?;
        let resp = self
            .http
            .request(req)
            .await
            .map_err(|e| BenchError::Transport(format!("{e:#}")))?;
        let status = resp.status();
        let mut body = resp.into_body();
        if !status.is_success() {
            let b = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            return Err(BenchError::Status {
                status: status.as_u16(),
                body: snippet(&b),
            });
        }
        let mut parser = SseParser::default();
        let mut last: Option<Instant> = None;
        let mut usage_tokens: Option<usize> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| BenchError::Transport(e.to_string()))?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            let now = Instant::now();
            for ev in parser.push(data) {
                match classify(&ev)? {
                    Event::Done => return finish(r, usage_tokens),
                    Event::Other => {}
                    Event::Chunk { usage, token } => {
                        if let Some((p, c)) = usage {
                            r.prompt_tokens = p;
                            usage_tokens = Some(c);
                        }
                        if token {
                            match last {
                                None => r.ttft_s = (now - sent).as_secs_f64(),
                                Some(t) => r.itl_s.push((now - t).as_secs_f64()),
                            }
                            last = Some(now);
                            r.chunks += 1;
                        }
                    }
                }
            }
        }
        finish(r, usage_tokens)
    }
}

fn finish(r: &mut RequestResult, usage_tokens: Option<usize>) -> Result<(), BenchError> {
    r.output_tokens = usage_tokens.unwrap_or(r.chunks);
    Ok(())
}

fn snippet(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    s.chars().take(300).collect()
}

/// Splits a byte stream into server-sent events' `data:` payloads.
#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// Feeds bytes; returns the data payloads of every event completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        // An event ends at a blank line (LF LF or CRLF CRLF).
        while let Some((end, sep)) = find_blank_line(&self.buf) {
            let event: Vec<u8> = self.buf.drain(..end + sep).collect();
            let text = String::from_utf8_lossy(&event[..end]);
            let mut data = String::new();
            for line in text.lines() {
                if let Some(d) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(d.strip_prefix(' ').unwrap_or(d));
                }
            }
            if !data.is_empty() {
                out.push(data);
            }
        }
        out
    }
}

fn find_blank_line(b: &[u8]) -> Option<(usize, usize)> {
    for i in 0..b.len() {
        if b[i..].starts_with(b"\n\n") {
            return Some((i, 2));
        }
        if b[i..].starts_with(b"\r\n\r\n") {
            return Some((i, 4));
        }
    }
    None
}

/// What one `data:` payload means for the benchmark.
#[derive(Debug, PartialEq)]
pub enum Event {
    Done,
    /// `token`: the chunk carries generated text (or is a plain token chunk);
    /// a final chunk with only a finish reason and no text is not a token.
    /// `usage`: (prompt_tokens, completion_tokens) when reported.
    Chunk {
        usage: Option<(usize, usize)>,
        token: bool,
    },
    Other,
}

pub fn classify(data: &str) -> Result<Event, BenchError> {
    let data = data.trim();
    if data == "[DONE]" {
        return Ok(Event::Done);
    }
    let v: Value = serde_json::from_str(data).map_err(|e| BenchError::BadEvent {
        detail: format!("{e}: {}", snippet(data.as_bytes())),
    })?;
    if let Some(err) = v.get("error") {
        return Err(BenchError::ServerEvent(err.to_string()));
    }
    let usage = v.get("usage").filter(|u| !u.is_null()).map(|u| {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
        (n("prompt_tokens"), n("completion_tokens"))
    });
    let token = match v.get("choices").and_then(Value::as_array) {
        Some(cs) if !cs.is_empty() => {
            let c = &cs[0];
            let has_text = c
                .get("text")
                .and_then(Value::as_str)
                .is_some_and(|t| !t.is_empty());
            let finished = c.get("finish_reason").is_some_and(|f| !f.is_null());
            has_text || !finished
        }
        _ => false,
    };
    if usage.is_none() && !token {
        return Ok(Event::Other);
    }
    Ok(Event::Chunk { usage, token })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_split_across_frames() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: {\"a\"").is_empty());
        assert_eq!(
            p.push(b":1}\n\ndata: [DONE]\r\n\r\n"),
            vec!["{\"a\":1}".to_string(), "[DONE]".to_string()]
        );
        assert!(p.push(b": comment\n\n").is_empty());
    }

    #[test]
    fn classify_chunks() {
        assert_eq!(classify("[DONE]").unwrap(), Event::Done);
        let tok = r#"{"choices":[{"index":0,"text":"hi","finish_reason":null}]}"#;
        assert_eq!(
            classify(tok).unwrap(),
            Event::Chunk {
                usage: None,
                token: true
            }
        );
        let fin = r#"{"choices":[{"index":0,"text":"","finish_reason":"length"}]}"#;
        assert_eq!(classify(fin).unwrap(), Event::Other);
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}"#;
        assert_eq!(
            classify(usage).unwrap(),
            Event::Chunk {
                usage: Some((3, 7)),
                token: false
            }
        );
        assert!(matches!(
            classify(r#"{"error":{"message":"x"}}"#),
            Err(BenchError::ServerEvent(_))
        ));
        assert!(classify("not json").is_err());
    }

    #[test]
    fn base_url_forms() {
        let t = Duration::from_secs(1);
        let c = BenchClient::new("http://127.0.0.1:8000/v1/", None, false, t).unwrap();
        assert_eq!(
            c.uri("/v1/completions"),
            "http://127.0.0.1:8000/v1/completions"
        );
        let c = BenchClient::new("http://h:1/proxy", None, false, t).unwrap();
        assert_eq!(c.uri("/v1/models"), "http://h:1/proxy/v1/models");
        assert!(BenchClient::new("https://h", None, false, t).is_err());
        assert!(BenchClient::new("127.0.0.1:8000", None, false, t).is_err());
    }
}
