//! Issue 29 D7: one request's expensive grammar masks must not stall the other
//! rows of the batch, plain or constrained. A step waits for masks only within a bound after its forward
//! pass; a constrained row whose mask is late is deferred to a later step, and
//! deferring never changes any row's tokens.
//!
//! The expensive grammar is made reproducible with the runner's test-only
//! `slow_mask` fault (each mask of the marked request takes 1 s longer), so the
//! test does not depend on how fast this machine computes real masks.

use pagoda_core::{Constraint, SamplingParams, StructuredOutputs};
use pagoda_engine::runner::FaultInjection;
use pagoda_engine::{LLMEngine, PromptInput};
use pagoda_tests::{engine, test_config};
use std::collections::HashMap;
use std::time::Duration;

const SLOW: Duration = Duration::from_secs(1);

fn tokens(e: &LLMEngine, text: &str) -> Vec<u32> {
    e.tokenizer().encode(text, true).expect("encode")
}

fn constrained(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        structured_outputs: Some(
            StructuredOutputs::new(Constraint::Regex("[a-z]+( [a-z]+)*".into())).into(),
        ),
        ..SamplingParams::greedy(max_tokens)
    }
}

fn plain(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    }
}

/// Each request's tokens, by id.
type Outputs = HashMap<String, Vec<u32>>;
/// After each step, how many tokens every request had.
type Timeline = Vec<HashMap<String, usize>>;

/// Runs requests to the end.
fn run(e: &mut LLMEngine, reqs: &[(&str, Vec<u32>, SamplingParams)]) -> (Outputs, Timeline) {
    for (id, prompt, params) in reqs {
        e.add_request(
            id.to_string(),
            PromptInput::Tokens(prompt.clone()),
            params.clone(),
            None,
        )
        .expect("add_request");
    }
    let mut out: HashMap<String, Vec<u32>> =
        reqs.iter().map(|r| (r.0.to_string(), vec![])).collect();
    let mut timeline = Vec::new();
    while e.has_unfinished_requests() {
        for o in e.step().expect("step") {
            assert_eq!(o.error, None, "{} failed", o.request_id);
            out.get_mut(&o.request_id).unwrap().extend(&o.new_token_ids);
        }
        timeline.push(out.iter().map(|(k, v)| (k.clone(), v.len())).collect());
    }
    (out, timeline)
}

#[test]
fn a_slow_grammar_delays_only_its_own_rows() {
    let mut e = engine(test_config());
    let marker = tokens(&e, "Slow grammar:");
    let rest = tokens(&e, " the list of fruits is");
    let slow_prompt: Vec<u32> = marker.iter().chain(&rest).copied().collect();
    let other_prompt = tokens(&e, "Once upon a time there was");
    let fast_prompt = tokens(&e, "My favourite animals are");

    // Reference: each request alone, no fault.
    let (alone_slow, _) = run(&mut e, &[("ref-a", slow_prompt.clone(), constrained(3))]);
    let (alone_other, _) = run(&mut e, &[("ref-b", other_prompt.clone(), plain(12))]);
    let (alone_fast, _) = run(&mut e, &[("ref-c", fast_prompt.clone(), constrained(8))]);

    e.core_mut().set_fault_injection(Some(FaultInjection {
        slow_mask: Some((marker, SLOW)),
        ..Default::default()
    }));
    let before = e.core().mask_stats();
    let (both, timeline) = run(
        &mut e,
        &[
            ("a", slow_prompt, constrained(3)),
            ("b", other_prompt, plain(12)),
            ("c", fast_prompt, constrained(8)),
        ],
    );
    // Deferring changes when tokens come, never which.
    assert_eq!(both["a"], alone_slow["ref-a"]);
    assert_eq!(both["b"], alone_other["ref-b"]);
    assert_eq!(both["c"], alone_fast["ref-c"]);
    // The plain stream did not wait a second per step for the slow masks: by the
    // step the slow request got its first token (after one slow mask, 1 s), the
    // plain one had several. Waiting for every mask (the old way) moved them in
    // lockstep, one token each.
    let first_a = timeline
        .iter()
        .find(|t| t["a"] >= 1)
        .expect("the slow request produced a token");
    assert!(
        first_a["b"] >= 4,
        "the plain request had {} tokens when the slow one got its first: it waited for the slow masks",
        first_a["b"]
    );
    // Nor did the other constrained request (its masks are fast).
    let want_c = both["c"].len().min(4);
    assert!(
        first_a["c"] >= want_c,
        "the fast constrained request had {} tokens (of {want_c}) when the slow one got its first",
        first_a["c"]
    );
    let stats = e.core().mask_stats();
    assert!(stats.deferred > before.deferred, "{stats:?}");
    assert_eq!(e.core().num_grammars(), 0, "grammars left behind");
}
