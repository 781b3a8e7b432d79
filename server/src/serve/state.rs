//! [`AppState`], what every handler shares: the engine handle, the served names,
//! the flags that shape requests, the blocking pool that prepares them.
//!
//! Its own module, below the routes and handlers that read it, so that they
//! depend on it and it on none of them (`serve.rs` builds the router on top; the
//! handlers' own `impl AppState` blocks add their methods from their modules).

use super::defaults::GenerationDefaults;
use super::error::ApiError;
use super::metrics::Metrics;
use super::responses::store::{self, ResponseStore};
use super::{limits, reasoning, tools};
use pagoda_engine::EngineHandle;
use std::sync::Arc;
use std::time::Duration;

/// What every handler shares.
pub struct AppState {
    pub engine: EngineHandle,
    /// The name clients must use in `model` (and that `/v1/models` lists).
    pub model_name: String,
    /// Other names accepted in `model` (without `--served-model-name`: the model's
    /// file name, e.g. with its `.gguf` extension).
    pub model_aliases: Vec<String>,
    /// The further `--served-model-name`s (also in `model_aliases`), which
    /// `/v1/models` lists after the first.
    pub served_aliases: Vec<String>,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    pub metrics: Arc<Metrics>,
    /// Server start, reported as the model's `created`.
    pub created: u64,
    /// Most sequences (prompts x `n`) one request may ask for.
    pub max_seqs_per_request: usize,
    /// Whether requests may set `priority` (`--scheduling-policy priority`).
    pub priority_scheduling: bool,
    /// Bounds the blocking pool that parses and tokenizes request bodies.
    pub cpu_pool: Arc<tokio::sync::Semaphore>,
    /// Set after a large body was handled; the idle trimmer then returns freed
    /// heap pages to the OS.
    pub needs_trim: std::sync::atomic::AtomicBool,
    /// The whole body must arrive within this (`--body-read-timeout`).
    pub body_read_timeout: Duration,
    /// Longest text worth tokenizing: `max_model_len` tokens of the vocabulary's
    /// longest token, twice over for slack (normalizers may shrink text). Longer
    /// prompts cannot fit and are refused before tokenization.
    pub max_prompt_bytes: usize,
    /// `--chat-template`: replaces the model's template.
    pub chat_template_override: Option<Arc<pagoda_models::ChatTemplate>>,
    /// `--generation-config`: defaults for fields a request leaves out.
    pub generation_defaults: GenerationDefaults,
    /// `--max-logprobs`.
    pub max_logprobs: usize,
    /// `--strict-request-fields`: unknown request fields are a 400, not ignored.
    pub strict_request_fields: bool,
    /// `--max-logprob-token-ids`, `--max-logit-bias`, `--max-bad-words`.
    pub request_limits: limits::RequestLimits,
    /// `--max-stop-strings`, `--max-stop-string-len`.
    pub stop_limits: limits::StopLimits,
    /// `--return-tokens-as-token-ids`.
    pub return_tokens_as_token_ids: bool,
    /// `--enable-force-include-usage`.
    pub force_include_usage: bool,
    /// `--enable-request-id-headers`.
    pub request_id_headers: bool,
    /// `--enable-server-load-tracking`, and the count `/load` reports.
    pub server_load_tracking: bool,
    pub server_load: std::sync::atomic::AtomicUsize,
    /// `--enable-tokenizer-info-endpoint`, and what `/tokenizer_info` answers.
    pub tokenizer_info_endpoint: bool,
    pub tokenizer_info: serde_json::Value,
    /// `VLLM_SERVER_DEV_MODE=1`: vLLM's development endpoints (`/reset_prefix_cache`).
    pub dev_endpoints: bool,
    /// `--enable-sleep-mode`: `/sleep` and `/wake_up` act (under the dev endpoints).
    pub sleep_mode: bool,
    /// `--enable-log-requests`.
    pub log_requests: bool,
    /// `--tool-call-parser`, with `--enable-auto-tool-choice` (what `tool_choice:
    /// "auto"` reads the output with; without both, `auto` is a 400 as in vLLM).
    pub tool_parser: Option<&'static dyn tools::ToolParser>,
    /// `--reasoning-parser`.
    pub reasoning_parser: Option<&'static dyn reasoning::ReasoningParser>,
    /// `/v1/responses`' stored responses (`--responses-store-size`).
    pub responses_store: ResponseStore,
}

/// Bodies at least this large mark the heap for trimming once the server is idle.
pub const TRIM_AFTER_BODY_BYTES: usize = 1 << 20;

impl AppState {
    pub fn new(
        engine: EngineHandle,
        served_model_name: Option<String>,
        api_key: Option<String>,
        max_body_bytes: usize,
    ) -> Self {
        let model_name = served_model_name.unwrap_or_else(|| engine.model_info().name.clone());
        let engine_for_len = engine.clone();
        AppState {
            engine,
            model_name,
            model_aliases: Vec::new(),
            served_aliases: Vec::new(),
            api_key: api_key.filter(|k| !k.is_empty()),
            max_body_bytes,
            metrics: Arc::new(Metrics::new(engine_for_len.model_info().max_model_len)),
            created: unix_now(),
            max_seqs_per_request: usize::MAX,
            priority_scheduling: false,
            cpu_pool: Arc::new(tokio::sync::Semaphore::new(cpu_pool_size())),
            needs_trim: std::sync::atomic::AtomicBool::new(false),
            body_read_timeout: Duration::from_secs(60),
            max_prompt_bytes: max_prompt_bytes(&engine_for_len),
            chat_template_override: None,
            generation_defaults: Default::default(),
            max_logprobs: pagoda_core::request::DEFAULT_MAX_LOGPROBS,
            request_limits: Default::default(),
            strict_request_fields: false,
            stop_limits: limits::StopLimits::default(),
            return_tokens_as_token_ids: false,
            force_include_usage: false,
            request_id_headers: false,
            server_load_tracking: false,
            server_load: std::sync::atomic::AtomicUsize::new(0),
            tokenizer_info_endpoint: false,
            dev_endpoints: false,
            sleep_mode: false,
            tokenizer_info: serde_json::Value::Null,
            log_requests: false,
            tool_parser: None,
            reasoning_parser: None,
            responses_store: ResponseStore::new(store::DEFAULT_SIZE),
        }
    }

    /// The chat template in use: `--chat-template`, else the model's.
    pub fn chat_template(&self) -> Option<&Arc<pagoda_models::ChatTemplate>> {
        self.chat_template_override
            .as_ref()
            .or_else(|| self.engine.chat_template())
    }

    /// Runs CPU-heavy request preparation (JSON parsing, chat templates,
    /// tokenization) on tokio's blocking threads, at most one per core (two at least) at a
    /// time, so that neither the async workers nor memory are swamped by many large
    /// prompts at once.
    pub async fn offload<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        let _permit =
            self.cpu_pool
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| ApiError::Unavailable {
                    message: "the server is shutting down".into(),
                })?;
        tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
            Err(ApiError::Internal {
                message: format!("request preparation failed: {e}"),
            })
        })
    }
}

/// See [`AppState::max_prompt_bytes`].
fn max_prompt_bytes(engine: &EngineHandle) -> usize {
    let longest = engine
        .tokenizer()
        .hf()
        .get_vocab(true)
        .keys()
        .map(|k| k.len())
        .max()
        .unwrap_or(1)
        .max(1);
    engine
        .model_info()
        .max_model_len
        .saturating_mul(longest)
        .saturating_mul(2)
}

/// Workers of the tokenization pool: the cores, at least two (also how the idle
/// trimmer tells that no preparation is running).
pub(super) fn cpu_pool_size() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(2)
}

/// The wall clock in whole seconds since the Unix epoch, as the API objects'
/// `created` fields carry it (and [`AppState::created`]).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
