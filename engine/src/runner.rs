//! The model runner: turns a [`SchedulerOutput`] into model inputs (input ids,
//! positions, the batch descriptor with query_start_loc, seq_lens, block table
//! and slot mapping), runs the model through the selected attention backend,
//! and samples.
//!
//! It keeps a persistent per-request state (tokens, block table, sampling
//! parameters), updated from each step's output: new requests arrive whole,
//! running ones only bring new block ids, finished and preempted ones are dropped.
//! Batch buffers are reused across steps so the hot path does not allocate once warm.
//!
//! Structured outputs: the grammars of constrained requests live here (in
//! [`Masks`]), keyed by request handle, from `add_grammar` until the request
//! finishes (preemption keeps them). Each step their masks are computed on the
//! mask threads while the model runs, applied to the logits before sampling, and
//! the sampled tokens advance them (see [`crate::structured`]). A row whose mask
//! is late is deferred: not sampled, reported in
//! [`ModelRunnerOutput::deferred`] so that the scheduler runs its last token again
//! (see [`crate::structured::masks`] for the bound this gives every step).

use crate::prompt_logprobs;
use crate::runner_model::RunnerModel;
use crate::sampler::{is_plain_greedy, RowResult, SampleInput, Sampler};
use crate::structured::{
    apply_mask, Grammar, MaskRow, MaskStats, Masks, RowMask, MASK_WAIT_FRACTION, MIN_MASK_WAIT,
};
use crate::EngineError;
use pagoda_core::{
    AttentionBackend, BatchDescriptor, GraphLimits, KvCache, ModelRunnerOutput,
    PromptLogprobsChunk, ReqHandle, SchedulerOutput, StepBatch,
};
use std::time::{Duration, Instant};

mod spec_rows;
mod state;

pub use state::{FaultInjection, ModelRunner};
use state::{PromptRows, ReqState};

/// Above this many floats (256 MiB) a logits buffer grown by prompt logprobs is
/// freed after the step instead of kept for the next.
const MAX_KEPT_LOGITS: usize = 64 << 20;

impl ModelRunner {
    /// Drops the KV cache's pools (sleep mode); the spec stays for
    /// [`ModelRunner::restore_kv_cache`]. No step may run until then.
    pub fn free_kv_cache(&mut self) {
        self.kv.layers = Vec::new();
    }

    /// Allocates the pools again after [`ModelRunner::free_kv_cache`] (a no-op
    /// when they are there).
    pub fn restore_kv_cache(
        &mut self,
        runtime: &dyn pagoda_core::DeviceRuntime,
    ) -> Result<(), pagoda_core::CoreError> {
        if self.kv.layers.is_empty() {
            self.kv = KvCache::allocate(self.kv.spec, runtime)?;
        }
        Ok(())
    }

    pub fn new(
        model: RunnerModel,
        kv: KvCache,
        attn: Vec<Box<dyn AttentionBackend>>,
        eos_ids: Vec<u32>,
    ) -> Self {
        let vocab = model.config().vocab_size;
        ModelRunner {
            model,
            kv,
            attn,
            sampler: Sampler::new(vocab),
            eos_ids,
            requests: Vec::new(),
            input_ids: Vec::new(),
            positions: Vec::new(),
            query_lens: Vec::new(),
            seq_lens: Vec::new(),
            logits_rows: Vec::new(),
            sample_rows: Vec::new(),
            prompt_rows: Vec::new(),
            logits: Vec::new(),
            greedy_ids: Vec::new(),
            batch: BatchDescriptor::default(),
            faults: None,
            masks: Masks::new(),
            mask_rows: Vec::new(),
            grammar_errors: Vec::new(),
            deferred: Vec::new(),
            spec: None,
            spec_rows: Vec::new(),
            draft: None,
        }
    }

    /// Turns speculative decoding on (or off) for the steps to come.
    pub fn set_speculative_config(&mut self, spec: Option<crate::spec::SpeculativeConfig>) {
        self.spec = spec;
    }

    /// The draft model of `"method": "draft_model"` speculation.
    pub fn set_draft_model(&mut self, draft: crate::spec::draft::DraftProposer) {
        self.draft = Some(Box::new(draft));
    }

    /// Attaches a compiled grammar to a request (before it is first scheduled); it
    /// is dropped when the request finishes.
    pub fn add_grammar(&mut self, handle: ReqHandle, grammar: Grammar) {
        self.masks.add(handle, grammar);
    }

    /// Drops a request's grammar (it finished or was aborted).
    pub fn drop_grammar(&mut self, handle: ReqHandle) {
        self.masks.remove(handle);
    }

    /// Requests holding a grammar.
    pub fn num_grammars(&self) -> usize {
        self.masks.len()
    }

    /// Cumulative mask timings (per-row compute time, time the step waited).
    pub fn mask_stats(&self) -> MaskStats {
        self.masks.stats()
    }

    /// How many times the device forward's buffers were allocated (`None` on the CPU).
    /// Captures the device model's decode graphs (see [`RunnerModel::capture_graphs`]).
    pub fn capture_graphs(
        &mut self,
        limits: GraphLimits,
        sizes: &[usize],
    ) -> Result<Vec<usize>, EngineError> {
        self.model
            .capture_graphs(&mut self.attn, &mut self.kv, limits, sizes)
    }

    /// The first attention backend whose `run` cannot be captured, if any.
    pub fn backend_without_graphs(&self) -> Option<&str> {
        self.attn
            .iter()
            .find(|a| a.graph_support() != pagoda_core::GraphSupport::UniformDecode)
            .map(|a| a.name())
    }

    /// Captured decode buckets and graph replays so far (`None`: no graphs).
    pub fn graph_stats(&self) -> Option<(Vec<usize>, usize)> {
        self.model.graph_stats()
    }

    pub fn num_device_allocations(&self) -> Option<usize> {
        self.model.num_device_allocations()
    }

    /// Arms the test-only fault injection (see [`FaultInjection`]).
    pub fn set_fault_injection(&mut self, faults: Option<FaultInjection>) {
        self.faults = faults;
    }

    pub fn attention_name(&self) -> &str {
        self.attn.first().map_or("", |a| a.name())
    }

    pub fn num_requests(&self) -> usize {
        self.requests.iter().flatten().count()
    }

    fn update_states(&mut self, sched_out: &SchedulerOutput) -> Result<(), EngineError> {
        for &h in sched_out
            .finished_reqs
            .iter()
            .chain(&sched_out.preempted_reqs)
        {
            if self.state(h).is_some() {
                self.requests[h.index as usize] = None;
            }
            if let Some(d) = self.draft.as_mut() {
                d.forget(h);
            }
        }
        // A preempted request keeps its grammar: it follows the generated tokens,
        // which the recompute does not change.
        for &h in &sched_out.finished_reqs {
            self.masks.remove(h);
        }
        for r in &sched_out.scheduled_new_reqs {
            let seed = r.sampling_params.seed.unwrap_or(0);
            let i = r.handle.index as usize;
            if self.requests.len() <= i {
                self.requests.resize_with(i + 1, || None);
            }
            self.requests[i] = Some(ReqState {
                handle: r.handle,
                req_id: r.req_id.clone(),
                token_ids: r.token_ids.clone(),
                num_prompt_tokens: r.num_prompt_tokens,
                block_ids: r.block_ids.clone(),
                num_computed_tokens: r.num_computed_tokens,
                params: r.sampling_params.clone(),
                seed,
                prompt_logprobs: r
                    .sampling_params
                    .prompt_logprobs
                    .filter(|_| r.token_ids.len() == r.num_prompt_tokens),
                num_drafts: 0,
            });
        }
        for r in &sched_out.scheduled_cached_reqs {
            let st = self.state_mut(r.handle).ok_or_else(|| EngineError::Fault {
                message: format!(
                    "model runner has no state for running request {:?}",
                    r.handle
                ),
            })?;
            st.block_ids.extend_from_slice(&r.new_block_ids);
            st.num_computed_tokens = r.num_computed_tokens;
        }
        Ok(())
    }

    /// The forward pass; with `greedy`, a device model hands back the sampled rows'
    /// argmax ids instead of their logits (returns whether it did).
    fn forward(&mut self, greedy: bool) -> Result<bool, EngineError> {
        let step = StepBatch {
            input_ids: &self.input_ids,
            positions: &self.positions,
            batch: &self.batch,
            logits_rows: &self.logits_rows,
        };
        if greedy {
            return self.model.forward_greedy(
                &step,
                &mut self.attn,
                &mut self.kv,
                &mut self.logits,
                &mut self.greedy_ids,
            );
        }
        self.model
            .forward(&step, &mut self.attn, &mut self.kv, &mut self.logits)?;
        Ok(false)
    }

    /// Whether every sampled row of the step is the plain argmax of its logits (see
    /// [`is_plain_greedy`]) and nothing else needs logits (prompt log-probabilities,
    /// grammars, test faults): then the device may reduce them to ids.
    fn all_plain_greedy(&self, sched_out: &SchedulerOutput) -> bool {
        self.prompt_rows.is_empty()
            && self.faults.is_none()
            && self.sample_rows.iter().all(|&i| {
                let h = sched_out.num_scheduled_tokens[i].0;
                let Some(st) = self.state(h) else {
                    return false;
                };
                !self.masks.contains(h)
                    && is_plain_greedy(&SampleInput {
                        params: &st.params,
                        prompt_ids: &st.token_ids[..st.num_prompt_tokens],
                        output_ids: &st.token_ids[st.num_prompt_tokens..],
                        seed: st.seed,
                        eos_ids: &self.eos_ids,
                    })
            })
    }

    /// Hands the grammars of this step's constrained sampled rows to the mask
    /// threads (started on first use).
    fn start_masks(&mut self, sched_out: &SchedulerOutput) -> Result<(), EngineError> {
        self.grammar_errors.clear();
        self.grammar_errors.resize(self.sample_rows.len(), None);
        self.deferred.clear();
        self.deferred.resize(self.sample_rows.len(), false);
        if self.masks.is_empty() {
            return Ok(());
        }
        self.mask_rows.clear();
        for (k, &i) in self.sample_rows.iter().enumerate() {
            let h = sched_out.num_scheduled_tokens[i].0;
            if !self.masks.contains(h) {
                continue;
            }
            let Some(st) = self.state(h) else { continue };
            let delay = match self.faults.as_ref().and_then(|f| f.slow_mask.as_ref()) {
                Some((prefix, d)) if st.token_ids.starts_with(prefix) => *d,
                _ => Duration::ZERO,
            };
            self.mask_rows.push(MaskRow {
                k,
                handle: h,
                generated: st.token_ids.len() - st.num_prompt_tokens,
                delay,
            });
        }
        self.masks.start(&self.mask_rows, &mut self.grammar_errors)
    }

    /// Waits for the masks within the step's bound (none when the forward pass
    /// failed: nothing is sampled then), applies the ready ones to the logits and
    /// marks the late rows deferred.
    fn finish_masks(
        &mut self,
        sched_out: &SchedulerOutput,
        forward_time: Option<Duration>,
    ) -> Result<(), EngineError> {
        if !self.masks.has_rows() {
            return Ok(());
        }
        // Rows that do not wait on a mask: those the bound protects. A step whose
        // every row waits has no one to protect and waits for them all.
        let others = sched_out.num_scheduled_tokens.len() - self.masks.num_pending();
        let deadline = match forward_time {
            None => Some(Instant::now()),
            Some(_) if others == 0 => None,
            Some(f) => Some(Instant::now() + f.mul_f64(MASK_WAIT_FRACTION).max(MIN_MASK_WAIT)),
        };
        let rows = self.masks.finish(deadline)?;
        let t0 = Instant::now();
        let vocab = self.sampler.vocab_size();
        for (k, m) in rows {
            match m {
                // Sampled rows come first in the logits buffer, in `sample_rows` order.
                RowMask::Ready(Ok(m)) if forward_time.is_some() => {
                    apply_mask(&mut self.logits[k * vocab..(k + 1) * vocab], &m)
                }
                RowMask::Ready(Ok(_)) => {}
                RowMask::Ready(Err(e)) => self.grammar_errors[k] = Some(e),
                RowMask::Deferred => self.deferred[k] = true,
            }
        }
        self.masks.add_apply_time(t0.elapsed());
        Ok(())
    }

    /// Executes one scheduled step and returns the sampled tokens in the scheduler's
    /// order, in vLLM's phases: update the persistent states, prepare the inputs, run
    /// the forward pass, sample, then the bookkeeping of the output.
    pub fn execute(
        &mut self,
        sched_out: &SchedulerOutput,
    ) -> Result<ModelRunnerOutput, EngineError> {
        self.update_states(sched_out)?;
        self.add_drafts(sched_out);
        self.spec_rows.clear();
        let mut out = ModelRunnerOutput::default();
        if sched_out.num_scheduled_tokens.is_empty() {
            return Ok(out);
        }
        let (num_sample_rows, spec_offset) = self.prepare_inputs(sched_out)?;
        let on_device_ids = self.run_forward(sched_out)?;
        let sampled = self.sample(sched_out, on_device_ids, num_sample_rows)?;
        out.handles = sched_out
            .num_scheduled_tokens
            .iter()
            .map(|&(h, _)| h)
            .collect();
        out.sampled_token_ids = vec![None; out.handles.len()];
        out.logprobs = vec![None; out.handles.len()];
        self.apply_sampled(sched_out, sampled, &mut out);
        self.verify_spec_rows(sched_out, spec_offset, &mut out);
        self.advance_computed(sched_out, &mut out);
        self.collect_prompt_logprobs(sched_out, num_sample_rows, &mut out);
        Ok(out)
    }

    /// vLLM's `_prepare_inputs`: the step's input ids, positions and batch descriptor
    /// (query and sequence lengths, block tables, verify runs), and the logits rows:
    /// sampled rows first, then prompt-logprob rows, then verify rows. Returns the
    /// number of sampled rows and where the verify rows' logits start.
    fn prepare_inputs(
        &mut self,
        sched_out: &SchedulerOutput,
    ) -> Result<(usize, usize), EngineError> {
        // The batch keeps the scheduler's order, which puts decode rows first (the
        // one place that order is made); the batch descriptor refuses any other.
        self.input_ids.clear();
        self.positions.clear();
        self.query_lens.clear();
        self.seq_lens.clear();
        self.logits_rows.clear();
        self.sample_rows.clear();
        self.prompt_rows.clear();
        let mut rows: Vec<&[u32]> = Vec::with_capacity(sched_out.num_scheduled_tokens.len());
        let mut verify_runs = Vec::new();
        for (i, &(_, n)) in sched_out.num_scheduled_tokens.iter().enumerate() {
            let h = sched_out.num_scheduled_tokens[i].0;
            let st = self
                .requests
                .get(h.index as usize)
                .and_then(Option::as_ref)
                .filter(|s| s.handle == h)
                .ok_or_else(|| EngineError::Fault {
                    message: format!("model runner has no state for scheduled request {h:?}"),
                })?;
            let id = &st.req_id;
            let start = st.num_computed_tokens;
            let end = start + n;
            if end > st.token_ids.len() {
                return Err(EngineError::Fault {
                    message: format!(
                        "request {id}: scheduled up to token {end} but only {} are known",
                        st.token_ids.len()
                    ),
                });
            }
            self.input_ids.extend_from_slice(&st.token_ids[start..end]);
            self.positions.extend((start..end).map(|p| p as u32));
            let verify = st.num_drafts > 0 && end == st.token_ids.len();
            if verify {
                // A verify row: logits at its last known token and every draft. The
                // attention sees it as one decode row per token (causal: token j sees
                // the positions up to its own), marked as one verify run: any decode
                // backend serves the rows with a plain decode row's arithmetic, and
                // one that serves runs (`paged`) reads their keys once.
                self.spec_rows.push(state::SpecRow {
                    sched_index: i,
                    base: self.input_ids.len() - st.num_drafts - 1,
                    num_drafts: st.num_drafts,
                });
                let first = self.query_lens.len();
                for p in start..end {
                    self.query_lens.push(1);
                    self.seq_lens.push(p + 1);
                    rows.push(&st.block_ids);
                }
                if end - start > 1 {
                    verify_runs.push(first..self.query_lens.len());
                }
            } else {
                self.query_lens.push(n);
                self.seq_lens.push(end);
                rows.push(&st.block_ids);
            }
            if !verify && end == st.token_ids.len() {
                // Reached the end of the known tokens: this row yields a new token.
                self.logits_rows.push(self.input_ids.len() - 1);
                self.sample_rows.push(i);
            }
            if let Some(k) = st.prompt_logprobs {
                // Row p predicts prompt token p + 1; the last prompt row predicts
                // the first output token and is sampled instead.
                let last = end.min(st.num_prompt_tokens.saturating_sub(1));
                if start < last {
                    self.prompt_rows.push(PromptRows {
                        sched_index: i,
                        start,
                        base: self.input_ids.len() - n,
                        count: last - start,
                        k,
                    });
                }
            }
        }
        // Prompt-logprob rows come after the sampled rows in the logits buffer.
        let num_sample_rows = self.logits_rows.len();
        for pr in &self.prompt_rows {
            self.logits_rows.extend(pr.base..pr.base + pr.count);
        }
        // Verify rows come last.
        let spec_offset = self.logits_rows.len() * self.model.config().vocab_size;
        for r in &self.spec_rows {
            self.logits_rows.extend(r.base..r.base + r.num_drafts + 1);
        }
        self.batch
            .rebuild(
                self.kv.spec.block_size,
                &self.query_lens,
                &self.seq_lens,
                &rows,
            )
            .map_err(EngineError::from)?;
        // Each verify row's decode rows as one run: a backend that serves runs reads
        // its keys once for all of them (the same bits as the rows alone).
        for run in verify_runs {
            self.batch.mark_verify_run(run).map_err(EngineError::from)?;
        }
        Ok((num_sample_rows, spec_offset))
    }

    /// vLLM's `execute_model`: the forward pass, with the grammar masks computed on the
    /// mask threads meanwhile and applied to the sampled rows' logits after it. Returns
    /// whether the device already chose the greedy ids (`self.greedy_ids`).
    fn run_forward(&mut self, sched_out: &SchedulerOutput) -> Result<bool, EngineError> {
        // Grammar masks are computed on the mask threads while the model runs.
        self.start_masks(sched_out)?;
        let greedy =
            self.model.is_device() && self.spec_rows.is_empty() && self.all_plain_greedy(sched_out);
        let t_forward = Instant::now();
        let forward = self.forward(greedy);
        let forward_time = forward.is_ok().then(|| t_forward.elapsed());
        let masks = self.finish_masks(sched_out, forward_time);
        let on_device_ids = forward?;
        masks?;
        Ok(on_device_ids)
    }

    /// vLLM's `sample`: a token (and its logprobs) for every sampled row, from the
    /// device's greedy ids or by the sampler over the masked logits.
    fn sample(
        &mut self,
        sched_out: &SchedulerOutput,
        on_device_ids: bool,
        num_sample_rows: usize,
    ) -> Result<Vec<RowResult>, EngineError> {
        // Sample the rows that need a token.
        let mut inputs = Vec::with_capacity(self.sample_rows.len());
        for &i in &self.sample_rows {
            let h = sched_out.num_scheduled_tokens[i].0;
            let st = self.requests[h.index as usize]
                .as_ref()
                .expect("checked above");
            inputs.push(SampleInput {
                params: &st.params,
                prompt_ids: &st.token_ids[..st.num_prompt_tokens],
                output_ids: &st.token_ids[st.num_prompt_tokens..],
                seed: st.seed,
                eos_ids: &self.eos_ids,
            });
        }
        let vocab = self.model.config().vocab_size;
        let sampled: Vec<RowResult> = if on_device_ids {
            self.greedy_ids.iter().map(|&t| Ok((t, None))).collect()
        } else {
            self.sampler
                .sample_batch(&mut self.logits[..num_sample_rows * vocab], &inputs)
                .map_err(|e| EngineError::Fault {
                    message: format!("sampler: {e}"),
                })?
        };
        drop(inputs);
        Ok(sampled)
    }

    /// The sampled rows into the output and the requests' tokens: a deferred row
    /// dropped (sampled again with its mask), injected faults, grammar errors and a
    /// token the grammar refuses failing that request alone.
    fn apply_sampled(
        &mut self,
        sched_out: &SchedulerOutput,
        sampled: Vec<RowResult>,
        out: &mut ModelRunnerOutput,
    ) {
        for (k, (&i, row)) in self.sample_rows.iter().zip(sampled).enumerate() {
            let h = sched_out.num_scheduled_tokens[i].0;
            let Some(st) = self.requests[h.index as usize].as_mut() else {
                continue;
            };
            if self.deferred[k] {
                // Sampled at a later step, with its mask; whatever this row drew is dropped.
                out.deferred.push(h);
                continue;
            }
            let row = match &self.faults {
                Some(f) => f.apply(&st.token_ids, row),
                None => row,
            };
            let row = match self.grammar_errors.get_mut(k).and_then(Option::take) {
                Some(e) => Err(e),
                None => row.map_err(|e| format!("cannot sample: {e}")),
            };
            let row = match row {
                Ok((tok, lp)) => match self.masks.accept(h, tok) {
                    Some(r) => r.map(|()| (tok, lp)),
                    None => Ok((tok, lp)),
                },
                row => row,
            };
            match row {
                Ok((tok, lp)) => {
                    out.sampled_token_ids[i] = Some(tok);
                    out.logprobs[i] = lp;
                    st.token_ids.push(tok);
                }
                Err(e) => {
                    // This request alone fails; the scheduler finishes it with an error.
                    tracing::warn!("request {}: {e}", st.req_id);
                    out.failed.push((h, e));
                }
            }
        }
    }

    /// After the step: every scheduled request's computed tokens advanced, speculative
    /// bookkeeping finished, a deferred row's last token scheduled again.
    fn advance_computed(&mut self, sched_out: &SchedulerOutput, out: &mut ModelRunnerOutput) {
        for &(h, n) in &sched_out.num_scheduled_tokens {
            if let Some(Some(st)) = self.requests.get_mut(h.index as usize) {
                st.num_computed_tokens += n;
            }
        }
        self.finish_spec(sched_out, out);
        // A deferred row's last token is scheduled again (the scheduler rolls back too).
        for &h in &out.deferred {
            if let Some(Some(st)) = self.requests.get_mut(h.index as usize) {
                st.num_computed_tokens -= 1;
            }
        }
    }

    /// Turns the prompt rows' logits (after the sampled rows' in the buffer) into
    /// prompt-logprob chunks, and marks requests whose prompt is done.
    fn collect_prompt_logprobs(
        &mut self,
        sched_out: &SchedulerOutput,
        num_sample_rows: usize,
        out: &mut ModelRunnerOutput,
    ) {
        if self.prompt_rows.is_empty() {
            return;
        }
        let vocab = self.model.config().vocab_size;
        let mut offset = num_sample_rows * vocab;
        for pr in &self.prompt_rows {
            let h = sched_out.num_scheduled_tokens[pr.sched_index].0;
            let rows = &self.logits[offset..offset + pr.count * vocab];
            offset += pr.count * vocab;
            let Some(st) = self.requests[h.index as usize].as_mut() else {
                continue;
            };
            let targets = &st.token_ids[pr.start + 1..pr.start + 1 + pr.count];
            let entries = prompt_logprobs::compute_rows(rows, vocab, targets, pr.k);
            if st.num_computed_tokens + 1 >= st.num_prompt_tokens {
                st.prompt_logprobs = None;
            }
            out.prompt_logprobs.push((
                h,
                PromptLogprobsChunk {
                    start: pr.start + 1,
                    entries,
                },
            ));
        }
        if self.logits.capacity() > MAX_KEPT_LOGITS {
            self.logits = Vec::new();
        }
    }
}
