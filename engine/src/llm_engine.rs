//! [`LLMEngine`]: text in, text out. It owns the tokenizer, the incremental
//! detokenizers and stop strings, and drives [`EngineCore`] step by step.
//!
//! It is the only layer that knows text: the scheduler and runner see token ids.

use crate::detokenizer::IncrementalDetokenizer;
use crate::engine_core::EngineCore;
use crate::structured::{Grammar, SharedCompiler};
use crate::{
    EngineConfig, EngineError, EngineStats, IterationTokens, ModelInfo, PromptInput,
    RequestMetrics, RequestOutput,
};
use pagoda_core::{
    CheckedParams, EngineCoreOutput, FinishReason, PromptLogprob, ReqHandle, Request,
    SamplingParams, StopReason,
};
use pagoda_models::{ChatTemplate, Tokenizer};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// The result of one prompt of [`LLMEngine::generate`].
/// Where a request goes in the queue, besides its prompt and parameters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    /// Mixed into the first block's hash so tenants do not share cache.
    pub cache_salt: Option<String>,
    /// Lower runs first under the priority policy.
    pub priority: i32,
    /// The API request it is a sample of (`Request::group`): the seat share.
    pub group: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOutput {
    pub prompt: String,
    pub prompt_token_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: Option<FinishReason>,
    pub num_cached_tokens: usize,
    /// With `prompt_logprobs`: one entry per prompt token after the first.
    pub prompt_logprobs: Option<Vec<PromptLogprob>>,
}

struct TextState {
    request_id: String,
    detok: IncrementalDetokenizer,
    include_stop_str_in_output: bool,
    num_prompt_tokens: usize,
    num_output_tokens: usize,
    times: RequestMetrics,
}

/// The offline/online engine over one model.
pub struct LLMEngine {
    core: EngineCore,
    tokenizer: Arc<Tokenizer>,
    hf_tokenizer: Arc<tokenizers::Tokenizer>,
    chat_template: Option<Arc<ChatTemplate>>,
    info: ModelInfo,
    eos_token_ids: Vec<u32>,
    structured: Arc<SharedCompiler>,
    /// Per live request, by the engine's handle (the external id is inside).
    texts: HashMap<ReqHandle, TextState>,
    seed_counter: u64,
    /// `--seed`: the engine RNG's seed, from which unseeded requests draw theirs.
    seed: u64,
    /// `--disable-log-stats`.
    log_stats: bool,
    /// Tokens per step (`vllm:iteration_tokens_total`).
    iteration_tokens: IterationTokens,
    /// Makes request ids of successive `generate` calls distinct.
    num_generate_calls: u64,
    prompt_tokens: u64,
    generation_tokens: u64,
    num_steps: u64,
    logged_generation_tokens: u64,
    logged_prompt_tokens: u64,
    config: EngineConfig,
    /// Spec-decode counters at the previous log line.
    logged_spec: pagoda_scheduler::SpecDecodingStats,
}

/// The one check of a request, where it enters the engine ([`crate::EngineHandle::submit`]
/// or [`LLMEngine::add_request`]): the tokenized prompt against the model, and the
/// parameters into [`CheckedParams`], which the layers below trust.
pub fn check_request(
    prompt_ids: &[u32],
    params: SamplingParams,
    info: &ModelInfo,
) -> Result<CheckedParams, EngineError> {
    if prompt_ids.is_empty() {
        return Err(EngineError::invalid("prompt", "the prompt is empty"));
    }
    if prompt_ids.len() >= info.max_model_len {
        return Err(EngineError::invalid(
            "prompt",
            format!(
                "the prompt has {} tokens but the model's context length is {} (at least one token must be generated)",
                prompt_ids.len(),
                info.max_model_len
            ),
        ));
    }
    if let Some(bad) = prompt_ids.iter().find(|&&t| t as usize >= info.vocab_size) {
        return Err(EngineError::invalid(
            "prompt",
            format!(
                "token id {bad} is out of the vocabulary (size {})",
                info.vocab_size
            ),
        ));
    }
    let kv_tokens = info.kv_capacity_tokens();
    if prompt_ids.len() + 1 > kv_tokens {
        return Err(EngineError::invalid(
            "prompt",
            format!(
                "the prompt has {} tokens but the whole KV cache holds {kv_tokens}",
                prompt_ids.len()
            ),
        ));
    }
    let params = params.checked(info.vocab_size)?;
    check_something_samplable(&params, info)?;
    Ok(params)
}

/// While `min_tokens` holds back EOS and `stop_token_ids`, those must leave at least
/// one token that can be sampled; a request masking the whole vocabulary is
/// refused here rather than failing in the sampler.
fn check_something_samplable(params: &SamplingParams, info: &ModelInfo) -> Result<(), EngineError> {
    let eos: &[u32] = if params.ignore_eos {
        &[]
    } else {
        &info.eos_token_ids
    };
    let vocab = info.vocab_size;
    let held_back = if params.min_tokens == 0 {
        0
    } else {
        params.stop_token_ids.len() + eos.len()
    };
    let candidates = params.allowed_token_ids.as_ref().map_or(vocab, |a| a.len());
    if held_back < candidates {
        return Ok(());
    }
    // Which tokens could be sampled: the allowed ones (or all), less those held back.
    let mut masked = vec![params.allowed_token_ids.is_some(); vocab];
    for &t in params.allowed_token_ids.iter().flat_map(|a| a.iter()) {
        masked[t as usize] = false;
    }
    if params.min_tokens > 0 {
        for &t in params.stop_token_ids.iter().chain(eos) {
            if let Some(m) = masked.get_mut(t as usize) {
                *m = true;
            }
        }
    }
    if masked.iter().all(|&m| m) {
        let (param, why) = if params.allowed_token_ids.is_some() {
            ("allowed_token_ids", "allowed_token_ids leaves")
        } else {
            ("stop_token_ids", "the vocabulary has")
        };
        return Err(EngineError::invalid(
            param,
            format!(
                "{why} no token to sample while min_tokens = {} holds back stop_token_ids and \
                 the EOS tokens: nothing could be generated",
                params.min_tokens
            ),
        ));
    }
    Ok(())
}

/// What one step's outputs leave for the core (see [`LLMEngine::step`]).
#[derive(Debug, Default)]
struct StepOutcome {
    /// Prompt and new tokens of the step (the iteration-tokens histogram).
    step_tokens: u64,
    /// Requests a stop string ended (the core still thought them running).
    stopped: Vec<ReqHandle>,
    /// Requests whose text failed (the detokenizer).
    failed: Vec<ReqHandle>,
    /// Requests that finished.
    finished: Vec<ReqHandle>,
}

impl LLMEngine {
    /// Loads the model, selects the attention backend and allocates the KV cache.
    pub fn new(config: EngineConfig) -> Result<Self, EngineError> {
        // The device first: a missing driver is reported before the weights load.
        let runtime = crate::engine_core::open_engine_device(config.device)?;
        let t0 = Instant::now();
        tracing::info!("loading model from {}", config.model_path.display());
        let loaded = config.load_format.load(&config.model_path, config.seed)?;
        tracing::info!(
            "model {} loaded in {:.1}s",
            loaded.name,
            t0.elapsed().as_secs_f32()
        );
        let tokenizer = Arc::new(loaded.tokenizer);
        let hf_tokenizer = Arc::new(tokenizer.hf().clone());
        let chat_template = loaded.chat_template.map(Arc::new);
        let eos_token_ids = loaded.eos_token_ids.clone();
        let (mut core, info) = EngineCore::new(
            &config,
            runtime,
            loaded.config,
            loaded.weights,
            eos_token_ids.clone(),
            loaded.name,
        )?;
        if let Some(f) = &config.fault_injection {
            tracing::warn!("fault injection armed (testing only): {f:?}");
            let prefix = |t: &Option<String>| -> Result<Option<Vec<u32>>, EngineError> {
                t.as_deref()
                    .map(|t| tokenizer.encode(t, true))
                    .transpose()
                    .map_err(EngineError::from)
            };
            core.set_fault_injection(Some(crate::runner::FaultInjection {
                sampler_error: prefix(&f.sampler_error_prompt)?,
                panic: prefix(&f.panic_prompt)?,
                slow_mask: None,
            }));
        }
        let structured = Arc::new(SharedCompiler::new(
            hf_tokenizer.clone(),
            eos_token_ids.clone(),
            info.vocab_size,
            config.structured_limits.clone(),
        ));
        Ok(LLMEngine {
            core,
            tokenizer,
            structured,
            hf_tokenizer,
            chat_template,
            info,
            eos_token_ids,
            texts: HashMap::new(),
            seed_counter: 0,
            seed: config.seed,
            log_stats: !config.disable_log_stats,
            iteration_tokens: IterationTokens::default(),
            num_generate_calls: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            num_steps: 0,
            logged_generation_tokens: 0,
            logged_prompt_tokens: 0,
            config,
            logged_spec: Default::default(),
        })
    }

    /// The configuration it was built from (sleep level 2 rebuilds from it).
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn tokenizer(&self) -> Arc<Tokenizer> {
        self.tokenizer.clone()
    }
    pub fn chat_template(&self) -> Option<Arc<ChatTemplate>> {
        self.chat_template.clone()
    }
    pub fn model_info(&self) -> &ModelInfo {
        &self.info
    }
    pub fn core(&self) -> &EngineCore {
        &self.core
    }
    /// The engine core, mutably (tests arm its fault injection).
    pub fn core_mut(&mut self) -> &mut EngineCore {
        &mut self.core
    }
    /// The structured-output compiler (shared with [`crate::EngineHandle`], which
    /// compiles on the caller's thread).
    pub fn structured_compiler(&self) -> Arc<SharedCompiler> {
        self.structured.clone()
    }

    /// Queues a request. A `None` seed gets one drawn from the engine's RNG (seeded
    /// by [`EngineConfig::seed`], drawn in arrival order), so that the request samples
    /// the same tokens whatever else is batched with it and even after preemption,
    /// and the same sequence of requests samples the same tokens run after run.
    pub fn add_request(
        &mut self,
        request_id: String,
        prompt: PromptInput,
        params: SamplingParams,
        cache_salt: Option<String>,
    ) -> Result<(), EngineError> {
        self.add_request_with_priority(request_id, prompt, params, cache_salt, 0)
    }

    /// [`LLMEngine::add_request`] with a scheduling priority (lower runs first under
    /// the priority policy; ignored under FCFS).
    pub fn add_request_with_priority(
        &mut self,
        request_id: String,
        prompt: PromptInput,
        params: SamplingParams,
        cache_salt: Option<String>,
        priority: i32,
    ) -> Result<(), EngineError> {
        self.add_request_with_grammar(request_id, prompt, params, cache_salt, priority, None)
    }

    /// [`LLMEngine::add_request_with_priority`] with the grammar of its
    /// `structured_outputs` already compiled (by [`SharedCompiler::compile`], on
    /// the compile pool); one is compiled there when it is missing.
    pub fn add_request_with_grammar(
        &mut self,
        request_id: String,
        prompt: PromptInput,
        params: SamplingParams,
        cache_salt: Option<String>,
        priority: i32,
        grammar: Option<Grammar>,
    ) -> Result<(), EngineError> {
        let prompt_ids = match prompt {
            PromptInput::Tokens(ids) => ids,
            PromptInput::Text(t) => self.tokenizer.encode(&t, true)?,
        };
        let params = check_request(&prompt_ids, params, &self.info)?;
        let grammar = match (&params.structured_outputs, grammar) {
            (Some(spec), None) => Some(self.structured.compile(spec)?),
            (_, g) => g,
        };
        let place = Placement {
            cache_salt,
            priority,
            group: None,
        };
        self.add_checked(request_id, prompt_ids, params, place, grammar)
    }

    /// Queues a request whose prompt and parameters [`check_request`] accepted,
    /// with the compiled grammar its `structured_outputs` needs.
    pub fn add_checked(
        &mut self,
        request_id: String,
        prompt_ids: Vec<u32>,
        mut params: CheckedParams,
        place: Placement,
        grammar: Option<Grammar>,
    ) -> Result<(), EngineError> {
        if self.core.scheduler().handle_of(&request_id).is_some() {
            return Err(EngineError::DuplicateRequest { request_id });
        }
        // Only requests without a seed of their own draw from the engine's RNG, so
        // their draws depend on nothing but the order of unseeded arrivals.
        let seed = if params.seed.is_some() {
            0
        } else {
            self.seed_counter += 1;
            splitmix64(
                self.seed
                    .wrapping_add(self.seed_counter.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            )
        };
        params.fill_defaults(
            seed,
            self.info.max_model_len.saturating_sub(prompt_ids.len()),
        );
        let detok = IncrementalDetokenizer::new(
            self.hf_tokenizer.clone(),
            &prompt_ids,
            params.skip_special_tokens,
            params.stop.clone(),
            params.include_stop_str_in_output,
        );
        let num_prompt_tokens = prompt_ids.len();
        let include_stop_str_in_output = params.include_stop_str_in_output;
        let times = RequestMetrics {
            queued: Instant::now(),
            scheduled: None,
            first_token: None,
            last_token: None,
            num_prompt_tokens,
            num_generation_tokens: 0,
            max_tokens: params.max_tokens.unwrap_or(0),
        };
        let request = Request::new(
            request_id.clone(),
            prompt_ids,
            params,
            self.eos_token_ids.clone(),
        )
        .with_cache_salt(place.cache_salt)
        .with_priority(place.priority)
        .with_group(place.group);
        let handle = self.core.add_request_with_grammar(request, grammar)?;
        self.prompt_tokens += num_prompt_tokens as u64;
        self.texts.insert(
            handle,
            TextState {
                request_id,
                detok,
                include_stop_str_in_output,
                num_prompt_tokens,
                num_output_tokens: 0,
                times,
            },
        );
        Ok(())
    }

    /// Aborts a request wherever it is; its blocks are freed at once.
    pub fn abort_request(&mut self, request_id: &str) {
        if let Some(h) = self.core.scheduler().handle_of(request_id) {
            self.texts.remove(&h);
        }
        self.core.abort_request(request_id);
    }

    pub fn has_unfinished_requests(&self) -> bool {
        self.core.has_unfinished_requests()
    }

    pub fn unfinished_request_ids(&self) -> Vec<String> {
        self.texts.values().map(|t| t.request_id.clone()).collect()
    }

    /// One engine step, in vLLM's phases: the core schedules and executes
    /// ([`EngineCore::step`]), then the output processor stamps the requests' times,
    /// detokenizes each output and applies stop strings
    /// (`process_output`), and the finished, stopped and failed requests
    /// are handed back to the core.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>, EngineError> {
        // vLLM stamps SCHEDULED when the step is scheduled, new tokens when it ends.
        let started = Instant::now();
        let core_outputs = self.core.step()?;
        let now = Instant::now();
        self.num_steps += 1;
        for id in self.core.newly_scheduled() {
            if let Some(st) = self.texts.get_mut(id) {
                // A resumed request keeps its first scheduling time, as in vLLM.
                st.times.scheduled.get_or_insert(started);
            }
        }
        let mut acc = StepOutcome::default();
        let outputs: Vec<RequestOutput> = core_outputs
            .into_iter()
            .filter_map(|o| self.process_output(o, now, &mut acc))
            .collect();
        if acc.step_tokens > 0 {
            self.iteration_tokens.observe(acc.step_tokens);
        }
        for h in acc.stopped {
            self.core.finish_stopped(h);
        }
        for h in acc.failed.iter().chain(&acc.finished) {
            self.texts.remove(h);
        }
        for h in acc.failed {
            self.core.finish_failed(h);
        }
        Ok(outputs)
    }

    /// One request's output of the step (vLLM's `OutputProcessor`): its token counts
    /// and times, the new text (a stop token's text left out unless asked for), a
    /// matched stop string ending it, a detokenizer error failing it alone. `None` for
    /// a request this engine no longer tracks.
    fn process_output(
        &mut self,
        core_out: EngineCoreOutput,
        now: Instant,
        acc: &mut StepOutcome,
    ) -> Option<RequestOutput> {
        let st = self.texts.get_mut(&core_out.handle)?;
        if !core_out.new_token_ids.is_empty() {
            if st.num_output_tokens == 0 {
                // The step that ended a prefill: its prompt counts in the step's tokens.
                acc.step_tokens += st.num_prompt_tokens as u64;
                st.times.first_token = Some(now);
            }
            st.times.last_token = Some(now);
            acc.step_tokens += core_out.new_token_ids.len() as u64;
        }
        st.num_output_tokens += core_out.new_token_ids.len();
        st.times.num_generation_tokens = st.num_output_tokens;
        self.generation_tokens += core_out.new_token_ids.len() as u64;
        // A stop token (EOS or one of `stop_token_ids`) ends the request but is
        // not part of its text unless `include_stop_str_in_output`, as in vLLM;
        // its id still counts among the output tokens.
        let text_ids = match &core_out.stop_reason {
            Some(StopReason::Eos(_) | StopReason::StopTokenId(_))
                if !st.include_stop_str_in_output =>
            {
                &core_out.new_token_ids[..core_out.new_token_ids.len().saturating_sub(1)]
            }
            _ => &core_out.new_token_ids[..],
        };
        let delta = match st.detok.push(text_ids) {
            Ok(d) => d,
            Err(e) => {
                // This request's text is broken, not the engine: it fails alone.
                acc.failed.push(core_out.handle);
                return Some(RequestOutput {
                    request_id: st.request_id.clone(),
                    new_token_ids: core_out.new_token_ids,
                    new_text: String::new(),
                    new_logprobs: core_out.new_logprobs,
                    finished: true,
                    finish_reason: Some(FinishReason::Error),
                    stop_reason: None,
                    num_prompt_tokens: st.num_prompt_tokens,
                    num_cached_tokens: core_out.num_cached_tokens,
                    num_output_tokens: st.num_output_tokens,
                    error: Some(format!("detokenizer: {e}")),
                    prompt_logprobs: core_out.prompt_logprobs,
                    metrics: Some(st.times),
                });
            }
        };
        let mut text = delta.text;
        let mut finish_reason = core_out.finish_reason;
        let mut stop_reason = core_out.stop_reason.clone();
        if let Some(s) = delta.stop_matched {
            if finish_reason.is_none() || finish_reason == Some(FinishReason::Length) {
                acc.stopped.push(core_out.handle);
            }
            finish_reason = Some(FinishReason::Stop);
            stop_reason = Some(StopReason::StopString(s));
        } else if finish_reason.is_some() && core_out.error.is_none() {
            text.push_str(&st.detok.finish());
        }
        let is_finished = finish_reason.is_some();
        if is_finished {
            acc.finished.push(core_out.handle);
        }
        Some(RequestOutput {
            request_id: st.request_id.clone(),
            new_token_ids: core_out.new_token_ids,
            new_text: text,
            new_logprobs: core_out.new_logprobs,
            finished: is_finished,
            finish_reason,
            stop_reason,
            num_prompt_tokens: st.num_prompt_tokens,
            num_cached_tokens: core_out.num_cached_tokens,
            num_output_tokens: st.num_output_tokens,
            error: core_out.error,
            prompt_logprobs: core_out.prompt_logprobs,
            metrics: is_finished.then_some(st.times),
        })
    }

    /// Runs every prompt to completion, all submitted at once (continuous batching).
    pub fn generate(
        &mut self,
        prompts: &[PromptInput],
        params: &SamplingParams,
    ) -> Result<Vec<GenerateOutput>, EngineError> {
        let mut results: Vec<GenerateOutput> = Vec::with_capacity(prompts.len());
        self.num_generate_calls += 1;
        let mut index = HashMap::new();
        for (i, p) in prompts.iter().enumerate() {
            let id = format!("generate-{}-{i}", self.num_generate_calls);
            let (prompt, ids) = match p {
                PromptInput::Text(t) => (t.clone(), self.tokenizer.encode(t, true)?),
                PromptInput::Tokens(ids) => (self.tokenizer.decode(ids, false)?, ids.clone()),
            };
            self.add_request(
                id.clone(),
                PromptInput::Tokens(ids.clone()),
                params.clone(),
                None,
            )?;
            index.insert(id, i);
            results.push(GenerateOutput {
                prompt,
                prompt_token_ids: ids,
                token_ids: Vec::new(),
                text: String::new(),
                finish_reason: None,
                num_cached_tokens: 0,
                prompt_logprobs: None,
            });
        }
        while self.has_unfinished_requests() {
            for o in self.step()? {
                if let Some(&i) = index.get(&o.request_id) {
                    let r = &mut results[i];
                    r.token_ids.extend_from_slice(&o.new_token_ids);
                    if o.prompt_logprobs.is_some() {
                        r.prompt_logprobs = o.prompt_logprobs;
                    }
                    r.text.push_str(&o.new_text);
                    r.num_cached_tokens = o.num_cached_tokens;
                    if o.finished {
                        r.finish_reason = o.finish_reason;
                    }
                }
            }
        }
        Ok(results)
    }

    pub fn stats(&self) -> EngineStats {
        let mut s = self.core.stats();
        s.prompt_tokens = self.prompt_tokens;
        s.generation_tokens = self.generation_tokens;
        s.num_steps = self.num_steps;
        s.iteration_tokens = self.iteration_tokens.clone();
        s
    }

    /// Logs throughput since the previous call, queue sizes, KV usage and prefix hit rate.
    /// Does nothing under `disable_log_stats`.
    pub fn log_stats(&mut self, elapsed: std::time::Duration) {
        if !self.log_stats {
            return;
        }
        let s = self.stats();
        let secs = elapsed.as_secs_f64().max(1e-9);
        let gen = (s.generation_tokens - self.logged_generation_tokens) as f64 / secs;
        let prompt = (s.prompt_tokens - self.logged_prompt_tokens) as f64 / secs;
        self.logged_generation_tokens = s.generation_tokens;
        self.logged_prompt_tokens = s.prompt_tokens;
        let hit = if s.prefix_cache_queries > 0 {
            100.0 * s.prefix_cache_hits as f64 / s.prefix_cache_queries as f64
        } else {
            0.0
        };
        tracing::info!(
            "throughput: prompt {prompt:.1} tok/s, generation {gen:.1} tok/s | running {} waiting {} | KV usage {:.1}% | prefix hit rate {hit:.1}% | preemptions {}",
            s.num_running,
            s.num_waiting,
            100.0 * s.kv_cache_usage,
            s.num_preemptions
        );
        if let Some(line) = crate::spec::log_line(&s.spec_decoding, &self.logged_spec) {
            tracing::info!("{line}");
        }
        self.logged_spec = s.spec_decoding;
    }
}

/// SplitMix64's output function: spreads a counter into well-mixed 64-bit seeds.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
