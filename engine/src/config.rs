//! Engine configuration, as the CLI and server fill it in.

use std::path::PathBuf;

/// Everything needed to build an [`crate::LLMEngine`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model_path: PathBuf,
    /// vLLM's `--load-format`: the model's weights (`Auto`), or random weights from
    /// its `config.json` (`Dummy`, seeded by [`EngineConfig::seed`]).
    pub load_format: pagoda_models::LoadFormat,
    pub block_size: usize,
    /// Explicit number of KV blocks; otherwise derived from `kv_cache_bytes`.
    pub num_kv_blocks: Option<usize>,
    pub kv_cache_bytes: usize,
    /// Whether `kv_cache_bytes` was asked for (`--kv-cache-memory-mib`); otherwise a
    /// device that reports its memory sizes the cache by `gpu_memory_utilization`.
    pub kv_cache_bytes_explicit: bool,
    /// vLLM's `--gpu-memory-utilization` (default 0.9): on a CUDA device, the share of
    /// its memory for weights, activations and the KV cache together.
    pub gpu_memory_utilization: f64,
    pub max_num_batched_tokens: usize,
    /// Most prompt tokens in a step that also decodes (the scheduler's
    /// `max_prefill_tokens_with_decodes`; 0: only the budget). None: by the model's
    /// size, [`crate::engine_core::auto_prefill_cap`].
    pub max_prefill_tokens_with_decodes: Option<usize>,
    /// vLLM's `--long-prefill-token-threshold`: the largest prompt chunk of one
    /// request per step (0: none). None: 256 on the CPU, none on a device
    /// ([`crate::engine_core::PREFILL_CAP_REFERENCE_TOKENS`]).
    pub long_prefill_token_threshold: Option<usize>,
    pub max_num_seqs: usize,
    /// None: the model's context length.
    pub max_model_len: Option<usize>,
    pub enable_prefix_caching: bool,
    /// `NAME` or `decode=NAME,prefill=NAME`; None = automatic.
    pub attention_backend: Option<String>,
    /// Storage type of the linear-layer weights (bf16 halves the bytes a decode step reads).
    pub weight_dtype: pagoda_models::WeightDtype,
    /// Element type of the KV cache (vLLM's `--kv-cache-dtype`): `Auto` is the
    /// model's compute dtype, f32 on the CPU (what the cache always was); bf16 or
    /// f16 hold twice the tokens in `kv_cache_bytes` and halve what attention reads.
    pub kv_cache_dtype: pagoda_core::KvCacheDtype,
    /// FCFS, or by each request's priority (vLLM's `--scheduling-policy`).
    pub scheduling_policy: pagoda_scheduler::SchedulingPolicy,
    /// Most seats one API request's samples hold while others wait
    /// (`--max-running-seqs-per-request`); None: half of `max_num_seqs`.
    pub max_seqs_per_group: Option<usize>,
    /// The CPUs this engine core's step threads run on, one thread each (a
    /// data-parallel rank's share of the machine); `None`: as many threads as the
    /// global pool, unpinned.
    pub cpu_set: Option<Vec<usize>>,
    /// Test-only fault injection (`--debug-inject-fault`, debug builds only).
    pub fault_injection: Option<FaultInjectionConfig>,
    /// vLLM's `--seed`: requests without a seed of their own get one drawn from an
    /// engine RNG seeded with this, in arrival order, so a run is reproducible
    /// (vLLM V1's default is 0 too).
    pub seed: u64,
    /// vLLM's `--disable-log-stats`: no periodic throughput/queue log lines.
    pub disable_log_stats: bool,
    /// Where the model runs (vLLM's `--device`): `cpu`, `cuda[:N]` (weights, KV cache
    /// and every kernel on the GPU), or `emu` (the CUDA kernels compiled for the host;
    /// slow, for testing).
    pub device: pagoda_core::Device,
    /// vLLM's `--enforce-eager`: no CUDA graphs on a device (every step launched
    /// kernel by kernel). Off by default: decode steps replay graphs captured at start.
    pub enforce_eager: bool,
    /// Bounds of structured-output compilation (the `--structured-outputs-*` flags).
    pub structured_limits: crate::structured::CompileLimits,
    /// vLLM's `--speculative-config` (n-gram proposals): none, no speculation.
    pub speculative_config: Option<crate::spec::SpeculativeConfig>,
}

/// Prompts that trigger the runner's test-only faults (see
/// [`crate::runner::FaultInjection`]): a request whose prompt starts with the text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultInjectionConfig {
    /// Such requests fail in the sampler: a per-request fault.
    pub sampler_error_prompt: Option<String>,
    /// Such requests panic the runner: an engine-wide fault.
    pub panic_prompt: Option<String>,
}

impl EngineConfig {
    pub fn new(model_path: impl Into<PathBuf>) -> Self {
        EngineConfig {
            model_path: model_path.into(),
            load_format: pagoda_models::LoadFormat::Auto,
            block_size: 16,
            num_kv_blocks: None,
            kv_cache_bytes: 1 << 30,
            kv_cache_bytes_explicit: false,
            gpu_memory_utilization: 0.9,
            max_num_batched_tokens: 2048,
            max_prefill_tokens_with_decodes: None,
            long_prefill_token_threshold: None,
            max_num_seqs: 64,
            max_model_len: None,
            enable_prefix_caching: true,
            attention_backend: None,
            weight_dtype: pagoda_models::WeightDtype::F32,
            kv_cache_dtype: pagoda_core::KvCacheDtype::Auto,
            scheduling_policy: pagoda_scheduler::SchedulingPolicy::Fcfs,
            max_seqs_per_group: None,
            cpu_set: None,
            fault_injection: None,
            seed: 0,
            disable_log_stats: false,
            device: pagoda_core::Device::Cpu,
            enforce_eager: false,
            structured_limits: Default::default(),
            speculative_config: None,
        }
    }
}

/// Facts about the loaded model the server needs.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// File or directory name, used as the default served model name.
    pub name: String,
    pub max_model_len: usize,
    pub vocab_size: usize,
    pub eos_token_ids: Vec<u32>,
    /// The attention backend choice, explained.
    pub attention: String,
    /// KV blocks allocated, including the reserved null block 0.
    pub num_kv_blocks: usize,
    /// Element type of the KV cache (`--kv-cache-dtype` resolved).
    pub kv_cache_dtype: pagoda_core::DType,
    pub block_size: usize,
}

impl ModelInfo {
    /// Tokens the KV cache can hold for requests: every block but the null block.
    pub fn kv_capacity_tokens(&self) -> usize {
        self.num_kv_blocks.saturating_sub(1) * self.block_size
    }
}
