//! The engine-level batch-invariance check shared by `batch_invariance.rs` and
//! `batch_invariance_avx2.rs` (see the former's doc).

use pagoda_core::{KvCacheDtype, SamplingParams, TokenLogprobs};
use pagoda_engine::{EngineConfig, LLMEngine, PromptInput};
use pagoda_models::WeightDtype;
use pagoda_tests::{engine, test_config};
use std::collections::HashMap;

/// Generated tokens per request.
const TOKENS: usize = 8;

/// What a request produced: its tokens and, per token, the sampled token's logprob
/// and the top 20 as raw bits.
type Trace = Vec<Step>;

/// One generated token: its id, its logprob's bits, the top 20 (id, logprob bits).
type Step = (u32, u32, Vec<(u32, u32)>);

fn trace(lps: &[TokenLogprobs]) -> Trace {
    lps.iter()
        .map(|t| {
            let top = t.top.iter().map(|&(id, lp)| (id, lp.to_bits())).collect();
            (t.token_id, t.logprob.to_bits(), top)
        })
        .collect()
}

/// The target: ~300 tokens of text (more than one split).
fn target_prompt() -> String {
    let mut s = String::from("Here is a list of facts about rivers, one per line.\n");
    for i in 0..24 {
        s.push_str(&format!(
            "Fact {i}: the river number {} flows through {} valleys.\n",
            i * 13 + 7,
            i % 5 + 2
        ));
    }
    s.push_str("Now write one more fact:");
    s
}

/// 31 other requests of mixed lengths; some share the target's first line.
fn others() -> Vec<String> {
    (0..31)
        .map(|i| match i % 4 {
            0 => format!("Request {i}: a short note about the number {}.", i * 7 + 3),
            1 => format!(
                "Here is a list of facts about rivers, one per line.\nFact {i}: rivers {}",
                "are long and wide. ".repeat(i % 4 + 1)
            ),
            2 => "Tell me a story about a dragon who likes tea. ".repeat(i % 3 + 1),
            _ => format!("{i} + {i} ="),
        })
        .collect()
}

fn greedy() -> SamplingParams {
    SamplingParams {
        logprobs: Some(20),
        ignore_eos: true,
        ..SamplingParams::greedy(TOKENS)
    }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: Some(seed),
        logprobs: Some(20),
        ignore_eos: true,
        max_tokens: Some(TOKENS),
        ..SamplingParams::default()
    }
}

/// Runs `reqs` (id, prompt, params) to the end together; returns each one's trace
/// and how many prompt tokens it found cached.
fn run(
    e: &mut LLMEngine,
    reqs: &[(String, String, SamplingParams)],
) -> HashMap<String, (Trace, usize)> {
    for (id, p, params) in reqs {
        e.add_request(
            id.clone(),
            PromptInput::Text(p.clone()),
            params.clone(),
            None,
        )
        .expect("add_request");
    }
    let mut got: HashMap<String, (Vec<TokenLogprobs>, usize)> = HashMap::new();
    while e.has_unfinished_requests() {
        for o in e.step().expect("step") {
            assert!(o.error.is_none(), "{}: {:?}", o.request_id, o.error);
            let entry = got.entry(o.request_id.clone()).or_default();
            entry.0.extend(o.new_logprobs.iter().cloned());
            entry.1 = o.num_cached_tokens;
        }
    }
    got.into_iter()
        .map(|(id, (lps, cached))| {
            assert_eq!(lps.len(), TOKENS, "{id}: one logprobs entry per token");
            (id, (trace(&lps), cached))
        })
        .collect()
}

/// The target greedy and sampled, and the 31 others (greedy or sampled by index).
fn batch(tag: &str) -> Vec<(String, String, SamplingParams)> {
    let mut reqs: Vec<_> = others()
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let params = if i % 2 == 0 {
                greedy()
            } else {
                sampled(i as u64)
            };
            (format!("{tag}-other-{i}"), p, params)
        })
        .collect();
    // The targets in the middle of the batch.
    reqs.insert(11, (format!("{tag}-greedy"), target_prompt(), greedy()));
    reqs.insert(20, (format!("{tag}-sampled"), target_prompt(), sampled(77)));
    reqs
}

fn targets(tag: &str) -> Vec<(String, String, SamplingParams)> {
    vec![
        (format!("{tag}-greedy"), target_prompt(), greedy()),
        (format!("{tag}-sampled"), target_prompt(), sampled(77)),
    ]
}

fn config(weights: WeightDtype, kv: KvCacheDtype) -> EngineConfig {
    let mut c = test_config();
    c.weight_dtype = weights;
    c.kv_cache_dtype = kv;
    c
}

/// Panics at the first (request, token) whose trace differs, with both entries.
fn same(got: &[(String, Trace)], want: &[(String, Trace)], what: &str) {
    assert_eq!(
        got.iter().map(|g| &g.0).collect::<Vec<_>>(),
        want.iter().map(|w| &w.0).collect::<Vec<_>>(),
        "{what}: requests"
    );
    for ((id, g), (_, w)) in got.iter().zip(want) {
        if let Some(i) = (0..g.len().max(w.len())).find(|&i| g.get(i) != w.get(i)) {
            let f = |t: Option<&Step>| {
                t.map(|(id, lp, top)| {
                    let top: Vec<_> = top
                        .iter()
                        .take(3)
                        .map(|&(t, b)| (t, f32::from_bits(b)))
                        .collect();
                    format!("token {id}, logprob {}, top {top:?}..", f32::from_bits(*lp))
                })
            };
            panic!(
                "{what}: request {id} differs at generated token {i}: {:?} vs {:?}",
                f(g.get(i)),
                f(w.get(i))
            );
        }
    }
}

/// Every regime of the issue against the request alone, for one configuration;
/// `all` = false skips the prefix-cache and preemption regimes (a lighter run).
pub fn check(weights: WeightDtype, kv: KvCacheDtype, all: bool) {
    let label = format!("{weights:?} weights, {kv:?} KV");
    let base = config(weights, kv);
    let strip = |m: &HashMap<String, (Trace, usize)>, tag: &str| -> Vec<(String, Trace)> {
        let mut v: Vec<_> = m
            .iter()
            .map(|(id, (t, _))| (id.strip_prefix(tag).unwrap_or(id).to_string(), t.clone()))
            .collect();
        v.sort();
        v
    };

    // Alone, no prefix cache: the reference (each target on its own).
    let mut c = base.clone();
    c.enable_prefix_caching = false;
    let mut e = engine(c);
    let mut alone = Vec::new();
    for r in targets("alone") {
        alone.extend(strip(&run(&mut e, &[r]), "alone"));
    }
    alone.sort();
    assert_ne!(
        alone[0].1, alone[1].1,
        "[{label}] greedy and sampled differ"
    );

    // In a batch of 33 (the targets among 31 others).
    let batched = run(&mut e, &batch("b"));
    let in_batch: Vec<_> = strip(&batched, "b")
        .into_iter()
        .filter(|(id, _)| !id.contains("other"))
        .collect();
    same(&in_batch, &alone, &format!("[{label}] batched vs alone"));

    // Prompts in chunks of 8 tokens.
    let mut c = base.clone();
    c.enable_prefix_caching = false;
    c.max_num_batched_tokens = 8;
    let chunked = strip(&run(&mut engine(c), &targets("c")), "c");
    same(
        &chunked,
        &alone,
        &format!("[{label}] max_num_batched_tokens=8 vs alone"),
    );

    if !all {
        return;
    }

    // A prefix-cache hit: the second run finds the prompt's blocks cached.
    let mut e = engine(base.clone());
    let first = run(&mut e, &targets("p1"));
    let hit = run(&mut e, &targets("p2"));
    assert!(
        hit.values().all(|(_, cached)| *cached >= 256),
        "[{label}] the second run should hit the prefix cache: {:?}",
        hit.values().map(|v| v.1).collect::<Vec<_>>()
    );
    same(
        &strip(&first, "p1"),
        &alone,
        &format!("[{label}] first cached run"),
    );
    same(
        &strip(&hit, "p2"),
        &alone,
        &format!("[{label}] prefix-cache hit vs alone"),
    );

    // Preemption: a cache too small for the batch, so requests are recomputed. Every
    // request's trace equals its trace in the big batch above.
    let mut c = base;
    c.enable_prefix_caching = false;
    c.block_size = 16;
    c.num_kv_blocks = Some(48);
    let mut e = engine(c);
    let pre = run(&mut e, &batch("b"));
    assert!(
        e.stats().num_preemptions > 0,
        "[{label}] 48 blocks of 16 should force preemption"
    );
    same(
        &strip(&pre, "b"),
        &strip(&batched, "b"),
        &format!("[{label}] under preemption vs the big batch"),
    );
}
