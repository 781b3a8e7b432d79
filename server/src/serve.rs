//! `pagoda serve`: the OpenAI-compatible HTTP server (axum + tokio).
//!
//! The engine runs on its own thread behind an
//! [`EngineHandle`](pagoda_engine::EngineHandle); handlers only parse, validate,
//! tokenize and submit, then stream the request's outputs back.
//! Routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models`, `/health`,
//! `/ping`, `/version`, `/metrics`, `/tokenize`, `/detokenize`, `/load`,
//! `/invocations`, `/v1/chat/completions/batch`, and `/tokenizer_info` behind its
//! flag ([`frontend`]).
//!
//! Shutdown on SIGINT/SIGTERM: stop accepting, let in-flight requests finish for
//! up to `--shutdown-timeout`
//! ([`SHUTDOWN_GRACE`](crate::args::frontend::SHUTDOWN_GRACE) by default), then
//! abort what is left and exit cleanly; a second signal ends the grace period at
//! once.
//!
//! Connections are served by [`conn`] (timeouts, a connection cap); handlers parse
//! and tokenize on a bounded blocking pool ([`AppState::offload`]), never on the
//! async worker threads that also answer `/health`.

pub mod bridge;
pub mod chat;
pub mod conn;
pub mod defaults;
pub mod error;
pub mod format;
pub mod frontend;
pub mod handlers;
pub mod kv_events;
pub mod limits;
pub mod messages;
pub mod metrics;
pub mod protocol;
pub mod reasoning;
pub mod responses;
pub mod shape;
pub mod sleep;
pub mod state;
pub mod stream;
pub mod tools;

use crate::args::frontend::secs;
use crate::args::{SchedulingPolicyArg, ServeArgs};
use anyhow::Context;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use state::cpu_pool_size;
use std::sync::Arc;
use std::time::Duration;

// `serve::AppState` stays the shared state's public path (the module doc's links
// too); it lives in [`state`], below the handlers that use it.
pub use state::AppState;

/// The full router over a started engine.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.max_body_bytes;
    let mut r = Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve))
        .route("/v1/messages", post(messages::create))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route(
            "/v1/chat/completions/batch",
            post(frontend::batch_chat_completions),
        )
        .route("/invocations", post(frontend::invocations))
        .route("/v1/models", get(handlers::models))
        .route("/health", get(handlers::health))
        .route("/ping", get(handlers::health).post(handlers::health))
        .route("/load", get(frontend::load))
        .route("/version", get(handlers::version))
        .route("/metrics", get(handlers::metrics))
        .route("/tokenize", post(handlers::tokenize))
        .route("/detokenize", post(handlers::detokenize));
    if state.tokenizer_info_endpoint {
        r = r.route("/tokenizer_info", get(frontend::tokenizer_info));
    }
    if state.dev_endpoints {
        r = r
            .route("/reset_prefix_cache", post(kv_events::reset_prefix_cache))
            .route("/sleep", post(sleep::sleep))
            .route("/wake_up", post(sleep::wake_up))
            .route("/is_sleeping", get(sleep::is_sleeping));
    }
    r.fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            conn::read_body_with_timeout,
        ))
        .layer(middleware::from_fn(require_json))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            reject_declared_oversize,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            frontend::track_load,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            frontend::request_id_header,
        ))
        .with_state(state)
}

/// Paths that stay open when `--api-key` is set (probes and scrapers).
fn is_open_path(path: &str) -> bool {
    matches!(
        path,
        "/health" | "/ping" | "/metrics" | "/version" | "/load"
    )
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
            let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
            let bearer = header(AUTHORIZATION.as_str())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim);
            // Anthropic's clients send `x-api-key` (accepted on every route, as vLLM).
            let given = bearer.or(header("x-api-key").map(str::trim));
            if !given.is_some_and(|g| keys_match(g, key)) {
                if req.uri().path().starts_with("/v1/messages") {
                    return messages::error_response(&ApiError::Unauthorized);
                }
                return ApiError::Unauthorized.into_response();
            }
        }
    }
    next.run(req).await
}

/// A POST body labelled as anything but JSON is refused (415), as vLLM does; an
/// unlabelled one is parsed as JSON.
async fn require_json(req: Request, next: Next) -> Response {
    if req.method() == axum::http::Method::POST {
        if let Some(ct) = req.headers().get(axum::http::header::CONTENT_TYPE) {
            let media = ct
                .to_str()
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            if media != "application/json" && !media.ends_with("+json") {
                return ApiError::UnsupportedMediaType {
                    message: "Unsupported Media Type: Only 'application/json' is allowed".into(),
                }
                .into_response();
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

/// Counts SIGINT/SIGTERM into `tx`: 1 after the first (drain), 2 after the
/// second (stop now).
async fn count_signals(tx: tokio::sync::watch::Sender<u8>) {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    loop {
        #[cfg(unix)]
        let term_recv = async {
            match term.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term_recv = std::future::pending::<()>();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term_recv => {},
        }
        let n = (*tx.borrow()).saturating_add(1).min(2);
        let _ = tx.send(n);
        if n >= 2 {
            return;
        }
    }
}

/// `pagoda serve`: loads the model, starts the engine thread, serves until a signal.
pub fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    args.resolve_model();
    args.engine.log_compat_notes();
    let model_path = args.engine.model_path();
    // Flag values that can be wrong are checked before the model loads.
    let chat_template_source = args
        .chat_template
        .as_deref()
        .map(frontend::load_chat_template)
        .transpose()?;
    let generation_defaults =
        defaults::GenerationDefaults::load(&args.generation_config, &model_path)?;
    if args.max_logprobs != usize::MAX && args.max_logprobs > pagoda_core::request::MAX_LOGPROBS {
        anyhow::bail!(
            "--max-logprobs {} is above what the engine computes ({})",
            args.max_logprobs,
            pagoda_core::request::MAX_LOGPROBS
        );
    }
    let (tool_parser, reasoning_parser) = parsers_from_flags(&args)?;
    let config = args.engine.engine_config();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pagoda-http")
        .build()
        .context("building the tokio runtime")?;
    let handle = crate::data_parallel::start_engines(&args, config, &runtime)?;
    let mut names = args.served_model_name.clone().into_iter();
    let mut state = AppState::new(
        handle.clone(),
        names.next(),
        args.api_key.clone(),
        args.max_body_bytes,
    );
    // Every further --served-model-name is accepted (and listed by /v1/models).
    state.served_aliases.extend(names);
    state.model_aliases.extend(state.served_aliases.clone());
    if args.served_model_name.is_empty() {
        // Clients may also name the model by its file name (e.g. with `.gguf`).
        if let Some(f) = model_path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
        {
            if f != state.model_name {
                state.model_aliases.push(f);
            }
        }
    }
    if let Some(source) = chat_template_source {
        let tok = handle.tokenizer();
        let token = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i));
        let t = pagoda_models::ChatTemplate::new(
            source,
            token(tok.bos_token_id()),
            token(handle.model_info().eos_token_ids.first().copied()),
        )
        .context("compiling --chat-template")?;
        tracing::info!("chat template from --chat-template");
        state.chat_template_override = Some(Arc::new(t));
    }
    state.generation_defaults = generation_defaults;
    state.tool_parser = tool_parser;
    state.reasoning_parser = reasoning_parser;
    state.responses_store = responses::store::ResponseStore::new(args.responses_store_size);
    state.max_logprobs = args.max_logprobs;
    state.strict_request_fields = args.strict_request_fields;
    state.request_limits = limits::RequestLimits {
        max_logprob_token_ids: args.max_logprob_token_ids,
        max_logit_bias: args.max_logit_bias,
        max_bad_words: args.max_bad_words,
    };
    state.stop_limits = limits::StopLimits {
        max_count: args.max_stop_strings,
        max_len: args.max_stop_string_len,
    };
    state.return_tokens_as_token_ids = args.return_tokens_as_token_ids;
    state.force_include_usage = args.enable_force_include_usage;
    state.request_id_headers = args.enable_request_id_headers;
    state.server_load_tracking = args.enable_server_load_tracking;
    state.log_requests = args.log_requests();
    state.tokenizer_info_endpoint = args.enable_tokenizer_info_endpoint;
    state.dev_endpoints = std::env::var("VLLM_SERVER_DEV_MODE").is_ok_and(|v| v == "1");
    state.sleep_mode = args.enable_sleep_mode;
    if state.sleep_mode && !state.dev_endpoints {
        tracing::warn!(
            "--enable-sleep-mode: /sleep, /wake_up and /is_sleeping are served only \
             with VLLM_SERVER_DEV_MODE=1, as in vLLM"
        );
    }
    state.tokenizer_info = frontend::tokenizer_info_json(&state, &model_path);
    state.max_seqs_per_request = args
        .max_seqs_per_request
        .unwrap_or(args.engine.max_num_seqs);
    state.priority_scheduling = args.engine.scheduling_policy == SchedulingPolicyArg::Priority;
    state.body_read_timeout = secs(args.body_read_timeout);
    state.metrics.set_cache_config(metrics::CacheConfigInfo {
        block_size: args.engine.block_size,
        gpu_memory_utilization: args
            .engine
            .gpu_memory_utilization
            .unwrap_or(crate::args::DEFAULT_GPU_MEMORY_UTILIZATION),
        cache_dtype: args.engine.kv_cache_dtype.to_string(),
        enable_prefix_caching: !args.engine.no_enable_prefix_caching,
        num_gpu_blocks: handle.model_info().num_kv_blocks,
    });
    let limits = args.conn_limits();
    tracing::info!(
        "connections: at most {} (+{} for probes), keep-alive {:?}, header read {:?}, body read {:?}",
        limits.max_connections,
        limits.probe_headroom,
        limits.keep_alive,
        limits.header_read,
        limits.body_read
    );
    let state = Arc::new(state);
    let grace = args.shutdown_grace();
    let result = runtime.block_on(serve(args.host.clone(), args.port, state, limits, grace));
    // Whatever is still running (after the grace period) is aborted here.
    handle.shutdown(true);
    runtime.shutdown_timeout(Duration::from_secs(1));
    if result.is_ok() {
        tracing::info!("server stopped");
    }
    result
}

/// `--enable-auto-tool-choice`, `--tool-call-parser` and `--reasoning-parser`,
/// checked before the model loads, with vLLM's rules and messages: auto tool
/// choice needs a parser; an unknown name lists the registered ones.
type Parsers = (
    Option<&'static dyn tools::ToolParser>,
    Option<&'static dyn reasoning::ReasoningParser>,
);

fn parsers_from_flags(args: &ServeArgs) -> anyhow::Result<Parsers> {
    let tool = match args.tool_call_parser.as_deref() {
        None if args.enable_auto_tool_choice => {
            anyhow::bail!("Error: --enable-auto-tool-choice requires --tool-call-parser")
        }
        None => None,
        Some(name) => Some(tools::lookup(name).ok_or_else(|| {
            anyhow::anyhow!(
                "invalid tool call parser: {name} (chose from {{ {} }})",
                tools::names().join(",")
            )
        })?),
    };
    if tool.is_some() && !args.enable_auto_tool_choice {
        tracing::warn!(
            "--tool-call-parser without --enable-auto-tool-choice: tool_choice \"auto\" stays off"
        );
    }
    let reasoning = match args.reasoning_parser.as_deref() {
        None => None,
        Some(name) => Some(reasoning::lookup(name).ok_or_else(|| {
            anyhow::anyhow!(
                "invalid reasoning parser: {name} (chose from {{ {} }})",
                reasoning::names().join(",")
            )
        })?),
    };
    Ok((tool.filter(|_| args.enable_auto_tool_choice), reasoning))
}

/// Returns freed heap pages to the OS once the server is idle after a large body
/// (glibc keeps them otherwise: an 8 MB prompt left ~1 GB resident).
async fn trim_when_idle(state: Arc<AppState>) {
    use std::sync::atomic::Ordering;
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        let s = state.engine.stats();
        let idle = s.num_running + s.num_waiting == 0
            && state.cpu_pool.available_permits() == cpu_pool_size();
        if idle && state.needs_trim.swap(false, Ordering::AcqRel) {
            let _ = tokio::task::spawn_blocking(pagoda_engine::release_freed_memory).await;
        }
    }
}

/// Binds, serves, and on a signal lets in-flight requests run on for up to `grace`
/// (see [`SHUTDOWN_GRACE`](crate::args::frontend::SHUTDOWN_GRACE)).
pub async fn serve(
    host: String,
    port: u16,
    state: Arc<AppState>,
    limits: conn::ConnLimits,
    grace: Duration,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind((host.as_str(), port))
        .await
        .with_context(|| format!("binding {host}:{port}"))?;
    let addr = listener.local_addr()?;
    tracing::info!(
        "serving model `{}` on http://{addr} (backend: {})",
        state.model_name,
        state.engine.model_info().attention
    );
    let (sig_tx, sig_rx) = tokio::sync::watch::channel(0u8);
    let mut log_rx = sig_rx.clone();
    tokio::spawn(count_signals(sig_tx));
    tokio::spawn(async move {
        if log_rx.wait_for(|&s| s >= 1).await.is_ok() {
            tracing::info!(
                "shutdown signal: no new connections; finishing in-flight requests (up to {grace:?}; a second signal stops at once)"
            );
        }
    });
    let trimmer = tokio::spawn(trim_when_idle(state.clone()));
    let app = router(state.clone());
    let server = conn::serve(listener, app, limits, sig_rx.clone());
    let mut server = std::pin::pin!(server);
    let mut grace_rx = sig_rx;
    tokio::select! {
        _ = &mut server => {},
        _ = async {
            let _ = grace_rx.wait_for(|&s| s >= 1).await;
            tokio::select! {
                _ = tokio::time::sleep(grace) => {},
                _ = grace_rx.wait_for(|&s| s >= 2) => {},
            }
        } => {
            tracing::warn!("grace period over: aborting in-flight requests");
            let engine = state.engine.clone();
            // Aborted requests end their streams (503 / an error event), so connections close.
            let _ = tokio::task::spawn_blocking(move || engine.shutdown(true)).await;
            let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        }
    }
    trimmer.abort();
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
