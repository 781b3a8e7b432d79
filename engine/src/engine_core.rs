//! [`EngineCore`]: the busy loop's body, `step() = schedule -> execute -> update`.
//!
//! It is the single owner of scheduler state and of the model runner; requests
//! enter the scheduler's waiting queue through [`EngineCore::add_request`].

use crate::runner::ModelRunner;
use crate::startup::{
    build_scheduler, build_step_pool, capture_graphs, check_max_model_len, fit_max_model_len,
    initialize_kv_cache, load_draft, load_model, plan_attention, prefill_limits, select_backends,
};
use crate::step_pool::StepPool;
use crate::structured::{Grammar, MaskStats};
use crate::{EngineConfig, EngineError, EngineStats, ModelInfo};
use pagoda_core::{Device, DeviceRuntime};
use pagoda_core::{
    EngineCoreOutput, ModelRunnerOutput, PromptLogprob, ReqHandle, Request, RequestStatus,
    SchedulerOutput,
};
use pagoda_models::{LlamaConfig, LlamaWeights};
use pagoda_scheduler::Scheduler;
use std::collections::HashMap;
use std::sync::Arc;

// The start-up phases' public items, where callers found them before they moved.
pub use crate::startup::{
    auto_prefill_cap, build_device_model, device_compute_dtype, kv_bytes_for_utilization,
    open_engine_device, release_freed_memory, ALLOW_LONG_MAX_MODEL_LEN,
    PREFILL_CAP_REFERENCE_PARAMS, PREFILL_CAP_REFERENCE_TOKENS,
};

/// Logs the family and the features beyond Llama it needs.
fn log_architecture(model: &LlamaConfig) {
    let features = model.arch.features();
    tracing::info!(
        "architecture: {} ({})",
        model.arch.architecture,
        if features.is_empty() {
            "no extra features".to_string()
        } else {
            features.join(", ")
        }
    );
}

/// Scheduler plus model runner.
pub struct EngineCore {
    scheduler: Scheduler,
    runner: ModelRunner,
    /// Prompt logprobs gathered chunk by chunk until the request's first output
    /// carries them (as vLLM's output processor holds them).
    prompt_logprobs: HashMap<ReqHandle, Vec<PromptLogprob>>,
    /// Requests admitted (or resumed) by the latest step's schedule.
    newly_scheduled: Vec<ReqHandle>,
    /// The threads a step runs on: the step itself runs on one of them, so the
    /// kernels' parallel loops split work from a worker (its own deque) instead of
    /// handing every GEMM from the engine thread to the pool and sleeping until it is
    /// done, and the others poll for that work while the step lasts
    /// ([`StepPool`]; BENCHMARKS.md, "Quantized").
    pool: StepPool,
    /// The device's owner, kept to allocate the KV cache again after sleep mode.
    runtime: Arc<dyn DeviceRuntime>,
}

impl EngineCore {
    /// Builds the runner (model, KV cache, selected attention backend) and the scheduler,
    /// in vLLM's order (the phases of [`crate::startup`]): the attention plan and the
    /// backends, the model, the KV cache from what the model leaves, the context length
    /// the cache can honour, the runner (with its proposer), the decode graphs on a
    /// device, the scheduler and the step pool.
    pub fn new(
        config: &EngineConfig,
        runtime: Arc<dyn DeviceRuntime>,
        model_config: LlamaConfig,
        weights: LlamaWeights,
        eos_token_ids: Vec<u32>,
        name: String,
    ) -> Result<(Self, ModelInfo), EngineError> {
        // The draft model (if any) is checked against the target's config, which the
        // target's model takes by value below.
        let draft_target = model_config.clone();
        let requested_len =
            check_max_model_len(config.max_model_len, model_config.max_position_embeddings)?;
        let on_device = runtime.device() != Device::Cpu;
        let prefill = prefill_limits(config, &model_config, on_device);
        // The selector sees the device actually in use and the cache's element type, so
        // it only picks backends that read that cache.
        let plan = plan_attention(
            &model_config,
            runtime.device(),
            config.weight_dtype,
            config.kv_cache_dtype,
            config.block_size,
        )?;
        log_architecture(&model_config);
        let (selection, attn) = select_backends(&plan, config.attention_backend.as_deref())?;
        let vocab_size = model_config.vocab_size;
        // The model first: on a device the KV cache gets what the weights and the
        // activation buffers leave of `--gpu-memory-utilization`.
        let kv_shape = model_config.clone();
        let model = load_model(config, &runtime, model_config, weights, plan.compute)?;
        let kv = initialize_kv_cache(config, &runtime, &kv_shape, plan.merged.kv_dtype)?;
        let spec = kv.spec;
        let capacity = (spec.num_blocks - 1) * spec.block_size;
        let max_model_len =
            fit_max_model_len(requested_len, config.max_model_len.is_some(), capacity)?;
        let info = ModelInfo {
            name,
            max_model_len,
            vocab_size,
            eos_token_ids: eos_token_ids.clone(),
            attention: selection,
            num_kv_blocks: spec.num_blocks,
            kv_cache_dtype: spec.dtype,
            block_size: spec.block_size,
        };
        let draft = load_draft(config, on_device, &draft_target, &eos_token_ids, &spec)?;
        let mut runner = ModelRunner::new(model, kv, attn, eos_token_ids);
        crate::spec::log_config(config.speculative_config.as_ref());
        runner.set_speculative_config(config.speculative_config.clone());
        if let Some(draft) = draft {
            runner.set_draft_model(draft);
        }
        if on_device {
            capture_graphs(config, &runtime, &mut runner, max_model_len)?;
        }
        release_freed_memory();
        let scheduler = build_scheduler(config, spec.num_blocks, max_model_len, prefill)?;
        let pool = build_step_pool(config)?;
        Ok((
            EngineCore {
                scheduler,
                runner,
                prompt_logprobs: HashMap::new(),
                newly_scheduled: Vec::new(),
                pool,
                runtime,
            },
            info,
        ))
    }

    /// Sleep level 1: forgets the prefix cache (publishing `AllBlocksCleared`) and
    /// frees the KV cache's memory; the weights stay. Refused while requests hold
    /// blocks, and on a device (its captured graphs hold the cache's addresses).
    pub fn free_kv_cache(&mut self) -> Result<(), EngineError> {
        if self.runtime.device() != Device::Cpu {
            return Err(EngineError::SleepState {
                message: format!(
                    "sleep mode frees memory on the cpu device only for now, not on {}",
                    self.runtime.device()
                ),
            });
        }
        self.scheduler
            .reset_prefix_cache()
            .map_err(|e| EngineError::SleepState {
                message: format!("cannot sleep while requests run: {e}"),
            })?;
        self.runner.free_kv_cache();
        release_freed_memory();
        Ok(())
    }

    /// Undoes [`EngineCore::free_kv_cache`]: a zeroed cache of the same blocks.
    pub fn restore_kv_cache(&mut self) -> Result<(), EngineError> {
        self.runner
            .restore_kv_cache(self.runtime.as_ref())
            .map_err(|e| EngineError::Device {
                device: self.runtime.device(),
                message: format!("allocating the KV cache at wake-up: {e}"),
            })
    }

    /// How many times the device forward's buffers were allocated (`None` on the
    /// CPU); constant once the engine is warm.
    pub fn num_device_allocations(&self) -> Option<usize> {
        self.runner.num_device_allocations()
    }

    /// The captured decode graphs' buckets and how many steps replayed one (`None`:
    /// no graphs: the CPU, `--enforce-eager`, or a backend that cannot be captured).
    pub fn graph_stats(&self) -> Option<(Vec<usize>, usize)> {
        self.runner.graph_stats()
    }

    /// Arms (or disarms) the runner's test-only fault injection.
    pub fn set_fault_injection(&mut self, faults: Option<crate::runner::FaultInjection>) {
        self.runner.set_fault_injection(faults);
    }

    /// Queues a request; its handle names it in the outputs.
    pub fn add_request(&mut self, request: Request) -> Result<ReqHandle, EngineError> {
        self.add_request_with_grammar(request, None)
    }

    /// Queues a request with its compiled grammar, which a request with
    /// `structured_outputs` must have (the runner keeps it until the request ends).
    pub fn add_request_with_grammar(
        &mut self,
        request: Request,
        grammar: Option<Grammar>,
    ) -> Result<ReqHandle, EngineError> {
        if request.sampling_params.structured_outputs.is_some() != grammar.is_some() {
            return Err(EngineError::invalid(
                "structured_outputs",
                format!(
                    "request {}: structured_outputs and its compiled grammar go together",
                    request.request_id
                ),
            ));
        }
        let handle =
            self.scheduler
                .add_request(request)
                .map_err(|e| EngineError::InvalidRequest {
                    param: Some("prompt".into()),
                    message: e.to_string(),
                })?;
        if let Some(g) = grammar {
            self.runner.add_grammar(handle, g);
        }
        Ok(handle)
    }

    /// Grammar mask timings of the runner (structured outputs).
    pub fn mask_stats(&self) -> MaskStats {
        self.runner.mask_stats()
    }

    /// Requests holding a grammar in the runner (structured outputs).
    pub fn num_grammars(&self) -> usize {
        self.runner.num_grammars()
    }

    pub fn abort_request(&mut self, request_id: &str) {
        if let Some(h) = self.scheduler.handle_of(request_id) {
            self.runner.drop_grammar(h);
        }
        self.scheduler.abort_request(request_id);
    }

    /// Ends a request whose text hit a stop string.
    pub fn finish_stopped(&mut self, handle: ReqHandle) {
        self.scheduler
            .finish_request_at(handle, RequestStatus::FinishedStopped);
        self.runner.drop_grammar(handle);
    }

    /// Ends a request that failed on its own (e.g. its text could not be decoded).
    pub fn finish_failed(&mut self, handle: ReqHandle) {
        self.scheduler
            .finish_request_at(handle, RequestStatus::FinishedError);
        self.runner.drop_grammar(handle);
    }

    pub fn has_unfinished_requests(&self) -> bool {
        self.scheduler.has_unfinished_requests()
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }
    /// The scheduler, mutably (KV-event collection, prefix-cache resets).
    pub fn scheduler_mut(&mut self) -> &mut Scheduler {
        &mut self.scheduler
    }

    pub fn attention_name(&self) -> &str {
        self.runner.attention_name()
    }

    /// schedule -> execute -> update.
    pub fn step(&mut self) -> Result<Vec<EngineCoreOutput>, EngineError> {
        let sched_out = self.scheduler.schedule();
        self.newly_scheduled.clear();
        self.newly_scheduled
            .extend(sched_out.scheduled_new_reqs.iter().map(|r| r.handle));
        let (pool, runner) = (&self.pool, &mut self.runner);
        let out = pool.install(|| runner.execute(&sched_out))?;
        if sched_out.total_num_scheduled_tokens == 0 {
            // The runner still dropped finished requests' state.
            return Ok(Vec::new());
        }
        let mut outputs = self.scheduler.update_from_output(&sched_out, &out);
        // Grammars go with their request, not one step later.
        for o in outputs.iter().filter(|o| o.finish_reason.is_some()) {
            self.runner.drop_grammar(o.handle);
        }
        self.attach_prompt_logprobs(&sched_out, &out, &mut outputs);
        Ok(outputs)
    }

    /// Gathers this step's prompt-logprob chunks and hands each request's whole
    /// list to its first output.
    fn attach_prompt_logprobs(
        &mut self,
        sched_out: &SchedulerOutput,
        out: &ModelRunnerOutput,
        outputs: &mut [EngineCoreOutput],
    ) {
        for h in &sched_out.finished_reqs {
            self.prompt_logprobs.remove(h);
        }
        for (h, chunk) in &out.prompt_logprobs {
            let acc = self.prompt_logprobs.entry(*h).or_default();
            if chunk.start == 1 {
                // A prefill that starts over (after a preemption) recomputes them.
                acc.clear();
            }
            if chunk.start == acc.len() + 1 {
                acc.extend_from_slice(&chunk.entries);
            }
        }
        if self.prompt_logprobs.is_empty() {
            return;
        }
        for o in outputs {
            if let Some(lps) = self.prompt_logprobs.remove(&o.handle) {
                o.prompt_logprobs = Some(lps);
            }
        }
    }

    /// The requests the latest [`EngineCore::step`] admitted from the waiting queue
    /// (new or resumed after a preemption).
    pub fn newly_scheduled(&self) -> &[ReqHandle] {
        &self.newly_scheduled
    }

    pub fn stats(&self) -> EngineStats {
        let s = &self.scheduler;
        let pc = s.prefix_cache_stats();
        EngineStats {
            num_running: s.num_running(),
            num_waiting: s.num_waiting(),
            kv_cache_usage: s.kv_cache_usage(),
            prefix_cache_queries: pc.queries,
            prefix_cache_hits: pc.hits,
            num_preemptions: s.num_preemptions(),
            spec_decoding: s.spec_decoding_stats().clone(),
            ..Default::default()
        }
    }
}
