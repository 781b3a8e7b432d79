//! Speculative decoding (n-gram) on the `emu` device: the CUDA backends serve a verify
//! run's rows as the decode rows they are (`serves_verify_runs` is `false` for them; the
//! conformance kit's `VerifyRuns` check compares those rows with the reference on `emu`),
//! so with the device forward's decode rows batch-invariant (fixed splits in
//! `cuda-paged`, the host GEMMs' fixed order) greedy output is the same token for token
//! with and without `--speculative-config`, drafts are proposed and kept, and every KV
//! block is free afterwards (the rejected tokens' slots rolled back). SmolLM2 with bf16
//! weights; the emulator runs one OS thread per CUDA thread, so the prompt is short.

use pagoda_core::{Device, SamplingParams};
use pagoda_engine::spec::SpeculativeConfig;
use pagoda_engine::{EngineConfig, GenerateOutput, PromptInput};
use pagoda_models::WeightDtype;
use pagoda_tests::{engine, test_config};

/// Tokens generated per request.
const TOKENS: usize = 8;

fn config(spec: Option<SpeculativeConfig>) -> EngineConfig {
    let mut c = test_config();
    c.device = Device::Emu;
    c.weight_dtype = WeightDtype::Bf16;
    c.kv_cache_bytes = 32 << 20;
    c.max_num_seqs = 2;
    c.speculative_config = spec;
    c
}

/// A prompt whose continuation copies from it (n-gram drafts hit) and one that does not.
fn prompts() -> Vec<PromptInput> {
    vec![
        PromptInput::Text("one two three four five. one two three four five. one two".into()),
        PromptInput::Text("The capital of France is".into()),
    ]
}

fn generate(spec: Option<SpeculativeConfig>) -> (Vec<GenerateOutput>, pagoda_engine::LLMEngine) {
    let mut e = engine(config(spec));
    let outs = e
        .generate(&prompts(), &SamplingParams::greedy(TOKENS))
        .expect("generate on emu");
    assert!(!e.has_unfinished_requests());
    assert_eq!(e.stats().kv_cache_usage, 0.0, "KV blocks still in use");
    (outs, e)
}

#[test]
fn emu_greedy_is_identical_with_ngram_speculation() {
    let (plain, _) = generate(None);
    let spec = SpeculativeConfig::parse(
        r#"{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2,"prompt_lookup_max":3}"#,
    )
    .expect("valid config");
    let (sped, e) = generate(Some(spec));
    for (a, b) in plain.iter().zip(&sped) {
        assert_eq!(a.token_ids, b.token_ids, "tokens of {:?}", a.prompt);
        assert_eq!(a.finish_reason, b.finish_reason, "finish of {:?}", a.prompt);
    }
    let s = e.stats().spec_decoding;
    assert!(s.num_drafts > 0, "no drafts were proposed on emu: {s:?}");
    assert!(
        s.num_accepted_tokens > 0,
        "no draft was accepted on the copying prompt: {s:?}"
    );
}
