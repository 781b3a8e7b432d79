//! Speculative decoding (n-gram) on the real model: greedy output is the same token
//! for token with and without `--speculative-config` (the verify rows' logits are
//! bit-identical to decode rows' by batch invariance), under preemption and chunked
//! prefill too, with logprobs and penalties; drafts are accepted on input-grounded
//! prompts; every block is free afterwards.

use pagoda_core::SamplingParams;
use pagoda_engine::spec::SpeculativeConfig;
use pagoda_engine::{EngineConfig, GenerateOutput, LLMEngine, PromptInput};
use pagoda_tests::{engine, model_path, reference_cases, test_config};

/// Prompts whose continuation copies from the prompt (where n-gram drafts hit), and
/// the reference prompts (ordinary text).
fn prompts() -> Vec<PromptInput> {
    let passage = "The committee met on Tuesday to review the budget. The budget for the \
                   new library was approved, and the budget for the park was postponed.";
    let mut p: Vec<PromptInput> = [
        format!("Repeat the following text exactly.\nText: {passage}\nRepeated text: {passage}\nRepeated text again:"),
        "fn add(a: i32, b: i32) -> i32 { a + b }\nfn sub(a: i32, b: i32) -> i32 { a - b }\nfn mul(a: i32, b: i32) -> i32 {".to_string(),
    ]
    .into_iter()
    .map(PromptInput::Text)
    .collect();
    p.extend(
        reference_cases()
            .into_iter()
            .map(|c| PromptInput::Text(c.prompt)),
    );
    p
}

fn spec(k: usize) -> SpeculativeConfig {
    SpeculativeConfig::parse(&format!(
        r#"{{"method":"ngram","num_speculative_tokens":{k},"prompt_lookup_min":2,"prompt_lookup_max":4}}"#
    ))
    .expect("valid config")
}

fn run(
    mut config: EngineConfig,
    spec_config: Option<SpeculativeConfig>,
    params: &SamplingParams,
) -> (Vec<GenerateOutput>, LLMEngine) {
    config.speculative_config = spec_config;
    let mut e = engine(config);
    let outs = e.generate(&prompts(), params).expect("generate");
    assert!(!e.has_unfinished_requests());
    let s = e.stats();
    assert_eq!(s.kv_cache_usage, 0.0, "KV blocks still in use");
    (outs, e)
}

fn assert_same(a: &[GenerateOutput], b: &[GenerateOutput], label: &str) {
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            x.token_ids, y.token_ids,
            "[{label}] tokens of {:?}",
            x.prompt
        );
        assert_eq!(x.text, y.text, "[{label}] text of {:?}", x.prompt);
        assert_eq!(
            x.finish_reason, y.finish_reason,
            "[{label}] finish of {:?}",
            x.prompt
        );
    }
}

#[test]
fn greedy_is_identical_with_ngram_speculation() {
    let params = SamplingParams::greedy(48);
    let (plain, _) = run(test_config(), None, &params);
    let (sped, e) = run(test_config(), Some(spec(4)), &params);
    assert_same(&plain, &sped, "k=4");
    let s = e.stats().spec_decoding;
    assert!(s.num_drafts > 0, "no drafts were proposed: {s:?}");
    assert!(
        s.num_accepted_tokens > 0,
        "no draft was accepted on the copying prompts: {s:?}"
    );
    assert_eq!(
        s.num_accepted_tokens,
        s.num_accepted_tokens_per_pos.iter().sum::<u64>(),
        "per-position counts add up to the accepted tokens"
    );
}

/// The model drafting for itself: the draft's greedy tokens are the target's, so
/// every draft is accepted (the draft's catch-up and per-step decode keep its cache
/// in step with the target's), and the output is the same token for token.
#[test]
fn greedy_is_identical_with_a_draft_model() {
    let params = SamplingParams::greedy(32);
    let (plain, _) = run(test_config(), None, &params);
    let draft = SpeculativeConfig::parse(&format!(
        r#"{{"method":"draft_model","model":{:?},"num_speculative_tokens":3}}"#,
        model_path().display().to_string()
    ))
    .expect("valid config");
    let (sped, e) = run(test_config(), Some(draft), &params);
    assert_same(&plain, &sped, "draft k=3");
    let s = e.stats().spec_decoding;
    assert!(s.num_drafts > 0, "no drafts were proposed: {s:?}");
    assert_eq!(
        s.num_accepted_tokens, s.num_draft_tokens,
        "a model drafting for itself has every draft accepted: {s:?}"
    );
}

/// A draft model that cannot be loaded is a clear start-up error, not a panic.
#[test]
fn a_missing_draft_model_is_refused_at_start() {
    let mut config = test_config();
    config.speculative_config = Some(
        SpeculativeConfig::parse(
            r#"{"method":"draft_model","model":"/nonexistent/draft.gguf","num_speculative_tokens":2}"#,
        )
        .expect("valid config"),
    );
    let err = match LLMEngine::new(config) {
        Ok(_) => panic!("a missing draft model must be refused"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("draft model"), "{err}");
}

#[test]
fn greedy_is_identical_under_preemption_and_chunking() {
    let params = SamplingParams::greedy(40);
    let (plain, _) = run(test_config(), None, &params);
    let mut c = test_config();
    c.num_kv_blocks = Some(40);
    c.block_size = 4;
    let (sped, e) = run(c, Some(spec(3)), &params);
    assert_same(&plain, &sped, "preemption");
    assert!(
        e.stats().num_preemptions > 0,
        "40 blocks of 4 should force preemption"
    );
    let mut c = test_config();
    c.max_num_batched_tokens = 6;
    let (sped, _) = run(c, Some(spec(5)), &params);
    assert_same(&plain, &sped, "budget 6");
}

#[test]
fn logprobs_and_penalties_are_unchanged() {
    let params = SamplingParams {
        logprobs: Some(3),
        repetition_penalty: 1.1,
        frequency_penalty: 0.2,
        ..SamplingParams::greedy(32)
    };
    let plain = {
        let mut e = engine(test_config());
        let ids = e.tokenizer().encode(&prompt_text(), true).unwrap();
        collect(&mut e, ids.clone(), &params)
    };
    let mut c = test_config();
    c.speculative_config = Some(spec(4));
    let mut e = engine(c);
    let ids = e.tokenizer().encode(&prompt_text(), true).unwrap();
    let sped = collect(&mut e, ids, &params);
    assert_eq!(plain.0, sped.0, "tokens");
    assert_eq!(plain.1.len(), sped.1.len(), "one logprobs entry per token");
    for (a, b) in plain.1.iter().zip(&sped.1) {
        assert_eq!(a, b, "logprobs");
    }
    assert!(e.stats().spec_decoding.num_drafts > 0);
}

fn prompt_text() -> String {
    match &prompts()[0] {
        PromptInput::Text(t) => t.clone(),
        PromptInput::Tokens(_) => unreachable!(),
    }
}

/// Streams one request to the end: its tokens and logprobs.
fn collect(
    e: &mut LLMEngine,
    ids: Vec<u32>,
    params: &SamplingParams,
) -> (Vec<u32>, Vec<pagoda_core::TokenLogprobs>) {
    e.add_request(
        "r".to_string(),
        PromptInput::Tokens(ids),
        params.clone(),
        None,
    )
    .expect("add");
    let (mut toks, mut lps) = (Vec::new(), Vec::new());
    while e.has_unfinished_requests() {
        for o in e.step().expect("step") {
            toks.extend(o.new_token_ids);
            lps.extend(o.new_logprobs);
        }
    }
    (toks, lps)
}
