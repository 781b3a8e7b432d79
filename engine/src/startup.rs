//! [`EngineCore`](crate::EngineCore)'s start-up, in the phases vLLM's
//! `EngineCore.__init__` names: plan the attention ([`plan_attention`]: the compute and
//! cache dtypes of the device, one config per kind of layer, the selection's union; the
//! one rule `pagoda backends` shares), select and build the backends
//! ([`select_backends`]), load the model ([`load_model`]: the CPU decoder or the device
//! forward, first, so that the KV cache gets what the weights leave), size and allocate
//! the KV cache ([`initialize_kv_cache`]), capture the decode graphs
//! ([`capture_graphs`]), build the scheduler ([`build_scheduler`]) and the step pool
//! ([`build_step_pool`]). Each phase logs what it decided.

use crate::runner::ModelRunner;
use crate::runner_model::RunnerModel;
use crate::step_pool::StepPool;
use crate::{EngineConfig, EngineError};
use pagoda_core::{
    has_model_ops, open_device, open_model_ops, AttentionBackend, AttentionConfig, DType, Device,
    DeviceRuntime, GraphLimits, KvCache, KvCacheDtype, KvCacheSpec, MemoryInfo,
};
use pagoda_models::{
    capture_sizes, device_unsupported, llama::Llama, merge_attention_configs, DeviceLlama,
    DeviceScratch, LlamaConfig, LlamaWeights, WeightDtype,
};
use pagoda_scheduler::{Scheduler, SchedulerConfig};
use pagoda_selector::{select, BackendOverride};
use std::sync::Arc;

/// The attention a model needs on a device: what [`plan_attention`] decides, once, for
/// the engine and for `pagoda backends`.
#[derive(Debug, Clone)]
pub struct AttentionPlan {
    /// The forward pass's compute dtype there (the queries'): f32 on the CPU, the
    /// device forward's for `--dtype` elsewhere ([`device_compute_dtype`]).
    pub compute: DType,
    /// One config per kind of layer (Gemma 2: sliding and global), in the device and
    /// dtypes above.
    pub per_kind: Vec<AttentionConfig>,
    /// Their union of needs ([`merge_attention_configs`]): what the selection must serve.
    pub merged: AttentionConfig,
}

/// The attention plan of `model` on `device`: the compute dtype (a device refuses a
/// family it cannot run, and `--quantization q8_0`), the cache dtype (`auto`: the
/// queries'), one config per kind of layer and their union.
pub fn plan_attention(
    model: &LlamaConfig,
    device: Device,
    weight_dtype: WeightDtype,
    kv_cache_dtype: KvCacheDtype,
    block_size: usize,
) -> Result<AttentionPlan, EngineError> {
    let compute = if device != Device::Cpu {
        if let Some(why) = device_unsupported(model) {
            return Err(EngineError::Device {
                device,
                message: why,
            });
        }
        device_compute_dtype(weight_dtype)
            .map_err(|message| EngineError::Device { device, message })?
    } else {
        DType::F32
    };
    let mut per_kind = model.attention_configs(block_size);
    for c in &mut per_kind {
        c.device = device;
        c.q_dtype = compute;
        c.kv_dtype = kv_cache_dtype.resolve(c.q_dtype);
    }
    let merged = merge_attention_configs(&per_kind);
    Ok(AttentionPlan {
        compute,
        per_kind,
        merged,
    })
}

/// The selection for `plan` (honouring `--attention-backend`) and one backend per kind
/// of layer; logs the choice and whether the backends are batch-invariant.
pub fn select_backends(
    plan: &AttentionPlan,
    attention_backend: Option<&str>,
) -> Result<(String, Vec<Box<dyn AttentionBackend>>), EngineError> {
    let selector = |e: &dyn std::fmt::Display| EngineError::Selector {
        message: e.to_string(),
    };
    let backend_override =
        BackendOverride::parse(attention_backend.unwrap_or("")).map_err(|e| selector(&e))?;
    let selection = select(&plan.merged, &backend_override).map_err(|e| selector(&e))?;
    tracing::info!("attention backend: {selection}");
    let attn = plan
        .per_kind
        .iter()
        .map(|c| selection.build(c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| selector(&e))?;
    // docs/batch-invariance.md: with an invariant attention backend (the CPU
    // default) a request's logits do not depend on the rest of the batch.
    match attn
        .iter()
        .map(|b| b.batch_invariant())
        .collect::<Option<Vec<_>>>()
    {
        Some(a) => tracing::info!(
            "batch-invariant: yes (attention arithmetic {})",
            a.first().copied().unwrap_or("none")
        ),
        None => {
            tracing::info!("batch-invariant: no (the attention backend declares no invariance)")
        }
    }
    Ok((selection.to_string(), attn))
}

/// The model the runner runs: on a device the device forward
/// ([`build_device_model`]), on the CPU the decoder with its linear layers in
/// `--dtype`'s form (each storage's size logged).
pub fn load_model(
    config: &EngineConfig,
    runtime: &Arc<dyn DeviceRuntime>,
    model_config: LlamaConfig,
    weights: LlamaWeights,
    compute: DType,
) -> Result<RunnerModel, EngineError> {
    if runtime.device() != Device::Cpu {
        return build_device_model(config, runtime, model_config, weights, compute);
    }
    tracing::info!("linear-layer weights: {:?}", config.weight_dtype);
    let model = Llama::new_with_dtype(model_config, weights, config.weight_dtype)?;
    for (kind, bytes) in model.weight_summary() {
        tracing::info!(
            "linear-layer weights: {kind}, {:.1} MiB",
            bytes as f64 / (1 << 20) as f64
        );
    }
    Ok(RunnerModel::host(model))
}

/// The KV cache's shape and size, then its allocation by the device's owner:
/// `--num-kv-blocks`, else on a device what `--gpu-memory-utilization` leaves after the
/// weights and activations (unless `--kv-cache-memory-mib` was given), else
/// `--kv-cache-memory-mib`; at least two blocks (block 0 is the null block).
pub fn initialize_kv_cache(
    config: &EngineConfig,
    runtime: &Arc<dyn DeviceRuntime>,
    model: &LlamaConfig,
    kv_dtype: DType,
) -> Result<KvCache, EngineError> {
    let device = runtime.device();
    let mut spec = KvCacheSpec {
        num_layers: model.num_layers,
        num_blocks: 0,
        block_size: config.block_size,
        num_kv_heads: model.num_kv_heads,
        head_dim: model.head_dim,
        dtype: kv_dtype,
    };
    spec.num_blocks = match (config.num_kv_blocks, runtime.memory_info()) {
        (Some(n), _) => n,
        (None, Some(mem)) if device != Device::Cpu && !config.kv_cache_bytes_explicit => {
            let util = config.gpu_memory_utilization;
            let bytes = kv_bytes_for_utilization(mem, util)
                .map_err(|message| EngineError::Device { device, message })?;
            tracing::info!(
                "device memory: {:.2} of {:.2} GiB in use after the weights and activations; \
                 --gpu-memory-utilization {util} leaves {:.2} GiB for the KV cache",
                (mem.total_bytes - mem.free_bytes) as f64 / GIB,
                mem.total_bytes as f64 / GIB,
                bytes as f64 / GIB
            );
            spec.num_blocks_for_bytes(bytes)
        }
        _ => spec.num_blocks_for_bytes(config.kv_cache_bytes),
    };
    if spec.num_blocks < 2 {
        return Err(EngineError::invalid(
            "num_kv_blocks",
            format!(
                "the KV cache must have at least two blocks (block 0 is reserved), got {}",
                spec.num_blocks
            ),
        ));
    }
    // Block 0 is the null block (vLLM's too): it never holds a request's tokens.
    tracing::info!(
        "KV cache: {} {} blocks of {} tokens ({} usable tokens, block 0 reserved; {:.1} MiB)",
        spec.num_blocks,
        spec.dtype,
        spec.block_size,
        (spec.num_blocks - 1) * spec.block_size,
        (spec.num_blocks * spec.bytes_per_block()) as f64 / (1 << 20) as f64
    );
    KvCache::allocate(spec, runtime.as_ref()).map_err(|e| EngineError::Device {
        device,
        message: format!("allocating the KV cache: {e}"),
    })
}

/// The scheduler over `num_blocks` blocks, serving sequences up to `max_model_len`.
pub fn build_scheduler(
    config: &EngineConfig,
    num_blocks: usize,
    max_model_len: usize,
    limits: PrefillLimits,
) -> Result<Scheduler, EngineError> {
    Scheduler::new(SchedulerConfig {
        max_num_seqs: config.max_num_seqs,
        max_num_batched_tokens: config.max_num_batched_tokens,
        max_prefill_tokens_with_decodes: limits.cap,
        long_prefill_token_threshold: limits.chunk,
        max_model_len,
        block_size: config.block_size,
        num_blocks,
        enable_prefix_caching: config.enable_prefix_caching,
        policy: config.scheduling_policy,
        max_seqs_per_group: config.max_seqs_per_group,
        ..SchedulerConfig::default()
    })
    .map_err(|e| EngineError::invalid("scheduler", e.to_string()))
}

/// The threads the steps run on (pinned to `--cpu-set` when given), logged.
pub fn build_step_pool(config: &EngineConfig) -> Result<StepPool, EngineError> {
    let pool = match &config.cpu_set {
        Some(cpus) => StepPool::pinned(cpus)?,
        None => StepPool::new()?,
    };
    tracing::info!(
        "step pool: {} threads, idle workers {} during a step ({}=0 to park)",
        pool.num_threads(),
        if pool.spins() { "poll" } else { "park" },
        crate::step_pool::STEP_SPIN_ENV
    );
    Ok(pool)
}

/// The runtime of the engine's device, or why it cannot be used: the device must be
/// available (driver, device, runtime linked) and, unless it is the CPU, this binary
/// must link model kernels for it (the device forward runs every op there).
pub fn open_engine_device(device: Device) -> Result<Arc<dyn DeviceRuntime>, EngineError> {
    let runtime = open_device(device).map_err(|e| EngineError::Device {
        device,
        message: match e {
            pagoda_core::CoreError::DeviceUnavailable { message, .. } => message,
            other => other.to_string(),
        },
    })?;
    if device != Device::Cpu && !has_model_ops(device) {
        return Err(EngineError::Device {
            device,
            message: format!(
                "this binary links no model kernels for {} (pagoda-cuda provides them)",
                device.kind()
            ),
        });
    }
    Ok(runtime)
}

/// The compute dtype of the device forward for `--dtype` (the device keeps no
/// quantized blocks: `auto` uploads a GGUF's weights as bf16, as vLLM's `auto` does
/// for a bf16 checkpoint).
pub fn device_compute_dtype(weights: WeightDtype) -> Result<DType, String> {
    match weights {
        WeightDtype::Native | WeightDtype::Bf16 => Ok(DType::BF16),
        WeightDtype::F32 => Ok(DType::F32),
        WeightDtype::Q8_0 => Err(
            "--quantization q8_0 runs on the CPU only; on a device the weights are bf16 \
             (--dtype auto or bfloat16) or float32"
                .into(),
        ),
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// The KV cache's share of a device's memory under `--gpu-memory-utilization`
/// (vLLM's rule): `utilization` of the total, less what is in use once the weights
/// and activation buffers are allocated; an error naming the flags when nothing is left.
pub fn kv_bytes_for_utilization(mem: MemoryInfo, utilization: f64) -> Result<usize, String> {
    let used = mem.total_bytes.saturating_sub(mem.free_bytes);
    let budget = (mem.total_bytes as f64 * utilization) as usize;
    match budget.checked_sub(used) {
        Some(b) if b > 0 => Ok(b),
        _ => Err(format!(
            "out of device memory for the KV cache: the weights and activation buffers leave \
             {:.2} of {:.2} GiB in use, and --gpu-memory-utilization {utilization} allows \
             {:.2} GiB in all; raise --gpu-memory-utilization, lower --max-num-batched-tokens, \
             or use a smaller model",
            used as f64 / GIB,
            mem.total_bytes as f64 / GIB,
            budget as f64 / GIB
        )),
    }
}

/// Loads the draft model of `--speculative-config '{"method":"draft_model",...}'`
/// (None for any other method). It runs on the CPU beside the target, with its own
/// cache of as many blocks as the target's.
pub(crate) fn load_draft(
    config: &EngineConfig,
    on_device: bool,
    target: &LlamaConfig,
    target_eos: &[u32],
    spec: &KvCacheSpec,
) -> Result<Option<crate::spec::draft::DraftProposer>, EngineError> {
    let Some(sc) = config.speculative_config.as_ref() else {
        return Ok(None);
    };
    let crate::spec::SpecMethod::DraftModel { model } = &sc.method else {
        return Ok(None);
    };
    if on_device {
        return Err(EngineError::invalid(
            "speculative_config",
            "method \"draft_model\" runs on the CPU only (use \"ngram\" on a device)",
        ));
    }
    let draft = crate::spec::draft::DraftProposer::load(
        model,
        target,
        target_eos,
        sc.num_speculative_tokens,
        spec.block_size,
        spec.num_blocks,
        config.weight_dtype,
    )?;
    Ok(Some(draft))
}

/// The environment variable that lets `--max-model-len` exceed the model's own
/// context length (vLLM's `VLLM_ALLOW_LONG_MAX_MODEL_LEN`, also honoured).
pub const ALLOW_LONG_MAX_MODEL_LEN: &str = "PAGODA_ALLOW_LONG_MAX_MODEL_LEN";

/// The context length asked for: the model's when none is given; a larger one is
/// refused unless explicitly allowed, as vLLM does (positions past the model's
/// training length give garbage with most RoPE settings).
pub(crate) fn check_max_model_len(
    requested: Option<usize>,
    model_max: usize,
) -> Result<usize, EngineError> {
    let Some(m) = requested else {
        return Ok(model_max);
    };
    if m == 0 {
        return Err(EngineError::invalid(
            "max_model_len",
            "--max-model-len must be positive",
        ));
    }
    if m <= model_max {
        return Ok(m);
    }
    let allowed = [ALLOW_LONG_MAX_MODEL_LEN, "VLLM_ALLOW_LONG_MAX_MODEL_LEN"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")));
    if !allowed {
        return Err(EngineError::invalid(
            "max_model_len",
            format!(
                "--max-model-len {m} is greater than the model's context length {model_max} \
                 (max_position_embeddings). Lower it, or set {ALLOW_LONG_MAX_MODEL_LEN}=1 to \
                 allow it at your own risk (outputs may be wrong past {model_max} tokens)."
            ),
        ));
    }
    tracing::warn!(
        "--max-model-len {m} exceeds the model's context length {model_max}; allowed by \
         {ALLOW_LONG_MAX_MODEL_LEN}, outputs past {model_max} tokens may be wrong"
    );
    Ok(m)
}

/// The context length the KV cache can honour: one sequence of `max_model_len`
/// tokens must fit in `capacity` tokens. An explicit `--max-model-len` that does
/// not fit refuses to start (naming the flags); the model's default is lowered to
/// the capacity with a warning.
pub(crate) fn fit_max_model_len(
    max_model_len: usize,
    explicit: bool,
    capacity: usize,
) -> Result<usize, EngineError> {
    if max_model_len <= capacity {
        return Ok(max_model_len);
    }
    if explicit || capacity < 2 {
        return Err(EngineError::invalid(
            "max_model_len",
            format!(
                "the max seq len ({max_model_len}) is larger than the maximum number of tokens \
                 that can be stored in the KV cache ({capacity}). Try increasing \
                 --kv-cache-memory-mib or --num-kv-blocks, or decreasing --max-model-len."
            ),
        ));
    }
    tracing::warn!(
        "the KV cache holds {capacity} tokens, fewer than the model's context length \
         {max_model_len}: max_model_len lowered to {capacity} (raise --kv-cache-memory-mib or \
         --num-kv-blocks to serve longer sequences)"
    );
    Ok(capacity)
}

/// Hands the pages freed while loading (dequantized tensors, unfused copies) back
/// to the OS. glibc keeps freed heap memory mapped, so without this ~150 MiB of
/// dead load-time buffers stay resident for the life of the server (measured on
/// SmolLM2-135M F32: 664 -> ~520 MiB resident after load).
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it is safe at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Linear weights per token at or below which a step that decodes may take
/// [`PREFILL_CAP_REFERENCE_TOKENS`] prompt tokens: SmolLM2-135M's 106 M, where such
/// a step is short (measured there, BENCHMARKS.md, Serving).
pub const PREFILL_CAP_REFERENCE_PARAMS: usize = 128_000_000;

/// Prompt tokens a step that decodes takes at [`PREFILL_CAP_REFERENCE_PARAMS`]: the
/// CPU's step budget before bursts got the whole budget (256 halved ITL p99 at 32
/// streams against 512 on SmolLM2), and the default prompt chunk of one request on the
/// CPU (so a long prompt alone does not make one huge step that a newcomer waits for).
pub const PREFILL_CAP_REFERENCE_TOKENS: usize = 256;

/// The default cap on prompt tokens in a step that decodes: the reference's 256
/// scaled down by how much more one token costs than at
/// [`PREFILL_CAP_REFERENCE_PARAMS`], so that a step carrying a prompt chunk stays
/// about as long as on the reference model (a multiple of 16, at least 16, at most
/// the budget). SmolLM2 gets 256, a 1B model (0.97 G) 32, a 3B one 16. It does not
/// grow with the budget: what it bounds is how long the decoding streams wait.
pub fn auto_prefill_cap(max_num_batched_tokens: usize, params_per_token: usize) -> usize {
    let scaled = (PREFILL_CAP_REFERENCE_TOKENS as u128 * PREFILL_CAP_REFERENCE_PARAMS as u128
        / params_per_token.max(1) as u128) as usize;
    (scaled / 16 * 16)
        .clamp(16, PREFILL_CAP_REFERENCE_TOKENS)
        .min(max_num_batched_tokens)
}

/// How the scheduler cuts prompts into steps (the start log says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillLimits {
    /// `max_prefill_tokens_with_decodes` (0: none).
    pub cap: usize,
    /// `long_prefill_token_threshold` (0: none).
    pub chunk: usize,
}

/// `--max-prefill-tokens-with-decodes` and `--long-prefill-token-threshold`, or their
/// defaults for this model and device (logged). The defaults were measured on the
/// CPU; a device, where a prompt token costs a small share of a decode step's weight
/// reads, gets neither.
pub(crate) fn prefill_limits(
    config: &EngineConfig,
    model: &LlamaConfig,
    on_device: bool,
) -> PrefillLimits {
    let params = model.linear_params_per_token();
    let budget = config.max_num_batched_tokens;
    let cap = config.max_prefill_tokens_with_decodes.unwrap_or_else(|| {
        if on_device {
            0
        } else {
            auto_prefill_cap(budget, params)
        }
    });
    let chunk = config.long_prefill_token_threshold.unwrap_or(if on_device {
        0
    } else {
        PREFILL_CAP_REFERENCE_TOKENS
    });
    let chunk_text = if chunk == 0 || chunk >= budget {
        "a request's prompt chunk up to the budget".to_string()
    } else {
        format!("a request's prompt chunk at most {chunk} (--long-prefill-token-threshold)")
    };
    if cap == 0 || cap >= budget {
        tracing::info!(
            "step budget: {budget} tokens, prompt chunks uncapped while decoding, {chunk_text}"
        );
    } else {
        tracing::info!(
            "step budget: {budget} tokens, at most {cap} of them prompt tokens in a step that \
             decodes unless more requests wait to start than decode ({:.2} G linear weights \
             per token; --max-prefill-tokens-with-decodes), {chunk_text}",
            params as f64 / 1e9
        );
    }
    PrefillLimits { cap, chunk }
}

/// Captures the decode steps' CUDA graphs of a device runner (vLLM's default), unless
/// `--enforce-eager`; a backend that cannot be captured leaves every step eager (with
/// the reason in the log), a capture that fails is an error naming the flag.
pub fn capture_graphs(
    config: &EngineConfig,
    runtime: &Arc<dyn DeviceRuntime>,
    runner: &mut ModelRunner,
    max_model_len: usize,
) -> Result<(), EngineError> {
    let device = runtime.device();
    if config.enforce_eager {
        tracing::info!("CUDA graphs: off (--enforce-eager); every step runs eagerly");
        return Ok(());
    }
    // A verify run reaches a backend as one decode row per query token (the CUDA
    // backends serve them so), so a step holds up to `1 + k` rows per request: the
    // buffers frozen for the graphs must hold that many, or the first speculative step
    // after capture fails.
    let lookahead = config
        .speculative_config
        .as_ref()
        .map_or(0, |s| s.num_speculative_tokens);
    let limits = GraphLimits {
        max_seq_len: max_model_len,
        max_num_reqs: config.max_num_seqs.saturating_mul(1 + lookahead),
        max_num_tokens: config.max_num_batched_tokens,
        max_blocks_per_seq: max_model_len.div_ceil(config.block_size),
    };
    if let Some(name) = runner.backend_without_graphs() {
        tracing::warn!(
            "CUDA graphs: off, every step runs eagerly: attention backend `{name}` cannot be \
             captured"
        );
        return Ok(());
    }
    let sizes = capture_sizes(config.max_num_seqs, config.max_num_batched_tokens);
    let free_before = runtime.memory_info().map(|m| m.free_bytes);
    let start = std::time::Instant::now();
    match runner.capture_graphs(limits, &sizes) {
        Ok(buckets) => {
            let used = free_before
                .zip(runtime.memory_info().map(|m| m.free_bytes))
                .map_or(0, |(a, b)| a.saturating_sub(b));
            tracing::info!(
                "CUDA graphs: {} decode sizes captured ({}) in {:.1} s, {:.1} MiB; \
                 mixed and prefill steps run eagerly",
                buckets.len(),
                summarize_sizes(&buckets),
                start.elapsed().as_secs_f64(),
                used as f64 / (1 << 20) as f64
            );
            Ok(())
        }
        Err(e) => Err(EngineError::Device {
            device,
            message: format!(
                "capturing CUDA graphs: {e} (--enforce-eager runs without them; a smaller \
                 --max-num-seqs captures fewer; --gpu-memory-utilization leaves more memory)"
            ),
        }),
    }
}

/// `1, 2, 4, 8, 16, ..., 256` as `1, 2, 4, 8..=256 step 8`.
fn summarize_sizes(sizes: &[usize]) -> String {
    match sizes {
        [] => String::new(),
        [a] => a.to_string(),
        _ if sizes.len() > 5 => format!(
            "{}, {}, {} ... {}",
            sizes[0],
            sizes[1],
            sizes[2],
            sizes[sizes.len() - 1]
        ),
        _ => sizes
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The device forward: weights uploaded in `compute` (a progress line per quarter of
/// the layers), the model kernels of the device, activation buffers sized for the
/// step budget (public for `pagoda-benches`' `device_step`, which times this model).
pub fn build_device_model(
    config: &EngineConfig,
    runtime: &Arc<dyn DeviceRuntime>,
    model_config: LlamaConfig,
    weights: LlamaWeights,
    compute: DType,
) -> Result<RunnerModel, EngineError> {
    let device = runtime.device();
    let dev_err = |message: String| EngineError::Device { device, message };
    let ops = open_model_ops(runtime.clone()).map_err(|e| dev_err(e.to_string()))?;
    let start = std::time::Instant::now();
    let mut last_quarter = 0;
    let model = DeviceLlama::new(
        model_config,
        weights,
        compute,
        runtime.as_ref(),
        |done, all| {
            let quarter = done * 4 / all.max(1);
            if quarter > last_quarter {
                last_quarter = quarter;
                tracing::info!("loading weights onto {device}: {done}/{all} layers");
            }
        },
    )
    .map_err(|e| {
        let e = e.to_string();
        // Out of device memory: say what can be changed (the other errors are the
        // model's own, e.g. a tensor of the wrong shape).
        let hint = if e.to_ascii_lowercase().contains("memory") {
            " (the weights must fit the device: --dtype bfloat16 halves f32 weights)"
        } else {
            ""
        };
        dev_err(format!("loading the weights: {e}{hint}"))
    })?;
    let scratch = DeviceScratch::new(
        runtime,
        model.config(),
        compute,
        config.max_num_batched_tokens,
        config.max_num_seqs,
    )
    .map_err(|e| {
        dev_err(format!(
            "{e} (the activation buffers are sized for --max-num-batched-tokens {} and \
             --max-num-seqs {}: lower them)",
            config.max_num_batched_tokens, config.max_num_seqs
        ))
    })?;
    tracing::info!(
        "device {device}: weights {compute} {:.1} MiB in {:.1} s, activations {:.1} MiB",
        model.weight_bytes() as f64 / (1 << 20) as f64,
        start.elapsed().as_secs_f64(),
        scratch.size_bytes() as f64 / (1 << 20) as f64
    );
    Ok(RunnerModel::Device {
        model: Box::new(model),
        ops,
        scratch: Box::new(scratch),
        graphs: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: usize = 1 << 30;

    #[test]
    fn the_kv_cache_gets_what_utilization_leaves() {
        // 100 GiB device, 20 GiB in use after weights and activations: 0.9 leaves 70.
        let mem = MemoryInfo {
            free_bytes: 80 * G,
            total_bytes: 100 * G,
        };
        let b = kv_bytes_for_utilization(mem, 0.9).unwrap();
        assert!((b as f64 / G as f64 - 70.0).abs() < 1e-6, "{b}");
        // Using more than the budget already is a clear error naming the flag.
        let e = kv_bytes_for_utilization(mem, 0.2).unwrap_err();
        assert!(e.contains("--gpu-memory-utilization 0.2"), "{e}");
        assert!(kv_bytes_for_utilization(mem, 0.1).is_err());
    }

    /// Linear weights per token of a Llama shape (layers, hidden, heads, kv heads, ffn).
    fn params(l: usize, h: usize, heads: usize, kv: usize, ffn: usize) -> usize {
        let d = h / heads;
        l * (h * (2 * heads * d + 2 * kv * d) + 3 * h * ffn)
    }

    #[test]
    fn the_prompt_cap_scales_with_the_model() {
        let smol = params(30, 576, 9, 3, 1536);
        assert_eq!(smol, 106_168_320);
        assert_eq!(
            auto_prefill_cap(2048, smol),
            256,
            "SmolLM2 keeps the old CPU budget's 256"
        );
        assert_eq!(auto_prefill_cap(2048, params(16, 2048, 32, 8, 8192)), 32);
        assert_eq!(auto_prefill_cap(2048, params(28, 3072, 24, 8, 8192)), 16);
        assert_eq!(auto_prefill_cap(2048, params(32, 4096, 32, 8, 14336)), 16);
        // The stall it bounds does not grow with the budget; a smaller budget wins.
        assert_eq!(auto_prefill_cap(8192, params(16, 2048, 32, 8, 8192)), 32);
        assert_eq!(auto_prefill_cap(8, params(16, 2048, 32, 8, 8192)), 8);
        assert_eq!(auto_prefill_cap(128, smol), 128);
    }

    fn llama_1b() -> LlamaConfig {
        LlamaConfig {
            vocab_size: 49152,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_layers: 16,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: None,
            rope_freq_factors: None,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            arch: Default::default(),
        }
    }

    #[test]
    fn prompt_limits_default_by_device_and_yield_to_flags() {
        let model = llama_1b();
        let mut config = EngineConfig::new("unused.gguf");
        assert_eq!(config.max_num_batched_tokens, 2048);
        // The CPU: a 1B model's cap, and one request's chunk at the reference 256.
        let cpu = prefill_limits(&config, &model, false);
        assert_eq!(
            cpu,
            PrefillLimits {
                cap: 32,
                chunk: 256
            }
        );
        // A device gets neither.
        let dev = prefill_limits(&config, &model, true);
        assert_eq!(dev, PrefillLimits { cap: 0, chunk: 0 });
        // Flags win on both, 0 included.
        config.max_prefill_tokens_with_decodes = Some(0);
        config.long_prefill_token_threshold = Some(0);
        assert_eq!(
            prefill_limits(&config, &model, false),
            PrefillLimits { cap: 0, chunk: 0 }
        );
        config.max_prefill_tokens_with_decodes = Some(64);
        config.long_prefill_token_threshold = Some(512);
        assert_eq!(
            prefill_limits(&config, &model, true),
            PrefillLimits {
                cap: 64,
                chunk: 512
            }
        );
    }
}
