//! The scheduler: continuous batching under a token budget (vLLM V1 semantics).
//!
//! There is no separate prefill or decode phase: every request's
//! `num_computed_tokens` chases its `num_tokens`, so one step mixes decodes (1 token)
//! and prefill chunks. Each step schedules running requests first (in admission
//! order), then waiting ones (FCFS, or by priority). `num_computed_tokens` is
//! advanced at schedule time. A running request that cannot get a block preempts
//! (by recompute) the most recently admitted running request (FCFS) or the
//! lowest-priority, latest one (priority); waiting requests never preempt anyone.
//!
//! Batch order: in `SchedulerOutput::num_scheduled_tokens`, rows with exactly one
//! token (decodes, including new requests left with one token) and verify rows
//! (a last token plus drafts, which the runner turns into one decode row per token)
//! come first, then the rest; running before new within each group. The model
//! runner can rely on it.
//!
//! Prefix hits may point at blocks that another row of the *same* step is filling
//! (blocks are cached when allocated, as in vLLM), so the runner must write the
//! whole batch's K/V of a layer before that layer's attention, as core's
//! `AttentionBackend` protocol already requires.
//!
//! Requests that could never fit are refused by `add_request`. The effective
//! maximum length is `min(max_model_len, usable_blocks * block_size)`, so a lone
//! request always fits the cache and preemption can never livelock.

use crate::hashing::{update_block_hashes, FxHashMap};
use crate::kv_cache_manager::{KvCacheManager, KvHandle, PrefixCacheStats};
use crate::SchedulerError;
use pagoda_core::{
    CachedRequestData, EngineCoreOutput, ModelRunnerOutput, NewRequestData, ReqHandle, Request,
    RequestId, RequestStatus, SchedulerOutput,
};
use std::collections::VecDeque;

mod seats;
mod spec;
mod stop;

pub use spec::SpecDecodingStats;

/// Order in which waiting requests are admitted and running ones preempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulingPolicy {
    /// First come, first served; the victim is the most recently admitted.
    #[default]
    Fcfs,
    /// Lower `Request::priority` first, then arrival; the victim is the running
    /// request with the largest (priority, arrival).
    Priority,
}

/// Limits and switches of the scheduler.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    /// Token budget of one step.
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    pub block_size: usize,
    /// KV blocks including the reserved null block 0.
    pub num_blocks: usize,
    pub enable_prefix_caching: bool,
    pub enable_chunked_prefill: bool,
    /// Largest prefill chunk per request per step; 0 disables the cap. Only applies
    /// with chunked prefill.
    pub long_prefill_token_threshold: usize,
    /// Most prompt tokens (prefill chunks, all requests together) in a step that
    /// also carries decode rows; 0: no cap beyond the token budget. Every running
    /// stream waits for its step, so on a large model a step of many prompt tokens
    /// is an inter-token stall for all of them; a step with nothing to decode, or
    /// with more requests waiting to start than decoding (a burst), still fills the
    /// whole budget. Only applies with chunked prefill.
    pub max_prefill_tokens_with_decodes: usize,
    pub policy: SchedulingPolicy,
    /// Most seats (of `max_num_seqs`) the requests of one group (one API
    /// request's samples, [`Request::group`]) hold while other requests wait;
    /// `None`: half of `max_num_seqs`, at least 1. See the `seats` module.
    pub max_seqs_per_group: Option<usize>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 8192,
            block_size: 16,
            num_blocks: 4096,
            enable_prefix_caching: true,
            enable_chunked_prefill: true,
            long_prefill_token_threshold: 0,
            max_prefill_tokens_with_decodes: 0,
            policy: SchedulingPolicy::Fcfs,
            max_seqs_per_group: None,
        }
    }
}

/// Counters for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SchedulerStats {
    pub num_running: usize,
    pub num_waiting: usize,
    pub num_preemptions: u64,
    pub prefix_cache: PrefixCacheStats,
    pub kv_cache_usage: f64,
}

/// One scheduled row before the output is assembled.
#[derive(Debug)]
struct Row {
    idx: u32,
    num_tokens: usize,
    new_blocks: Vec<u32>,
    /// Draft tokens scheduled after the last known token (speculative decoding).
    spec: Vec<u32>,
}

/// The scheduler. Requests live in a slab of entries; queues hold entry indices,
/// and the steps name requests by [`ReqHandle`] (entry index + generation).
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    /// Effective maximum sequence length (model length capped by the cache size).
    max_len: usize,
    entries: Vec<Option<Request>>,
    /// Per entry: bumped when the entry is released, so old handles go stale.
    generations: Vec<u32>,
    /// Per entry: the KV block table handle of a running request (skips a map lookup).
    kv_handles: Vec<Option<KvHandle>>,
    free_entries: Vec<u32>,
    /// External id -> entry, for the edges (abort, lookups by id).
    index: FxHashMap<RequestId, u32>,
    /// In admission order.
    running: Vec<u32>,
    waiting: VecDeque<u32>,
    finished_reqs: Vec<ReqHandle>,
    /// Preempted outside `schedule` (prefix-cache reset), reported with the next step.
    pending_preempted: Vec<ReqHandle>,
    next_arrival: u64,
    num_preemptions: u64,
    spec_stats: SpecDecodingStats,
    // Scratch reused every step so the hot path only allocates output vectors.
    sched_running: Vec<Row>,
    sched_new: Vec<Row>,
    finished_scratch: Vec<u32>,
}

/// What one `schedule` call has decided so far.
struct StepPlan {
    budget: usize,
    /// Per-request cap on prefill chunks (0: none).
    threshold: usize,
    /// Prompt tokens this step may still take (`max_prefill_tokens_with_decodes`
    /// when it carries decode rows, else unbounded).
    prefill_left: usize,
    preempted: Vec<ReqHandle>,
    running: Vec<Row>,
    new: Vec<Row>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Result<Self, SchedulerError> {
        let positive = [
            ("max_num_seqs", config.max_num_seqs),
            ("max_num_batched_tokens", config.max_num_batched_tokens),
            ("max_model_len", config.max_model_len),
            ("block_size", config.block_size),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(SchedulerError::InvalidConfig {
                    field,
                    message: "must be positive".into(),
                });
            }
        }
        let kv = KvCacheManager::new(
            config.num_blocks,
            config.block_size,
            config.enable_prefix_caching,
        )?;
        let max_len = config
            .max_model_len
            .min(kv.block_pool().num_usable_blocks() * config.block_size);
        if !config.enable_chunked_prefill && config.max_num_batched_tokens < max_len {
            // A resumed request must be recomputed in one step: it could never run.
            return Err(SchedulerError::InvalidConfig {
                field: "max_num_batched_tokens",
                message: format!(
                    "without chunked prefill it must be at least the maximum length {max_len}, got {}",
                    config.max_num_batched_tokens
                ),
            });
        }
        Ok(Scheduler {
            config,
            kv,
            max_len,
            entries: Vec::new(),
            generations: Vec::new(),
            kv_handles: Vec::new(),
            free_entries: Vec::new(),
            index: FxHashMap::default(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            finished_reqs: Vec::new(),
            pending_preempted: Vec::new(),
            next_arrival: 0,
            num_preemptions: 0,
            spec_stats: SpecDecodingStats::default(),
            sched_running: Vec::new(),
            sched_new: Vec::new(),
            finished_scratch: Vec::new(),
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }
    /// Longest sequence (prompt + outputs) a request may reach.
    pub fn max_len(&self) -> usize {
        self.max_len
    }
    pub fn kv_cache_manager(&self) -> &KvCacheManager {
        &self.kv
    }
    /// Starts (or stops) collecting KV-cache events (see [`crate::kv_events`]).
    pub fn set_kv_events(&mut self, on: bool) {
        self.kv.set_kv_events(on);
    }
    /// The KV-cache events since the last call, in order (drained once per step).
    pub fn take_kv_events(&mut self) -> Vec<crate::KvCacheEvent> {
        self.kv.take_kv_events()
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn num_unfinished_requests(&self) -> usize {
        self.running.len() + self.waiting.len()
    }
    pub fn has_unfinished_requests(&self) -> bool {
        self.num_unfinished_requests() > 0
    }
    /// A live (waiting or running) request by its external id; finished ones are gone.
    pub fn request(&self, req_id: &str) -> Option<&Request> {
        self.index.get(req_id).map(|&i| self.req(i))
    }
    /// The handle of a live request.
    pub fn handle_of(&self, req_id: &str) -> Option<ReqHandle> {
        self.index.get(req_id).map(|&i| self.handle(i))
    }
    /// A live request by handle; `None` once it finished (the handle is stale).
    pub fn request_at(&self, h: ReqHandle) -> Option<&Request> {
        self.live(h).map(|i| self.req(i))
    }
    pub fn running_ids(&self) -> Vec<RequestId> {
        self.running
            .iter()
            .map(|&i| self.req(i).request_id.clone())
            .collect()
    }
    pub fn waiting_ids(&self) -> Vec<RequestId> {
        self.waiting
            .iter()
            .map(|&i| self.req(i).request_id.clone())
            .collect()
    }
    pub fn kv_cache_usage(&self) -> f64 {
        self.kv.usage()
    }
    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }
    /// Speculative decoding's counters (all zero without drafts).
    pub fn spec_decoding_stats(&self) -> &SpecDecodingStats {
        &self.spec_stats
    }
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.kv.stats()
    }
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_preemptions: self.num_preemptions,
            prefix_cache: self.kv.stats(),
            kv_cache_usage: self.kv.usage(),
        }
    }

    fn handle(&self, idx: u32) -> ReqHandle {
        ReqHandle {
            index: idx,
            generation: self.generations[idx as usize],
        }
    }
    /// The entry a handle names, if it is still that request's.
    fn live(&self, h: ReqHandle) -> Option<u32> {
        let i = h.index as usize;
        (self.generations.get(i) == Some(&h.generation) && self.entries[i].is_some())
            .then_some(h.index)
    }
    fn req(&self, idx: u32) -> &Request {
        self.entries[idx as usize]
            .as_ref()
            .expect("queued entries are live")
    }
    fn req_mut(&mut self, idx: u32) -> &mut Request {
        self.entries[idx as usize]
            .as_mut()
            .expect("queued entries are live")
    }

    /// Queues a request, or refuses one that could never run.
    pub fn add_request(&mut self, mut req: Request) -> Result<ReqHandle, SchedulerError> {
        let req_id = req.request_id.clone();
        if self.index.contains_key(&req_id) {
            return Err(SchedulerError::DuplicateRequest { req_id });
        }
        let n = req.num_tokens();
        if n == 0 {
            return Err(SchedulerError::EmptyPrompt { req_id });
        }
        // The parameters were checked where the request entered (`CheckedParams`).
        if n + 1 > self.config.max_model_len {
            return Err(SchedulerError::PromptTooLong {
                req_id,
                num_prompt_tokens: n,
                max_model_len: self.config.max_model_len,
            });
        }
        let usable = self.kv.block_pool().num_usable_blocks();
        let needed = (n + 1).div_ceil(self.config.block_size);
        if needed > usable {
            return Err(SchedulerError::ExceedsKvCache {
                req_id,
                num_prompt_tokens: n,
                num_blocks_needed: needed,
                num_usable_blocks: usable,
            });
        }
        req.status = RequestStatus::Waiting;
        req.num_computed_tokens = 0;
        req.arrival_seq = self.next_arrival;
        self.next_arrival += 1;
        req.block_hashes.clear();
        if self.config.enable_prefix_caching {
            // Hash the prompt now rather than inside a step.
            update_block_hashes(&mut req, self.config.block_size);
        }
        let idx = match self.free_entries.pop() {
            Some(i) => {
                self.entries[i as usize] = Some(req);
                i
            }
            None => {
                self.entries.push(Some(req));
                self.generations.push(0);
                self.kv_handles.push(None);
                (self.entries.len() - 1) as u32
            }
        };
        self.index.insert(req_id, idx);
        self.enqueue_waiting(idx, false);
        Ok(self.handle(idx))
    }

    fn priority_key(&self, idx: u32) -> (i32, u64) {
        let r = self.req(idx);
        (r.priority, r.arrival_seq)
    }

    /// FCFS: new requests at the back, preempted ones at the front. Priority: sorted.
    fn enqueue_waiting(&mut self, idx: u32, preempted: bool) {
        match self.config.policy {
            SchedulingPolicy::Fcfs if preempted => self.waiting.push_front(idx),
            SchedulingPolicy::Fcfs => self.waiting.push_back(idx),
            SchedulingPolicy::Priority => {
                let key = self.priority_key(idx);
                let pos = self
                    .waiting
                    .partition_point(|&i| self.priority_key(i) <= key);
                self.waiting.insert(pos, idx);
            }
        }
    }

    /// Frees a running request's blocks and sends it back to waiting (recompute).
    fn preempt(&mut self, idx: u32) -> ReqHandle {
        let r = self.entries[idx as usize].as_mut().expect("live");
        // A victim already scheduled this step had blocks cached ahead of the
        // computation that now will not run.
        self.kv.free_preempted(&r.request_id, r.num_computed_tokens);
        self.kv_handles[idx as usize] = None;
        r.status = RequestStatus::Preempted;
        r.num_computed_tokens = 0;
        r.spec_token_ids.clear();
        r.num_preemptions += 1;
        self.num_preemptions += 1;
        self.enqueue_waiting(idx, true);
        self.handle(idx)
    }

    fn pick_victim(&self) -> usize {
        match self.config.policy {
            SchedulingPolicy::Fcfs => self.running.len() - 1,
            SchedulingPolicy::Priority => (0..self.running.len())
                .max_by_key(|&i| self.priority_key(self.running[i]))
                .expect("running is not empty"),
        }
    }

    /// Decides this step's batch: running requests first (phase 1), then waiting
    /// ones unless phase 1 had to preempt (phase 2), then the output (phase 3).
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut plan = StepPlan {
            budget: self.config.max_num_batched_tokens,
            // The chunk cap only means something when prompts may be chunked.
            threshold: if self.config.enable_chunked_prefill {
                self.config.long_prefill_token_threshold
            } else {
                0
            },
            prefill_left: self.prefill_cap(),
            preempted: std::mem::take(&mut self.pending_preempted),
            running: std::mem::take(&mut self.sched_running),
            new: std::mem::take(&mut self.sched_new),
        };
        plan.running.clear();
        plan.new.clear();
        let num_preempted_before = plan.preempted.len();
        self.schedule_running(&mut plan);
        if plan.preempted.len() == num_preempted_before {
            self.schedule_waiting(&mut plan);
        }
        self.assemble_output(plan)
    }

    /// The step's cap on prompt tokens: `max_prefill_tokens_with_decodes` when a
    /// running request has finished its prompt (it will decode this step, or be
    /// preempted, which frees what it would have taken) and no more requests wait to
    /// start than decode; unbounded otherwise.
    ///
    /// Why the second condition: the cap exists because every decoding stream waits
    /// for a step's prompt tokens. When a burst of requests arrives while few
    /// streams decode (the first of them just admitted, or the last of an earlier
    /// wave), spreading the burst over capped steps stalls those few streams once
    /// per step for dozens of steps and leaves the burst's later requests queued,
    /// while one full step stalls them once and starts everyone: it starts more
    /// requests than it stalls. Once as many streams decode as wait, the cap holds
    /// (steady arrivals meet it: one or two waiting beside many decoding).
    fn prefill_cap(&self) -> usize {
        let cap = self.config.max_prefill_tokens_with_decodes;
        if cap == 0 || !self.config.enable_chunked_prefill {
            return usize::MAX;
        }
        let decoding = self
            .running
            .iter()
            .filter(|&&i| {
                let r = self.req(i);
                r.num_tokens() - r.num_computed_tokens == 1
            })
            .count();
        // Only those a seat is free for can start this step.
        let admissible = self
            .waiting
            .len()
            .min(self.config.max_num_seqs.saturating_sub(self.running.len()));
        let starting = admissible + (self.running.len() - decoding);
        if decoding == 0 || starting > decoding {
            usize::MAX
        } else {
            cap
        }
    }

    /// Phase 1: the running requests, in admission order, each its next tokens;
    /// a request that cannot get blocks preempts a victim (possibly itself).
    fn schedule_running(&mut self, plan: &mut StepPlan) {
        let mut i = 0;
        while i < self.running.len() && plan.budget > 0 {
            let idx = self.running[i];
            let max_len = self.max_len;
            let req = self.req_mut(idx);
            // Drafts ride after the last known token (vLLM's lookahead slots).
            let known = req.num_tokens() - req.num_computed_tokens;
            let mut n = known + req.spec_token_ids.len();
            if plan.threshold > 0 {
                n = n.min(plan.threshold);
            }
            let prefill = known > 1;
            if prefill {
                n = n.min(plan.prefill_left);
            }
            n = n
                .min(plan.budget)
                .min((max_len - 1).saturating_sub(req.num_computed_tokens));
            if n == 0 {
                i += 1;
                continue;
            }
            let mut blocks = None;
            loop {
                let req = self.entries[idx as usize].as_mut().expect("live");
                let got = match self.kv_handles[idx as usize] {
                    Some(h) => self.kv.allocate_slots_with(h, req, n, &[]),
                    None => self.kv.allocate_slots(req, n, &[]),
                };
                if let Some(b) = got {
                    blocks = Some(b);
                    break;
                }
                let vpos = self.pick_victim();
                let victim = self.running.remove(vpos);
                if vpos < i {
                    // Already scheduled this step (priority policy): undo that.
                    i -= 1;
                    if let Some(k) = plan.running.iter().position(|r| r.idx == victim) {
                        plan.budget += plan.running.remove(k).num_tokens;
                    }
                }
                let h = self.preempt(victim);
                plan.preempted.push(h);
                if victim == idx {
                    break;
                }
            }
            let Some(new_blocks) = blocks else { break };
            let req = self.req_mut(idx);
            let mut spec = std::mem::take(&mut req.spec_token_ids);
            spec.truncate(n.saturating_sub(known));
            plan.running.push(Row {
                idx,
                num_tokens: n,
                new_blocks,
                spec,
            });
            plan.budget -= n;
            if prefill {
                plan.prefill_left -= n;
            }
            i += 1;
        }
    }

    /// Phase 2: admit waiting requests in queue order while budget, `max_num_seqs`
    /// and blocks last, each after its longest prefix-cache hit. A request whose
    /// group holds its share of the seats is passed over while anyone behind it
    /// can be admitted, and may take a seat from a group over its share (the
    /// `seats` module); the passed-over ones get the seats nobody else wants.
    fn schedule_waiting(&mut self, plan: &mut StepPlan) {
        let mut seats = self.count_seats();
        for share in [true, false] {
            let mut pos = 0;
            while pos < self.waiting.len() {
                let idx = self.waiting[pos];
                let group = self.req(idx).group;
                if share && seats.full(group) {
                    pos += 1;
                    continue;
                }
                if plan.budget == 0 {
                    return;
                }
                if self.running.len() >= self.config.max_num_seqs {
                    if !share || !self.reclaim_seat(plan, &mut seats, idx) {
                        return;
                    }
                    // The victim went back to the queue, maybe ahead of us.
                    pos = self.waiting.iter().position(|&i| i == idx).expect("queued");
                }
                if !self.admit(pos, plan) {
                    return;
                }
                seats.add(group);
            }
        }
    }

    /// Admits the waiting request at `pos` with its next chunk; `false` (and
    /// nothing changed) when the budget or the blocks do not allow it.
    fn admit(&mut self, pos: usize, plan: &mut StepPlan) -> bool {
        let idx = self.waiting[pos];
        let req = self.entries[idx as usize].as_mut().expect("live");
        let (hit, num_cached) = self.kv.find_cache_hit(req);
        let mut n = req.num_tokens() - num_cached;
        if plan.threshold > 0 {
            n = n.min(plan.threshold);
        }
        if !self.config.enable_chunked_prefill && n > plan.budget {
            return false; // nothing behind it skips ahead
        }
        n = n.min(plan.budget).min(plan.prefill_left);
        if n == 0 {
            return false;
        }
        let Some(new_blocks) = self.kv.allocate_slots(req, n, &hit) else {
            return false;
        };
        if self.config.enable_prefix_caching {
            self.kv.record_lookup(req.num_tokens(), num_cached);
        }
        if req.status == RequestStatus::Waiting {
            req.num_cached_tokens = num_cached;
        }
        req.status = RequestStatus::Running;
        req.num_computed_tokens = num_cached;
        self.waiting.remove(pos);
        self.kv_handles[idx as usize] = self.kv.handle(&req.request_id);
        self.running.push(idx);
        plan.new.push(Row {
            idx,
            num_tokens: n,
            new_blocks,
            spec: Vec::new(),
        });
        plan.budget -= n;
        plan.prefill_left -= n;
        true
    }

    /// Phase 3: the output, decode rows first (the one place that order is made),
    /// and each scheduled request's `num_computed_tokens` advanced.
    fn assemble_output(&mut self, mut plan: StepPlan) -> SchedulerOutput {
        let mut out = SchedulerOutput {
            finished_reqs: std::mem::take(&mut self.finished_reqs),
            preempted_reqs: std::mem::take(&mut plan.preempted),
            ..Default::default()
        };
        let rows = plan.running.len() + plan.new.len();
        out.num_scheduled_tokens.reserve_exact(rows);
        for decode_pass in [true, false] {
            for row in plan.running.iter().chain(plan.new.iter()) {
                // A verify row (drafts) is decode rows to the runner: one per token.
                if (row.num_tokens == 1 || !row.spec.is_empty()) == decode_pass {
                    out.num_scheduled_tokens
                        .push((self.handle(row.idx), row.num_tokens));
                }
            }
        }
        out.scheduled_cached_reqs.reserve_exact(plan.running.len());
        for mut row in plan.running.drain(..) {
            let handle = self.handle(row.idx);
            if !row.spec.is_empty() {
                out.scheduled_spec_decode_tokens
                    .push((handle, std::mem::take(&mut row.spec)));
            }
            let req = self.entries[row.idx as usize].as_mut().expect("live");
            out.scheduled_cached_reqs.push(CachedRequestData {
                handle,
                new_block_ids: row.new_blocks,
                num_computed_tokens: req.num_computed_tokens,
            });
            req.num_computed_tokens += row.num_tokens;
            out.total_num_scheduled_tokens += row.num_tokens;
        }
        for row in plan.new.drain(..) {
            let handle = self.handle(row.idx);
            let req = self.entries[row.idx as usize].as_mut().expect("live");
            out.scheduled_new_reqs.push(NewRequestData {
                handle,
                req_id: req.request_id.clone(),
                token_ids: req.all_token_ids().to_vec(),
                num_prompt_tokens: req.num_prompt_tokens(),
                block_ids: self.kv.block_ids(&req.request_id).to_vec(),
                num_computed_tokens: req.num_computed_tokens,
                sampling_params: req.sampling_params.clone(),
                num_output_tokens: req.num_output_tokens(),
            });
            req.num_computed_tokens += row.num_tokens;
            out.total_num_scheduled_tokens += row.num_tokens;
        }
        self.sched_running = plan.running;
        self.sched_new = plan.new;
        out
    }

    /// Applies the runner's sampled tokens: appends them, checks stop conditions,
    /// frees finished requests. Rows of requests no longer running (aborted or
    /// preempted since `schedule`) are ignored, as are tokens for partial prefills.
    pub fn update_from_output(
        &mut self,
        sched: &SchedulerOutput,
        runner: &ModelRunnerOutput,
    ) -> Vec<EngineCoreOutput> {
        let mut outputs = Vec::with_capacity(sched.num_scheduled_tokens.len());
        let caching = self.config.enable_prefix_caching;
        let bs = self.config.block_size;
        for &h in &runner.deferred {
            // Not sampled this step: its last token is computed again (same KV, same
            // logits) at the next one, which samples it.
            let Some(idx) = self.live(h) else { continue };
            let req = self.entries[idx as usize].as_mut().expect("live");
            if req.status == RequestStatus::Running && req.num_computed_tokens == req.num_tokens() {
                req.num_computed_tokens -= 1;
            }
        }
        for (i, &(h, _)) in sched.num_scheduled_tokens.iter().enumerate() {
            let Some(idx) = self.live(h) else { continue };
            // The runner answers in the same order; search only if it does not.
            let j = if runner.handles.get(i) == Some(&h) {
                i
            } else {
                match runner.handles.iter().position(|&r| r == h) {
                    Some(j) => j,
                    None => continue,
                }
            };
            let req = self.entries[idx as usize].as_mut().expect("live");
            let spec_row = runner.spec_rows.iter().find(|r| r.handle == h);
            if let (Some(row), RequestStatus::Running) = (spec_row, req.status) {
                spec::roll_back(req, row, &mut self.spec_stats);
            }
            if req.status != RequestStatus::Running || req.num_computed_tokens < req.num_tokens() {
                continue;
            }
            let one;
            let (tokens, logprobs) = match spec_row {
                Some(row) => (&row.token_ids[..], &row.logprobs[..]),
                None => {
                    let Some(tok) = runner.sampled_token_ids.get(j).copied().flatten() else {
                        continue;
                    };
                    one = (
                        [tok],
                        runner.logprobs.get(j).cloned().flatten().map(|lp| [lp]),
                    );
                    (&one.0[..], one.1.as_ref().map_or(&[][..], |l| &l[..]))
                }
            };
            let caching = caching.then_some(bs);
            let kept = spec::append_tokens(req, tokens, logprobs, self.max_len, caching);
            let finished = kept.finished;
            outputs.push(EngineCoreOutput {
                handle: h,
                new_token_ids: kept.token_ids,
                new_logprobs: kept.logprobs,
                finish_reason: req.status.finish_reason(),
                stop_reason: if finished {
                    req.stop_reason.clone()
                } else {
                    None
                },
                num_prompt_tokens: req.num_prompt_tokens(),
                num_cached_tokens: req.num_cached_tokens,
                error: None,
                prompt_logprobs: None,
            });
            if finished {
                self.finished_scratch.push(idx);
            }
        }
        for (h, drafts) in &runner.spec_token_ids {
            let Some(idx) = self.live(*h) else { continue };
            let req = self.entries[idx as usize].as_mut().expect("live");
            if req.status == RequestStatus::Running {
                req.spec_token_ids.clone_from(drafts);
            }
        }
        for (h, message) in &runner.failed {
            // A request aborted since `schedule` is gone already: nothing to report.
            let Some(idx) = self.live(*h) else { continue };
            let req = self.entries[idx as usize].as_mut().expect("live");
            if req.is_finished() {
                continue;
            }
            req.status = RequestStatus::FinishedError;
            outputs.push(EngineCoreOutput {
                handle: *h,
                new_token_ids: Vec::new(),
                new_logprobs: Vec::new(),
                finish_reason: req.status.finish_reason(),
                stop_reason: None,
                num_prompt_tokens: req.num_prompt_tokens(),
                num_cached_tokens: req.num_cached_tokens,
                error: Some(message.clone()),
                prompt_logprobs: None,
            });
            self.finished_scratch.push(idx);
        }
        if !self.finished_scratch.is_empty() {
            let entries = &self.entries;
            self.running.retain(|&i| {
                !entries[i as usize]
                    .as_ref()
                    .is_some_and(|r| r.is_finished())
            });
            self.waiting.retain(|&i| {
                !entries[i as usize]
                    .as_ref()
                    .is_some_and(|r| r.is_finished())
            });
            let finished = std::mem::take(&mut self.finished_scratch);
            for &idx in &finished {
                self.release(idx);
            }
            self.finished_scratch = finished;
            self.finished_scratch.clear();
        }
        outputs
    }

    /// Drops a finished request: frees its blocks and its entry (whose handles go
    /// stale), reports it to the runner with the next step.
    fn release(&mut self, idx: u32) {
        if let Some(req) = self.entries[idx as usize].take() {
            let h = self.handle(idx);
            self.kv.free(&req.request_id);
            self.kv_handles[idx as usize] = None;
            self.index.remove(&req.request_id);
            self.generations[idx as usize] = self.generations[idx as usize].wrapping_add(1);
            self.free_entries.push(idx);
            self.finished_reqs.push(h);
        }
    }

    /// Finishes requests (waiting or running) with `status`, freeing their blocks.
    /// Unknown ids are skipped; returns how many were finished.
    pub fn finish_requests<I, S>(
        &mut self,
        ids: I,
        status: RequestStatus,
    ) -> Result<usize, SchedulerError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        if !status.is_finished() {
            return Err(SchedulerError::InvalidFinishStatus { status });
        }
        let mut n = 0;
        for id in ids {
            let Some(&idx) = self.index.get(id.as_ref()) else {
                continue;
            };
            if let Some(p) = self.running.iter().position(|&i| i == idx) {
                self.running.remove(p);
            } else if let Some(p) = self.waiting.iter().position(|&i| i == idx) {
                self.waiting.remove(p);
            }
            self.req_mut(idx).status = status;
            self.release(idx);
            n += 1;
        }
        Ok(n)
    }

    /// Finishes one live request by handle (a finished status only); false when
    /// the handle is stale.
    pub fn finish_request_at(&mut self, h: ReqHandle, status: RequestStatus) -> bool {
        let Some(idx) = self.live(h) else {
            return false;
        };
        if !status.is_finished() {
            return false;
        }
        if let Some(p) = self.running.iter().position(|&i| i == idx) {
            self.running.remove(p);
        } else if let Some(p) = self.waiting.iter().position(|&i| i == idx) {
            self.waiting.remove(p);
        }
        self.req_mut(idx).status = status;
        self.release(idx);
        true
    }

    /// Aborts one request; false when it is unknown (already finished).
    pub fn abort_request(&mut self, req_id: &str) -> bool {
        self.finish_requests([req_id], RequestStatus::FinishedAborted) == Ok(1)
    }

    /// Forgets the prefix cache; fails while any request holds blocks.
    pub fn reset_prefix_cache(&mut self) -> Result<(), SchedulerError> {
        self.kv.reset_prefix_cache()
    }

    /// Preempts every running request (they resume later, in their original order),
    /// then forgets the prefix cache.
    pub fn reset_prefix_cache_and_preempt(&mut self) -> Result<(), SchedulerError> {
        while let Some(idx) = self.running.pop() {
            let h = self.preempt(idx);
            self.pending_preempted.push(h);
        }
        self.kv.reset_prefix_cache()
    }

    /// Cross-structure consistency, for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.kv.check_invariants()?;
        let live = self.entries.iter().filter(|s| s.is_some()).count();
        if live != self.index.len() || live != self.running.len() + self.waiting.len() {
            return Err(format!(
                "{live} live entries, {} indexed, {} running + {} waiting",
                self.index.len(),
                self.running.len(),
                self.waiting.len()
            ));
        }
        for (id, &i) in &self.index {
            if self.req(i).request_id != *id {
                return Err(format!("index maps {id} to the wrong entry"));
            }
        }
        for &i in &self.running {
            let r = self.req(i);
            if r.status != RequestStatus::Running {
                return Err(format!(
                    "running {} has status {:?}",
                    r.request_id, r.status
                ));
            }
            if self.kv_handles[i as usize] != self.kv.handle(&r.request_id) {
                return Err(format!("running {} has a stale KV handle", r.request_id));
            }
            let need = r.num_computed_tokens.div_ceil(self.config.block_size);
            if self.kv.block_ids(&r.request_id).len() < need {
                return Err(format!("running {} lacks blocks", r.request_id));
            }
        }
        for &i in &self.waiting {
            let r = self.req(i);
            if r.num_computed_tokens != 0
                || !self.kv.block_ids(&r.request_id).is_empty()
                || self.kv_handles[i as usize].is_some()
            {
                return Err(format!("waiting {} holds KV", r.request_id));
            }
        }
        if self.kv.num_requests() > self.running.len() {
            return Err("block tables of requests that are not running".into());
        }
        Ok(())
    }
}
