//! Test helpers: a fake model runner that keeps its own per-request state from
//! `SchedulerOutput` alone (like a real runner), checks that state and a fake KV
//! cache (one token id per slot) for consistency, and samples a deterministic
//! function of all previous tokens; plus a scheduler-free reference generator.
#![allow(dead_code)]

use pagoda_core::{ModelRunnerOutput, ReqHandle, Request, SamplingParams, SchedulerOutput};
use std::collections::HashMap;

/// The fake model: next token = a hash of every previous token, mod `vocab`.
pub fn sample(tokens: &[u32], vocab: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        h ^= t as u64 + 1;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    ((h >> 17) % vocab as u64) as u32
}

/// Outputs of `prompt` generated one token at a time with the stop rules spelled out.
pub fn reference_generate(
    prompt: &[u32],
    p: &SamplingParams,
    eos: &[u32],
    max_len: usize,
    vocab: u32,
) -> Vec<u32> {
    let mut toks = prompt.to_vec();
    let mut out = Vec::new();
    loop {
        let t = sample(&toks, vocab);
        toks.push(t);
        out.push(t);
        if toks.len() >= max_len || out.len() >= p.max_tokens.unwrap_or(usize::MAX) {
            return out;
        }
        if out.len() >= p.min_tokens
            && ((!p.ignore_eos && eos.contains(&t)) || p.stop_token_ids.contains(&t))
        {
            return out;
        }
    }
}

struct RunnerReq {
    tokens: Vec<u32>,
    blocks: Vec<u32>,
    num_computed: usize,
    /// Rows of this request that reached its last token (sampled or deferred).
    attempts: usize,
    /// Drafts at the end of `tokens` during a verify step.
    num_drafts: usize,
}

/// A model runner stand-in. `execute` fails (Err) on any inconsistency.
pub struct FakeRunner {
    pub block_size: usize,
    pub vocab: u32,
    reqs: HashMap<ReqHandle, RunnerReq>,
    /// slot -> (token id, position) written there.
    kv: HashMap<usize, (u32, usize)>,
    /// Check the whole cached prefix of every scheduled row (slow; small tests only).
    pub check_kv: bool,
    /// With `k > 0`, every `k`-th row of a request that reaches its last token is
    /// deferred instead of sampled (as a late grammar mask does in the real runner).
    pub defer_every: usize,
    /// With `k > 0`, proposes up to `k` drafts after every produced token (a
    /// pseudo-random number of them right, then wrong ones) and verifies scheduled
    /// drafts against the fake model, as the real runner's greedy verification does.
    pub spec_k: usize,
}

impl FakeRunner {
    pub fn new(block_size: usize, vocab: u32) -> Self {
        FakeRunner {
            block_size,
            vocab,
            reqs: HashMap::new(),
            kv: HashMap::new(),
            check_kv: true,
            defer_every: 0,
            spec_k: 0,
        }
    }

    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }

    pub fn execute(&mut self, out: &SchedulerOutput) -> Result<ModelRunnerOutput, String> {
        for h in out.finished_reqs.iter().chain(&out.preempted_reqs) {
            self.reqs.remove(h);
        }
        for n in &out.scheduled_new_reqs {
            if self.reqs.contains_key(&n.handle) {
                return Err(format!("new request {} already known", n.req_id));
            }
            if n.token_ids.len() != n.num_prompt_tokens + n.num_output_tokens {
                return Err(format!("{}: token ids vs prompt + outputs", n.req_id));
            }
            let r = RunnerReq {
                tokens: n.token_ids.clone(),
                blocks: n.block_ids.clone(),
                num_computed: n.num_computed_tokens,
                attempts: 0,
                num_drafts: 0,
            };
            self.reqs.insert(n.handle, r);
        }
        for c in &out.scheduled_cached_reqs {
            let r = self
                .reqs
                .get_mut(&c.handle)
                .ok_or(format!("cached request {:?} unknown", c.handle))?;
            if r.num_computed != c.num_computed_tokens {
                return Err(format!(
                    "{:?}: runner computed {} vs {}",
                    c.handle, r.num_computed, c.num_computed_tokens
                ));
            }
            r.blocks.extend_from_slice(&c.new_block_ids);
        }
        for (h, d) in &out.scheduled_spec_decode_tokens {
            let r = self
                .reqs
                .get_mut(h)
                .ok_or(format!("drafts for unknown {h:?}"))?;
            let n = out
                .num_scheduled_tokens_of(*h)
                .ok_or("drafts for an unscheduled row")?;
            if d.is_empty() || r.num_drafts != 0 || r.num_computed + n != r.tokens.len() + d.len() {
                return Err(format!(
                    "{h:?}: drafts {d:?} do not end its {n} scheduled tokens"
                ));
            }
            r.tokens.extend_from_slice(d);
            r.num_drafts = d.len();
        }
        let rows = out.num_scheduled_tokens.len();
        if rows != out.scheduled_new_reqs.len() + out.scheduled_cached_reqs.len() {
            return Err("row count differs from new + cached".into());
        }
        let total: usize = out.num_scheduled_tokens.iter().map(|(_, n)| n).sum();
        if total != out.total_num_scheduled_tokens {
            return Err("total_num_scheduled_tokens is wrong".into());
        }
        let bs = self.block_size;
        let mut res = ModelRunnerOutput::default();
        let mut seen_prefill = false;
        // Like a real layer, write every row's new K/V first, then attend: a prefix hit
        // may point at blocks another row of this same step is writing.
        for (h, n) in &out.num_scheduled_tokens {
            let id = format!("{h:?}");
            if *n == 0 {
                return Err(format!("{id}: zero tokens scheduled"));
            }
            // A verify row (with drafts) is decode rows to a real runner.
            let decode = *n == 1 || !out.spec_tokens_of(*h).is_empty();
            if decode && seen_prefill {
                return Err(format!("{id}: decode row after a prefill row"));
            }
            seen_prefill |= !decode;
            let r = self.reqs.get(h).ok_or(format!("scheduled {id} unknown"))?;
            let (start, end) = (r.num_computed, r.num_computed + n);
            if end > r.tokens.len() {
                return Err(format!("{id}: computes past its tokens"));
            }
            if r.blocks.len() * bs < end {
                return Err(format!("{id}: {} blocks for {end} tokens", r.blocks.len()));
            }
            if r.blocks.contains(&0) {
                return Err(format!("{id}: null block in a block table"));
            }
            for p in start..end {
                self.kv
                    .insert(r.blocks[p / bs] as usize * bs + p % bs, (r.tokens[p], p));
            }
        }
        for (h, n) in &out.num_scheduled_tokens {
            let id = format!("{h:?}");
            let r = self.reqs.get_mut(h).expect("checked above");
            let end = r.num_computed + n;
            if self.check_kv {
                for p in 0..end {
                    let slot = r.blocks[p / bs] as usize * bs + p % bs;
                    if self.kv.get(&slot) != Some(&(r.tokens[p], p)) {
                        return Err(format!("{id}: KV at position {p} is wrong"));
                    }
                }
            }
            r.num_computed = end;
            if r.num_drafts > 0 {
                let row = verify(r, self.vocab, *h);
                propose(r, self.spec_k, self.vocab, *h, &mut res);
                res.spec_rows.push(row);
                res.handles.push(*h);
                res.sampled_token_ids.push(None);
                res.logprobs.push(None);
                continue;
            }
            let mut tok = (end == r.tokens.len()).then(|| sample(&r.tokens, self.vocab));
            if tok.is_some() {
                r.attempts += 1;
                let k = self.defer_every;
                if k > 0 && r.attempts.is_multiple_of(k) {
                    // Deferred: its last token is computed again next step.
                    tok = None;
                    r.num_computed -= 1;
                    res.deferred.push(*h);
                }
            }
            if let Some(t) = tok {
                r.tokens.push(t);
                propose(r, self.spec_k, self.vocab, *h, &mut res);
            }
            res.handles.push(*h);
            res.sampled_token_ids.push(tok);
            res.logprobs.push(None);
        }
        Ok(res)
    }
}

/// Greedy verification against the fake model: drafts accepted while they equal its
/// token, then its own token; the rejected drafts' computed count rolled back.
fn verify(r: &mut RunnerReq, vocab: u32, h: ReqHandle) -> pagoda_core::SpecDecodeRow {
    let k = r.num_drafts;
    let known = r.tokens.len() - k;
    let drafts = r.tokens[known..].to_vec();
    r.tokens.truncate(known);
    let mut emitted = Vec::new();
    let mut all_accepted = true;
    for &d in &drafts {
        let t = sample(&r.tokens, vocab);
        r.tokens.push(t);
        emitted.push(t);
        if t != d {
            all_accepted = false;
            break;
        }
    }
    if all_accepted {
        // The bonus token after the last draft.
        let t = sample(&r.tokens, vocab);
        r.tokens.push(t);
        emitted.push(t);
    }
    r.num_computed -= k - (emitted.len() - 1);
    r.num_drafts = 0;
    pagoda_core::SpecDecodeRow {
        handle: h,
        num_draft_tokens: k,
        token_ids: emitted,
        logprobs: Vec::new(),
    }
}

/// Up to `k` drafts: a pseudo-random number of true continuations, then wrong tokens.
fn propose(r: &RunnerReq, k: usize, vocab: u32, h: ReqHandle, res: &mut ModelRunnerOutput) {
    if k == 0 {
        return;
    }
    let mut seq = r.tokens.clone();
    let right = sample(&seq, 7) as usize % (k + 1);
    let n = 1 + sample(&seq, 5) as usize % k;
    let mut drafts = Vec::new();
    for j in 0..n {
        let t = sample(&seq, vocab);
        let d = if j < right { t } else { (t + 1) % vocab };
        drafts.push(d);
        seq.push(d);
    }
    res.spec_token_ids.push((h, drafts));
}

pub fn greedy_req(id: &str, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request::new(
        id,
        prompt,
        SamplingParams::greedy(max_tokens)
            .checked(usize::MAX)
            .unwrap(),
        vec![],
    )
}

/// A runner output that samples `tok` for every scheduled row that finishes its prompt.
pub fn output_all(
    sched: &SchedulerOutput,
    tok: u32,
    s: &pagoda_scheduler::Scheduler,
) -> ModelRunnerOutput {
    let mut o = ModelRunnerOutput::default();
    for &(h, _) in &sched.num_scheduled_tokens {
        let r = s.request_at(h).expect("scheduled request is live");
        o.handles.push(h);
        o.sampled_token_ids
            .push((r.num_computed_tokens == r.num_tokens()).then_some(tok));
        o.logprobs.push(None);
    }
    o
}
