//! vLLM's frontend extras: `--chat-template` loading, the `X-Request-Id` and
//! server-load middlewares, and the `/load`, `/tokenizer_info`, `/invocations`
//! and `/v1/chat/completions/batch` routes. The request defaults from
//! `generation_config.json` (`--generation-config`) are [`super::defaults`]'s.

use super::error::ApiError;
use super::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `--chat-template`: a file's contents, or the argument itself when it is no
/// file and looks like Jinja (vLLM's rule: it has `{`, `}` or a newline; escapes
/// such as `\n` are decoded).
pub fn load_chat_template(arg: &str) -> anyhow::Result<String> {
    match std::fs::read_to_string(arg) {
        Ok(text) => Ok(text),
        Err(e) => {
            if !arg.contains(['{', '}', '\n']) {
                anyhow::bail!(
                    "--chat-template: the supplied chat template ({arg}) looks like a file path, but it failed to be opened: {e}"
                );
            }
            Ok(unescape(arg))
        }
    }
}

/// Python's `unicode_escape` for the common escapes (`\n`, `\t`, `\r`, `\\`, quotes).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some('\'') => out.push('\''),
            Some('"') => out.push('"'),
            Some(o) => {
                out.push('\\');
                out.push(o);
            }
            None => out.push('\\'),
        }
    }
    out
}

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `--enable-request-id-headers`: the response carries the request's
/// `X-Request-Id`, or a fresh 32-hex-digit one (as vLLM's `uuid4().hex`).
pub async fn request_id_header(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    if !st.request_id_headers {
        return next.run(req).await;
    }
    let id = req
        .headers()
        .get(&X_REQUEST_ID)
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&fresh_request_id()).expect("hex is a valid header")
        });
    let mut resp = next.run(req).await;
    resp.headers_mut().insert(X_REQUEST_ID, id);
    resp
}

/// 32 hex digits, unpredictable and unique in practice (vLLM's `uuid4().hex`):
/// std's randomly keyed SipHash over a process-wide counter and the clock.
fn fresh_request_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let half = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u64(n);
        h.write_u128(nanos);
        h.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

/// Routes whose requests `/load` counts (vLLM's `load_aware_call` ones that exist here).
fn is_load_tracked(path: &str) -> bool {
    matches!(
        path,
        "/v1/completions" | "/v1/chat/completions" | "/v1/chat/completions/batch" | "/invocations"
    )
}

/// Decrements the in-flight count when the response (its body too) is done.
struct LoadGuard(Arc<AppState>);

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.0.server_load.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `--enable-server-load-tracking`: counts generation requests from arrival until
/// their response body (a stream too) has been sent or dropped.
pub async fn track_load(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if !st.server_load_tracking || !is_load_tracked(req.uri().path()) {
        return next.run(req).await;
    }
    st.server_load.fetch_add(1, Ordering::AcqRel);
    let guard = LoadGuard(st.clone());
    let resp = next.run(req).await;
    let (parts, body) = resp.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _ = &guard;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// `GET /load`: `{"server_load": N}`, the generation requests in flight (always 0
/// without `--enable-server-load-tracking`, as in vLLM).
pub async fn load(State(st): State<Arc<AppState>>) -> Response {
    Json(json!({"server_load": st.server_load.load(Ordering::Acquire)})).into_response()
}

/// `GET /tokenizer_info` (`--enable-tokenizer-info-endpoint`): the tokenizer's
/// configuration as `tokenizer_config.json` has it (vLLM's `TokenizerInfoResponse`:
/// `tokenizer_class`, the special tokens, `model_max_length`, `chat_template`...).
pub async fn tokenizer_info(State(st): State<Arc<AppState>>) -> Response {
    Json(st.tokenizer_info.clone()).into_response()
}

/// Builds the `/tokenizer_info` object: an HF directory's `tokenizer_config.json`
/// (less its file paths) when there is one, otherwise what the GGUF metadata says.
pub fn tokenizer_info_json(st: &AppState, model_path: &Path) -> Value {
    let tok = st.engine.tokenizer();
    let info = st.engine.model_info();
    let mut config = serde_json::Map::new();
    let file = model_path.join("tokenizer_config.json");
    if model_path.is_dir() {
        if let Some(Value::Object(m)) = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
        {
            config = m;
        }
    }
    config.remove("vocab_file");
    config.remove("merges_file");
    let name = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i));
    let bos = name(tok.bos_token_id());
    let eos = name(info.eos_token_ids.first().copied());
    config
        .entry("tokenizer_class")
        .or_insert_with(|| json!("PreTrainedTokenizerFast"));
    config.entry("bos_token").or_insert_with(|| json!(bos));
    config.entry("eos_token").or_insert_with(|| json!(eos));
    config
        .entry("add_bos_token")
        .or_insert_with(|| json!(tok.add_bos()));
    config
        .entry("model_max_length")
        .or_insert_with(|| json!(info.max_model_len));
    if let Some(t) = st.chat_template() {
        config.insert("chat_template".into(), json!(t.source()));
    }
    Value::Object(config)
}

/// `POST /invocations` (SageMaker): routed by the body's shape as vLLM does, a
/// chat request (it has `messages`) first, then a completion (it has `prompt`).
pub async fn invocations(
    state: State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let bytes = match body {
        Ok(b) => b,
        Err(r) => return ApiError::from_body_rejection(r, state.max_body_bytes).into_response(),
    };
    let shape: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return ApiError::BadRequest {
                message: format!("JSON decode error: {e}"),
                param: None,
            }
            .into_response()
        }
    };
    if shape.get("messages").is_some() {
        super::handlers::chat_completions(state, Ok(bytes)).await
    } else if shape.get("prompt").is_some() {
        super::handlers::completions(state, Ok(bytes)).await
    } else {
        ApiError::BadRequest {
            message: "Cannot find suitable handler for request. Expected one of: \
                      ['ChatCompletionRequest', 'CompletionRequest']"
                .into(),
            param: None,
        }
        .into_response()
    }
}

/// `POST /v1/chat/completions/batch` (vLLM's batched chat): `messages` is a list
/// of conversations, answered together in one non-streamed `chat.completion` whose
/// choices are indexed by conversation (times `n`).
pub async fn batch_chat_completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrival = std::time::Instant::now();
    super::handlers::respond(
        async {
            let prep = super::handlers::on_pool(&st, body, prepare_batch_chat).await?;
            st.run(prep, arrival).await
        }
        .await,
    )
}

/// Splits a batched chat body into one chat body per conversation, prepares each
/// as `/v1/chat/completions` would, and joins their prompts.
fn prepare_batch_chat(st: &AppState, body: &[u8]) -> Result<super::handlers::Prepared, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(ApiError::from_json)?;
    if v.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(ApiError::bad(
            "stream",
            "Streaming is not supported for batched chat completions",
        ));
    }
    let convs = match v.get("messages") {
        Some(Value::Array(c)) if !c.is_empty() && c.iter().all(Value::is_array) => c.clone(),
        _ => {
            return Err(ApiError::bad(
                "messages",
                "`messages` must be a non-empty list of conversations (lists of messages)",
            ))
        }
    };
    let mut joined: Option<super::handlers::Prepared> = None;
    for conv in convs {
        let mut one = v.clone();
        one["messages"] = conv;
        let p = super::handlers::prepare_chat(st, one.to_string().as_bytes())?;
        match &mut joined {
            None => joined = Some(p),
            Some(j) => j.prompts.extend(p.prompts),
        }
    }
    joined.ok_or_else(|| ApiError::bad("messages", "no conversation"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_template_file_or_inline() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t.jinja");
        std::fs::write(&f, "{{ messages[0].content }}").unwrap();
        assert_eq!(
            load_chat_template(f.to_str().unwrap()).unwrap(),
            "{{ messages[0].content }}"
        );
        assert_eq!(
            load_chat_template("{% for m in messages %}{{ m.content }}\\n{% endfor %}").unwrap(),
            "{% for m in messages %}{{ m.content }}\n{% endfor %}"
        );
        let e = load_chat_template("/no/such/template.jinja").unwrap_err();
        assert!(e.to_string().contains("looks like a file path"), "{e}");
    }
}
