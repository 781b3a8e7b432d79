//! Issue 27 on `emu` under vLLM's switch `VLLM_BATCH_INVARIANT=1` (set first, in
//! this binary's only test): `cuda-flash` then runs prompt rows with `cuda-paged`'s
//! fixed-split arithmetic, so the engine's selection declares invariance, and a
//! request's generated-token logprobs (top 5, as bits) are the same with its
//! prompt in one prefill step, in chunks of 4 tokens (chunked prefill: rows of a
//! chunk over cached context), after a prefix-cache hit, and when its generated
//! tokens are recomputed as prompt rows (what a preemption does): a position's
//! distribution from a prefill row equals the one its decode row gave. SmolLM2
//! with bf16 weights; the emulator is slow, so the prompt is short and 3 tokens
//! are made. Without the switch the recompute differs (flash's tiles against
//! paged's splits): the check fails.

use pagoda_core::{Device, SamplingParams};
use pagoda_engine::{EngineConfig, LLMEngine, PromptInput};
use pagoda_models::WeightDtype;
use pagoda_tests::{engine, reference_cases, test_config};

/// One generated token: its id and the top 5 (id, logprob bits).
type DecodeStep = (u32, Vec<(u32, u32)>);

const TOKENS: usize = 3;

fn config(max_batched: usize) -> EngineConfig {
    let mut c = test_config();
    c.device = Device::Emu;
    c.weight_dtype = WeightDtype::Bf16;
    c.kv_cache_bytes = 32 << 20;
    c.block_size = 4;
    c.max_num_seqs = 2;
    c.max_num_batched_tokens = max_batched;
    c
}

fn run(e: &mut LLMEngine, id: &str, prompt: PromptInput) -> (Vec<DecodeStep>, usize) {
    let params = SamplingParams {
        logprobs: Some(5),
        ignore_eos: true,
        ..SamplingParams::greedy(TOKENS)
    };
    e.add_request(id.into(), prompt, params, None).unwrap();
    let (mut got, mut cached) = (Vec::new(), 0);
    while e.has_unfinished_requests() {
        for o in e.step().expect("step on emu") {
            assert!(o.error.is_none(), "{:?}", o.error);
            cached = o.num_cached_tokens;
            for t in &o.new_logprobs {
                let top = t.top.iter().map(|&(i, lp)| (i, lp.to_bits())).collect();
                got.push((t.token_id, top));
            }
        }
    }
    (got, cached)
}

#[test]
fn emu_logprobs_are_the_same_bits_chunked_and_after_a_prefix_hit() {
    // SAFETY: the only test of this binary, run before any thread of ours reads
    // the environment (the engine and its pools start below).
    unsafe { std::env::set_var("VLLM_BATCH_INVARIANT", "1") };
    let prompt = reference_cases()[1].prompt.clone();

    let mut whole = engine(config(2048));
    let text = || PromptInput::Text(prompt.clone());
    let (alone, _) = run(&mut whole, "alone", text());
    assert_eq!(alone.len(), TOKENS);
    // The same prompt again: its full blocks come from the prefix cache.
    let (hit, cached) = run(&mut whole, "hit", text());
    assert!(cached > 0, "no prefix hit");
    assert_eq!(hit, alone, "after a prefix hit of {cached} tokens");
    // The first generated token recomputed as a prompt row: the next position's
    // distribution (a prefill row now, a decode row before) is the same.
    let mut ids = whole.tokenizer().encode(&prompt, true).unwrap();
    ids.push(alone[0].0);
    let (again, _) = run(&mut whole, "recomputed", PromptInput::Tokens(ids));
    assert_eq!(again[..TOKENS - 1], alone[1..], "recomputed as prompt rows");

    let mut chunked = engine(config(4));
    let (c, _) = run(&mut chunked, "chunked", text());
    assert_eq!(c, alone, "prompt in chunks of 4 tokens");
}
