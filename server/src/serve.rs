//! `pagoda serve`: the OpenAI-compatible HTTP server (axum + tokio).
//!
//! The engine runs on its own thread behind an [`EngineHandle`]; handlers only
//! parse, validate, tokenize and submit, then stream the request's outputs back.
//! Routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models`, `/health`,
//! `/version`, `/metrics`, `/tokenize`, `/detokenize`.
//!
//! Shutdown on SIGINT/SIGTERM: stop accepting, let in-flight requests finish for
//! up to [`SHUTDOWN_GRACE`], then abort what is left and exit cleanly.

pub mod error;
pub mod format;
pub mod handlers;
pub mod metrics;
pub mod protocol;
pub mod stream;

use crate::args::ServeArgs;
use anyhow::Context;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use metrics::Metrics;
use pagoda_engine::{EngineHandle, LLMEngine};
use std::sync::Arc;
use std::time::Duration;

/// How long in-flight requests may run on after a shutdown signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// [`SHUTDOWN_GRACE`], unless `PAGODA_SHUTDOWN_GRACE_SECS` overrides it.
fn shutdown_grace() -> Duration {
    std::env::var("PAGODA_SHUTDOWN_GRACE_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(SHUTDOWN_GRACE)
}

/// What every handler shares.
pub struct AppState {
    pub engine: EngineHandle,
    /// The name clients must use in `model` (and that `/v1/models` lists).
    pub model_name: String,
    /// Other names accepted in `model` (without `--served-model-name`: the model's
    /// file name, e.g. with its `.gguf` extension).
    pub model_aliases: Vec<String>,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    pub metrics: Arc<Metrics>,
    /// Server start, reported as the model's `created`.
    pub created: u64,
}

impl AppState {
    pub fn new(
        engine: EngineHandle,
        served_model_name: Option<String>,
        api_key: Option<String>,
        max_body_bytes: usize,
    ) -> Self {
        let model_name = served_model_name.unwrap_or_else(|| engine.model_info().name.clone());
        AppState {
            engine,
            model_name,
            model_aliases: Vec::new(),
            api_key: api_key.filter(|k| !k.is_empty()),
            max_body_bytes,
            metrics: Arc::new(Metrics::default()),
            created: handlers::unix_now(),
        }
    }
}

/// The full router over a started engine.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.max_body_bytes;
    Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/models", get(handlers::models))
        .route("/health", get(handlers::health))
        .route("/version", get(handlers::version))
        .route("/metrics", get(handlers::metrics))
        .route("/tokenize", post(handlers::tokenize))
        .route("/detokenize", post(handlers::detokenize))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            reject_declared_oversize,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .with_state(state)
}

/// Paths that stay open when `--api-key` is set (probes and scrapers).
fn is_open_path(path: &str) -> bool {
    matches!(path, "/health" | "/metrics" | "/version")
}

/// Compares without an early exit, so the key does not leak through timing.
fn keys_match(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    let mut diff = a.len() ^ b.len();
    for (i, &x) in b.iter().enumerate() {
        diff |= (x ^ a.get(i).copied().unwrap_or(0)) as usize;
    }
    diff == 0
}

async fn require_api_key(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        if !is_open_path(req.uri().path()) {
            let given = req
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim);
            if !given.is_some_and(|g| keys_match(g, key)) {
                return ApiError::Unauthorized.into_response();
            }
        }
    }
    next.run(req).await
}

/// Most bytes of an oversized body read and discarded before its 413 is sent.
const DRAIN_MAX_BYTES: u64 = 64 << 20;
/// Longest wait for that drain.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Answers a body whose declared `Content-Length` is over the limit with 413 after
/// reading (and discarding) what the client sends, as nginx's lingering close does:
/// answering first and closing would reset a client that is still writing, which
/// then sees a broken pipe instead of the error. Bodies too big even to drain, and
/// chunked ones, get the 413 from the body limit as they are read.
async fn reject_declared_oversize(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > st.max_body_bytes as u64 => {
            if n <= DRAIN_MAX_BYTES {
                use futures::StreamExt;
                let mut data = req.into_body().into_data_stream();
                let drain = async { while let Some(Ok(_)) = data.next().await {} };
                let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
            }
            ApiError::PayloadTooLarge {
                limit: st.max_body_bytes,
            }
            .into_response()
        }
        _ => next.run(req).await,
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// `pagoda serve`: loads the model, starts the engine thread, serves until a signal.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = args.engine.engine_config();
    tracing::info!("loading model {}", config.model_path.display());
    let engine = LLMEngine::new(config).context("starting the engine")?;
    let handle = EngineHandle::start(engine, args.max_waiting_requests);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pagoda-http")
        .build()
        .context("building the tokio runtime")?;
    let mut state = AppState::new(
        handle.clone(),
        args.served_model_name.clone(),
        args.api_key.clone(),
        args.max_body_bytes,
    );
    if args.served_model_name.is_none() {
        // Clients may also name the model by its file name (e.g. with `.gguf`).
        let path = args.engine.model_path();
        if let Some(f) = path.file_name().map(|f| f.to_string_lossy().into_owned()) {
            if f != state.model_name {
                state.model_aliases.push(f);
            }
        }
    }
    let state = Arc::new(state);
    let result = runtime.block_on(serve(args.host.clone(), args.port, state));
    // Whatever is still running (after the grace period) is aborted here.
    handle.shutdown(true);
    runtime.shutdown_timeout(Duration::from_secs(1));
    if result.is_ok() {
        tracing::info!("server stopped");
    }
    result
}

/// Binds, serves, and on a signal drains gracefully (see [`SHUTDOWN_GRACE`]).
pub async fn serve(host: String, port: u16, state: Arc<AppState>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind((host.as_str(), port))
        .await
        .with_context(|| format!("binding {host}:{port}"))?;
    let addr = listener.local_addr()?;
    tracing::info!(
        "serving model `{}` on http://{addr} (backend: {})",
        state.model_name,
        state.engine.model_info().attention
    );
    let grace = shutdown_grace();
    let (sig_tx, sig_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!(
            "shutdown signal: no new connections; finishing in-flight requests (up to {grace:?})"
        );
        let _ = sig_tx.send(true);
    });
    let mut graceful_rx = sig_rx.clone();
    let app = router(state.clone());
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = graceful_rx.wait_for(|&s| s).await;
    });
    let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
    let mut grace_rx = sig_rx;
    tokio::select! {
        r = &mut server => r.context("serving")?,
        _ = async { let _ = grace_rx.wait_for(|&s| s).await; tokio::time::sleep(grace).await } => {
            tracing::warn!("grace period over: aborting in-flight requests");
            let engine = state.engine.clone();
            // Aborted requests end their streams, so connections can close.
            let _ = tokio::task::spawn_blocking(move || engine.shutdown(true)).await;
            let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_comparison() {
        assert!(keys_match("abc", "abc"));
        assert!(!keys_match("abd", "abc"));
        assert!(!keys_match("ab", "abc"));
        assert!(!keys_match("abcd", "abc"));
        assert!(!keys_match("", "abc"));
    }

    #[test]
    fn probes_stay_open() {
        assert!(is_open_path("/health") && is_open_path("/metrics"));
        assert!(!is_open_path("/v1/completions") && !is_open_path("/tokenize"));
    }
}
