//! Property test: the scheduler under random workloads (shared prefixes, tiny caches
//! that force preemption, small budgets, random arrivals and aborts) driven by the
//! fake runner. Checked every step: budget, max_num_seqs, runner-side consistency
//! (block tables, cached KV content, decode-first order) and scheduler invariants.
//! Checked at the end: every request finished, outputs equal the scheduler-free
//! reference generation (so preempted requests resumed exactly, and rows the runner
//! deferred were sampled later with the same result), no block leaked.

mod common;

use common::{reference_generate, FakeRunner};
use pagoda_core::{Request, SamplingParams};
use pagoda_scheduler::{Scheduler, SchedulerConfig, SchedulerError, SchedulingPolicy};
use proptest::prelude::*;
use std::collections::HashMap;

const VOCAB: u32 = 24;
const EOS: u32 = 0;

#[derive(Debug, Clone)]
struct Spec {
    family: usize,
    shared: usize,
    suffix: usize,
    max_tokens: usize,
    min_tokens: usize,
    ignore_eos: bool,
    stop_token: Option<u32>,
    priority: i32,
    arrival: usize,
    abort_at: Option<usize>,
    salt: bool,
    /// Samples of one API request share a group (the seat share).
    group: Option<u64>,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        (0usize..3, 0usize..40, 1usize..20),
        (
            1usize..40,
            0usize..4,
            any::<bool>(),
            prop::option::of(1u32..VOCAB),
        ),
        (
            0i32..3,
            0usize..12,
            prop::option::weighted(0.15, 0usize..30),
            prop::bool::weighted(0.2),
            prop::option::weighted(0.6, 0u64..3),
        ),
    )
        .prop_map(
            |(
                (family, shared, suffix),
                (max_tokens, min_tokens, ignore_eos, stop_token),
                (priority, arrival, abort_at, salt, group),
            )| Spec {
                family,
                shared,
                suffix,
                max_tokens,
                min_tokens: min_tokens.min(max_tokens),
                ignore_eos,
                stop_token,
                priority,
                arrival,
                abort_at,
                salt,
                group,
            },
        )
}

fn config() -> impl Strategy<Value = SchedulerConfig> {
    (
        prop_oneof![Just(2usize), Just(4), Just(8), Just(16)],
        3usize..40,
        1usize..8,
        4usize..80,
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(0usize), 1usize..20],
        any::<bool>(),
        prop::option::of(1usize..4),
        prop_oneof![Just(0usize), 1usize..12],
    )
        .prop_map(
            |(
                block_size,
                num_blocks,
                max_num_seqs,
                budget,
                caching,
                chunked,
                threshold,
                prio,
                share,
                prefill_cap,
            )| {
                let usable_len = (num_blocks - 1) * block_size;
                let max_model_len = usable_len.min(96);
                SchedulerConfig {
                    max_num_seqs,
                    // Without chunking the budget must cover a whole (resumed) sequence.
                    max_num_batched_tokens: if chunked {
                        budget
                    } else {
                        max_model_len.max(budget)
                    },
                    max_model_len,
                    block_size,
                    num_blocks,
                    enable_prefix_caching: caching,
                    enable_chunked_prefill: chunked,
                    long_prefill_token_threshold: threshold,
                    max_prefill_tokens_with_decodes: prefill_cap,
                    policy: if prio {
                        SchedulingPolicy::Priority
                    } else {
                        SchedulingPolicy::Fcfs
                    },
                    max_seqs_per_group: share,
                }
            },
        )
}

fn prompt_of(s: &Spec, i: usize) -> Vec<u32> {
    // Families share long prefixes; suffixes are unique per request.
    let mut p: Vec<u32> = (0..s.shared as u32)
        .map(|t| (t * 7 + s.family as u32 * 3) % VOCAB)
        .collect();
    p.extend((0..s.suffix as u32).map(|t| (t * 5 + i as u32 * 11 + 1) % VOCAB));
    p
}

/// Outputs of one request run alone in a roomy scheduler with the same length limit.
fn run_alone(
    cfg: &SchedulerConfig,
    max_len: usize,
    id: &str,
    prompt: &[u32],
    params: &SamplingParams,
) -> Vec<u32> {
    let roomy = SchedulerConfig {
        num_blocks: max_len.div_ceil(cfg.block_size) + 8,
        max_model_len: max_len,
        max_num_batched_tokens: cfg.max_num_batched_tokens.max(max_len),
        ..cfg.clone()
    };
    let mut s = Scheduler::new(roomy).unwrap();
    s.add_request(Request::new(
        id,
        prompt.to_vec(),
        params.clone().checked(usize::MAX).unwrap(),
        vec![EOS],
    ))
    .unwrap();
    let mut runner = FakeRunner::new(cfg.block_size, VOCAB);
    let mut got = Vec::new();
    while s.has_unfinished_requests() {
        let out = s.schedule();
        let res = runner.execute(&out).unwrap();
        for o in s.update_from_output(&out, &res) {
            got.extend(o.new_token_ids);
        }
    }
    assert_eq!(s.num_preemptions(), 0);
    got
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn scheduler_random_workloads(
        cfg in config(),
        specs in prop::collection::vec(spec(), 1..14),
        defer_every in prop::sample::select(vec![0usize, 0, 2, 3]),
        spec_k in prop::sample::select(vec![0usize, 2, 4]),
    ) {
        let mut s = Scheduler::new(cfg.clone()).unwrap();
        let mut runner = FakeRunner::new(cfg.block_size, VOCAB);
        // Rows deferred by the runner (late grammar masks) change when tokens come,
        // never which: the outputs below must still equal the reference.
        runner.defer_every = defer_every;
        // Speculation (drafts verified in one step, rejected ones rolled back) must
        // not change the outputs either. The real runner never defers a row that
        // speculates (grammars disable speculation), so neither is combined here.
        runner.spec_k = if defer_every == 0 { spec_k } else { 0 };
        let mut outputs: HashMap<String, Vec<u32>> = HashMap::new();
        let mut finished: HashMap<String, bool> = HashMap::new();
        let mut accepted: Vec<(String, Vec<u32>, SamplingParams)> = Vec::new();
        let mut names: HashMap<pagoda_core::ReqHandle, String> = HashMap::new();
        let mut aborted: Vec<String> = Vec::new();
        // Requests past their prompt (an output token came since their last
        // admission): a step that decodes one of them caps its prompt tokens.
        let mut decoding: std::collections::HashSet<pagoda_core::ReqHandle> = Default::default();
        let last_arrival = specs.iter().map(|s| s.arrival).max().unwrap_or(0);
        let mut step = 0;
        loop {
            for (i, sp) in specs.iter().enumerate() {
                let id = format!("r{i}");
                if sp.arrival == step {
                    let prompt = prompt_of(sp, i);
                    let params = SamplingParams {
                        stop_token_ids: sp.stop_token.into_iter().collect(),
                        min_tokens: sp.min_tokens,
                        ignore_eos: sp.ignore_eos,
                        ..SamplingParams::greedy(sp.max_tokens)
                    };
                    let req = Request::new(id.clone(), prompt.clone(), params.clone().checked(usize::MAX).unwrap(), vec![EOS])
                        .with_priority(sp.priority)
                        .with_cache_salt(sp.salt.then(|| "tenant".to_string()))
                        .with_group(sp.group);
                    match s.add_request(req) {
                        Ok(h) => {
                            names.insert(h, id.clone());
                            accepted.push((id.clone(), prompt, params));
                        }
                        Err(SchedulerError::PromptTooLong { .. }) => prop_assert!(prompt.len() + 1 > cfg.max_model_len),
                        Err(SchedulerError::ExceedsKvCache { num_blocks_needed, num_usable_blocks, .. }) => {
                            prop_assert!(num_blocks_needed > num_usable_blocks)
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
                if sp.abort_at == Some(step) && s.abort_request(&id) {
                    decoding.retain(|h| names.get(h) != Some(&id));
                    aborted.push(id);
                }
            }
            if !s.has_unfinished_requests() && step > last_arrival {
                break;
            }
            // Before the step: streams decoding, and requests that could start (a burst
            // of more starting than decoding lifts the prompt cap).
            let num_decoding = decoding.len();
            let num_starting = s.num_waiting().min(cfg.max_num_seqs.saturating_sub(s.num_running()))
                + (s.num_running() - num_decoding);
            let out = s.schedule();
            prop_assert!(out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens);
            prop_assert!(out.num_scheduled_tokens.len() <= cfg.max_num_seqs);
            prop_assert!(s.num_running() <= cfg.max_num_seqs);
            if cfg.enable_chunked_prefill && cfg.long_prefill_token_threshold > 0 {
                prop_assert!(out.num_scheduled_tokens.iter().all(|(_, n)| *n <= cfg.long_prefill_token_threshold));
            }
            for h in &out.preempted_reqs {
                decoding.remove(h);
            }
            if cfg.enable_chunked_prefill && cfg.max_prefill_tokens_with_decodes > 0 {
                // Prompt tokens: a row's tokens beyond its one known token and drafts.
                let known = |h: &pagoda_core::ReqHandle, n: usize| {
                    let drafts = out.scheduled_spec_decode_tokens.iter()
                        .find(|(x, _)| x == h).map_or(0, |(_, d)| d.len());
                    n - drafts
                };
                let decodes = out.num_scheduled_tokens.iter()
                    .any(|(h, n)| decoding.contains(h) && known(h, *n) == 1);
                let prompt: usize = out.num_scheduled_tokens.iter()
                    .map(|(h, n)| known(h, *n)).filter(|&k| k > 1).sum();
                let burst = num_starting > num_decoding;
                prop_assert!(!decodes || burst || prompt <= cfg.max_prefill_tokens_with_decodes,
                    "{} prompt tokens in a step that decodes (cap {}, {} decoding, {} starting)",
                    prompt, cfg.max_prefill_tokens_with_decodes, num_decoding, num_starting);
            }
            let res = runner.execute(&out).map_err(TestCaseError::fail)?;
            for o in s.update_from_output(&out, &res) {
                let id = names[&o.handle].clone();
                prop_assert!(!finished.contains_key(&id), "output after finish");
                outputs.entry(id.clone()).or_default().extend(&o.new_token_ids);
                if !o.new_token_ids.is_empty() {
                    decoding.insert(o.handle);
                }
                if o.finish_reason.is_some() {
                    decoding.remove(&o.handle);
                    finished.insert(id, true);
                }
            }
            s.check_invariants().map_err(TestCaseError::fail)?;
            step += 1;
            prop_assert!(step < 20_000, "no progress");
        }
        // Flush finished ids to the runner: it must end with no state.
        runner.execute(&s.schedule()).map_err(TestCaseError::fail)?;
        prop_assert_eq!(runner.num_requests(), 0);
        for (id, prompt, params) in &accepted {
            let got = outputs.get(id).cloned().unwrap_or_default();
            let want = reference_generate(prompt, params, &[EOS], s.max_len(), VOCAB);
            if aborted.contains(id) {
                prop_assert!(want.starts_with(&got), "{}: aborted outputs diverge", id);
            } else {
                prop_assert!(finished.contains_key(id), "{} never finished", id);
                prop_assert_eq!(&got, &want, "{} outputs differ", id);
                // The same request alone, with a cache big enough to never preempt.
                prop_assert_eq!(&run_alone(&cfg, s.max_len(), id, prompt, params), &want);
            }
        }
        let kv = s.kv_cache_manager();
        prop_assert_eq!(kv.num_free_blocks(), cfg.num_blocks - 1);
        prop_assert_eq!(kv.num_requests(), 0);
        s.check_invariants().map_err(TestCaseError::fail)?;
    }
}
