//! Flags of `pagoda serve` beyond the engine's: vLLM's Frontend group (HTTP,
//! OpenAI-API behaviour, logging) plus the model-facing server options vLLM files
//! under ModelConfig (`--served-model-name`, `--generation-config`,
//! `--max-logprobs`), and Pagoda's own connection limits; also the durations
//! those flags become ([`secs`], [`shutdown_grace`]), which the server reads
//! from here.

use super::EngineArgs;
use clap::{ArgAction, Args};
use std::path::PathBuf;
use std::time::Duration;

/// Flags of `pagoda serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// The model (GGUF file or HF model directory), as `vllm serve MODEL`; wins over
    /// --model.
    #[arg(value_name = "MODEL", help_heading = "ModelConfig")]
    pub model_tag: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Model name(s) clients may use in `model`; the first is the one responses
    /// report and `/metrics` labels (default: the model's file name). Several may
    /// follow one flag (`--served-model-name a b`; put MODEL before it, as with vLLM).
    #[arg(long, num_args = 1.., help_heading = "ModelConfig")]
    pub served_model_name: Vec<String>,
    /// Request defaults: `auto` takes temperature, top_p, top_k, min_p,
    /// repetition_penalty and max_new_tokens (a cap on max_tokens) from the model
    /// directory's generation_config.json; `vllm` uses none; a folder path reads
    /// that folder's generation_config.json.
    #[arg(long, default_value = "auto", help_heading = "ModelConfig")]
    pub generation_config: String,
    /// Most logprobs a request may ask for (`logprobs`, `top_logprobs`); above it
    /// a 400.
    /// `-1` (vLLM's meaning): no cap of its own, so `prompt_logprobs: -1` (the whole
    /// vocabulary) is allowed; sample logprobs stay bounded by what the engine
    /// computes.
    #[arg(long, default_value = "20", value_parser = parse_max_logprobs, allow_hyphen_values = true, help_heading = "ModelConfig")]
    pub max_logprobs: usize,
    /// Most entries of a request's `logprob_token_ids` (vLLM's cap); above it a 400.
    #[arg(long, default_value_t = crate::serve::limits::DEFAULT_MAX_LOGPROB_TOKEN_IDS, help_heading = "ModelConfig")]
    pub max_logprob_token_ids: usize,
    /// Refuse request fields nobody defines with a 400 (by default they are
    /// ignored and logged once per name, as vLLM does, so routers' extra fields
    /// pass).
    #[arg(long, help_heading = "Frontend")]
    pub strict_request_fields: bool,
    /// Most entries of a request's `logit_bias`; above it a 400.
    #[arg(long, default_value_t = crate::serve::limits::DEFAULT_MAX_LOGIT_BIAS, help_heading = "Frontend")]
    pub max_logit_bias: usize,
    /// Most entries of a request's `bad_words`; above it a 400.
    #[arg(long, default_value_t = crate::serve::limits::DEFAULT_MAX_BAD_WORDS, help_heading = "Frontend")]
    pub max_bad_words: usize,
    /// Most stop strings (`stop`) one request may give; above it a 400 (OpenAI
    /// allows 4, vLLM any number).
    #[arg(long, default_value_t = crate::serve::limits::DEFAULT_MAX_STOP_STRINGS, help_heading = "Frontend")]
    pub max_stop_strings: usize,
    /// Longest stop string in bytes; above it a 400.
    #[arg(long, default_value_t = crate::serve::limits::DEFAULT_MAX_STOP_STRING_LEN, help_heading = "Frontend")]
    pub max_stop_string_len: usize,
    /// Address to bind (loopback by default).
    #[arg(long, default_value = "127.0.0.1", help_heading = "Frontend")]
    pub host: String,
    #[arg(long, default_value_t = 8000, help_heading = "Frontend")]
    pub port: u16,
    /// Require `Authorization: Bearer KEY`.
    #[arg(long, env = "PAGODA_API_KEY", help_heading = "Frontend")]
    pub api_key: Option<String>,
    /// Chat template, as a file path or an inline Jinja string; overrides the model's.
    #[arg(long, help_heading = "Frontend")]
    pub chat_template: Option<String>,
    /// Let the model decide when to call tools (`tool_choice: "auto"`, the
    /// default of a request with `tools`), read with --tool-call-parser.
    #[arg(long, help_heading = "Frontend")]
    pub enable_auto_tool_choice: bool,
    /// How the model writes tool calls: `hermes` (Qwen2.5/3, Hermes),
    /// `llama3_json`, `mistral`, `pythonic` (registered parsers; an unknown name
    /// fails at start and lists them).
    #[arg(long, help_heading = "Frontend")]
    pub tool_call_parser: Option<String>,
    /// Split `<think>…</think>` into the message's `reasoning`: `deepseek_r1`
    /// (output starts in reasoning) or `qwen3` (only after an opening `<think>`).
    #[arg(long, help_heading = "StructuredOutputsConfig")]
    pub reasoning_parser: Option<String>,
    /// Logprob tokens as `token_id:N` for every request (the request field of the
    /// same name can also ask for it).
    #[arg(long, help_heading = "Frontend")]
    pub return_tokens_as_token_ids: bool,
    /// Streams always end with a usage chunk, as if every request set
    /// `stream_options.include_usage`.
    #[arg(long, help_heading = "Frontend")]
    pub enable_force_include_usage: bool,
    /// Most responses kept for `GET /v1/responses/{id}` and
    /// `previous_response_id` (`store: true`, the default), least recently used
    /// evicted first; 0 stores none. In memory only.
    #[arg(long, default_value_t = crate::serve::responses::store::DEFAULT_SIZE, help_heading = "Frontend")]
    pub responses_store_size: usize,
    /// Echo the request's `X-Request-Id` header on the response (or a fresh one
    /// when it has none).
    #[arg(long, help_heading = "Frontend")]
    pub enable_request_id_headers: bool,
    /// Count in-flight generation requests for `GET /load` (0 without this flag).
    #[arg(long, help_heading = "Frontend")]
    pub enable_server_load_tracking: bool,
    /// Serve `GET /tokenizer_info` (the tokenizer's configuration and chat template).
    #[arg(long, help_heading = "Frontend")]
    pub enable_tokenizer_info_endpoint: bool,
    /// Log each request's id, sampling parameters and prompt length (info level).
    #[arg(long, action = ArgAction::SetTrue, overrides_with = "disable_log_requests", help_heading = "Frontend")]
    pub enable_log_requests: bool,
    /// Do not log requests (the default).
    #[arg(long, action = ArgAction::SetTrue, overrides_with = "enable_log_requests", help_heading = "Frontend")]
    pub disable_log_requests: bool,
    /// Seconds in-flight requests may run on after SIGINT/SIGTERM before they are
    /// aborted (default 30; `PAGODA_SHUTDOWN_GRACE_SECS` when the flag is absent).
    #[arg(long, help_heading = "Frontend")]
    pub shutdown_timeout: Option<f64>,
    /// Level of the HTTP layer's logs (target `pagoda_server::serve`), as uvicorn's
    /// flag sets its own; `RUST_LOG`, when set, wins.
    #[arg(long, value_enum, default_value_t = LogLevelArg::Info, help_heading = "Frontend")]
    pub uvicorn_log_level: LogLevelArg,
    /// Accepted: `usage.prompt_tokens_details` (`cached_tokens`) is always returned.
    #[arg(long, help_heading = "Frontend")]
    pub enable_prompt_tokens_details: bool,
    /// Accepted: Pagoda writes no per-request access log.
    #[arg(long, help_heading = "Frontend")]
    pub disable_uvicorn_access_log: bool,
    /// Accepted: Pagoda serves no API docs pages.
    #[arg(long, help_heading = "Frontend")]
    pub disable_fastapi_docs: bool,
    /// KV-cache events for routers, vLLM's KVEventsConfig as JSON, e.g.
    /// '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
    /// "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}' (docs/distributed.md).
    #[arg(long, value_parser = crate::serve::kv_events::KvEventsConfig::parse, help_heading = "VllmConfig")]
    pub kv_events_config: Option<crate::serve::kv_events::KvEventsConfig>,
    /// Sleep mode (vLLM's): with `VLLM_SERVER_DEV_MODE=1`, `POST /sleep?level=1`
    /// frees the KV cache, `level=2` the weights too, `POST /wake_up` brings them
    /// back (level 2 reads the model file again); requests while asleep get 503.
    #[arg(long, help_heading = "ModelConfig")]
    pub enable_sleep_mode: bool,
    /// Data-parallel engine cores (also `-dp`), each with its own model copy, KV
    /// cache (`--kv-cache-memory-mib` each) and share of the CPUs (a NUMA node each
    /// when there are that many nodes), behind this one API server, which sends each
    /// request to the least loaded (waiting x 4 + running, as vLLM balances).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64), help_heading = "ParallelConfig")]
    pub data_parallel_size: u64,
    /// Most requests waiting for admission before new ones get 503.
    #[arg(long, default_value_t = 1024, help_heading = "Frontend")]
    pub max_waiting_requests: usize,
    /// Largest request body in bytes (413 above it).
    #[arg(long, default_value_t = 8 * 1024 * 1024, help_heading = "Frontend")]
    pub max_body_bytes: usize,
    /// Most sequences (prompts x `n`) in one request; 400 above it (default:
    /// --max-num-seqs, so one request fills at most one batch).
    #[arg(long, help_heading = "Frontend")]
    pub max_seqs_per_request: Option<usize>,
    /// Seconds an idle keep-alive connection (or a socket that never sends) stays
    /// open (uvicorn's `--timeout-keep-alive`).
    #[arg(long, default_value_t = 5.0, help_heading = "Frontend")]
    pub timeout_keep_alive: f64,
    /// Seconds a client has to send a request's headers once it starts.
    #[arg(long, default_value_t = 10.0, help_heading = "Frontend")]
    pub header_read_timeout: f64,
    /// Seconds a client has to send a whole request body (408 after).
    #[arg(long, default_value_t = 60.0, help_heading = "Frontend")]
    pub body_read_timeout: f64,
    /// Most open client connections (default: the open-file limit, raised to its
    /// hard maximum at start, less a reserve). At the cap the longest-idle
    /// connection is closed for a new one; when all are busy, a few more are let in
    /// to answer /health and /metrics, others get 503.
    #[arg(long, help_heading = "Frontend")]
    pub max_connections: Option<usize>,
}

/// `--uvicorn-log-level` values (uvicorn's), mapped to tracing levels.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevelArg {
    Critical,
    Error,
    Warning,
    Info,
    Debug,
    Trace,
}

impl LogLevelArg {
    /// The tracing level: `critical` and `error` are both `error`.
    pub fn tracing_level(self) -> &'static str {
        match self {
            LogLevelArg::Critical | LogLevelArg::Error => "error",
            LogLevelArg::Warning => "warn",
            LogLevelArg::Info => "info",
            LogLevelArg::Debug => "debug",
            LogLevelArg::Trace => "trace",
        }
    }
}

impl ServeArgs {
    /// Settles the model: the positional `MODEL` wins over `--model`/`PAGODA_MODEL`.
    pub fn resolve_model(&mut self) {
        if let Some(tag) = self.model_tag.take() {
            if let Some(m) = &self.engine.model {
                if *m != tag {
                    tracing::warn!(
                        "both MODEL ({}) and --model ({}) given: serving MODEL",
                        tag.display(),
                        m.display()
                    );
                }
            }
            self.engine.model = Some(tag);
        }
    }

    /// Whether requests are logged (`--enable-log-requests`; vLLM's default is off).
    pub fn log_requests(&self) -> bool {
        self.enable_log_requests && !self.disable_log_requests
    }

    /// The grace period after a shutdown signal.
    pub fn shutdown_grace(&self) -> Duration {
        match self.shutdown_timeout {
            Some(s) => secs(s),
            None => shutdown_grace(),
        }
    }

    /// The connection limits these flags describe (raises the open-file limit).
    pub fn conn_limits(&self) -> crate::serve::conn::ConnLimits {
        use crate::serve::conn::{raise_open_file_limit, FD_RESERVE};
        let headroom = 16;
        let by_fds = raise_open_file_limit()
            .map(|n| n.saturating_sub(FD_RESERVE + headroom).max(16))
            .unwrap_or(4096);
        let max_connections = match self.max_connections {
            Some(m) if m > by_fds => {
                tracing::warn!(
                    "--max-connections {m} is above what the open-file limit allows; using {by_fds}"
                );
                by_fds
            }
            Some(m) => m.max(1),
            None => by_fds,
        };
        crate::serve::conn::ConnLimits {
            keep_alive: secs(self.timeout_keep_alive),
            header_read: secs(self.header_read_timeout),
            body_read: secs(self.body_read_timeout),
            max_connections,
            probe_headroom: headroom,
        }
    }
}

/// How long in-flight requests may run on after a shutdown signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// [`SHUTDOWN_GRACE`], unless `PAGODA_SHUTDOWN_GRACE_SECS` overrides it: the
/// default of `--shutdown-timeout`.
pub fn shutdown_grace() -> Duration {
    std::env::var("PAGODA_SHUTDOWN_GRACE_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(SHUTDOWN_GRACE)
}

/// Seconds from a flag (negative or NaN count as zero).
pub fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::ZERO)
}

/// `--max-logprobs`: a count, or `-1` for no cap ([`usize::MAX`]).
fn parse_max_logprobs(s: &str) -> Result<usize, String> {
    match s.trim() {
        "-1" => Ok(usize::MAX),
        t => t
            .parse::<usize>()
            .map_err(|_| format!("expected a count or -1, got `{s}`")),
    }
}
