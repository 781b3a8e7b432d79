//! The engine on the real model: reference greedy ids under every scheduling regime,
//! batch invariance, prefix caching, and no leaked blocks.

use pagoda_core::SamplingParams;
use pagoda_engine::{LLMEngine, PromptInput};
use pagoda_tests::{engine, reference_cases, test_config};

fn check_reference(engine: &mut LLMEngine, label: &str) {
    let cases = reference_cases();
    let prompts: Vec<PromptInput> = cases
        .iter()
        .map(|c| PromptInput::Text(c.prompt.clone()))
        .collect();
    let outs = engine
        .generate(&prompts, &SamplingParams::greedy(48))
        .expect("generate");
    for (c, o) in cases.iter().zip(&outs) {
        assert_eq!(
            o.prompt_token_ids, c.prompt_ids,
            "[{label}] prompt ids of {:?}",
            c.prompt
        );
        let n = c.safe_len.min(o.token_ids.len());
        assert!(
            o.token_ids.len() >= c.safe_len,
            "[{label}] {:?}: only {} tokens",
            c.prompt,
            o.token_ids.len()
        );
        assert_eq!(
            &o.token_ids[..n],
            &c.greedy_ids[..n],
            "[{label}] greedy ids of {:?}",
            c.prompt
        );
    }
    assert_all_blocks_free(engine, label);
}

fn assert_all_blocks_free(engine: &LLMEngine, label: &str) {
    assert!(!engine.has_unfinished_requests(), "[{label}] requests left");
    let s = engine.stats();
    assert_eq!(s.kv_cache_usage, 0.0, "[{label}] KV blocks still in use");
    assert_eq!(
        s.num_running + s.num_waiting,
        0,
        "[{label}] requests still queued"
    );
}

#[test]
fn greedy_matches_reference_default() {
    check_reference(&mut engine(test_config()), "default");
}

#[test]
fn greedy_matches_reference_under_preemption() {
    // With 16-token blocks, 24 blocks (23 usable: block 0 is the null block) hold all
    // three requests; with 4-token blocks each request needs ~15 of them, so the three
    // cannot run together and the scheduler must preempt and recompute.
    let mut c = test_config();
    c.num_kv_blocks = Some(24);
    check_reference(&mut engine(c), "num_kv_blocks=24");
    let mut c = test_config();
    c.num_kv_blocks = Some(24);
    c.block_size = 4;
    let mut e = engine(c);
    check_reference(&mut e, "num_kv_blocks=24 block_size=4");
    assert!(
        e.stats().num_preemptions > 0,
        "24 blocks of 4 tokens should force preemption"
    );
}

#[test]
fn greedy_matches_reference_chunked_prefill() {
    let mut c = test_config();
    c.max_num_batched_tokens = 8;
    check_reference(&mut engine(c), "max_num_batched_tokens=8");
}

#[test]
fn greedy_matches_reference_without_prefix_caching() {
    let mut c = test_config();
    c.enable_prefix_caching = false;
    check_reference(&mut engine(c), "no prefix caching");
}

#[test]
fn greedy_matches_reference_on_every_cpu_backend() {
    for backend in [
        "naive",
        "decode=naive,prefill=flash",
        "decode=paged,prefill=flash",
    ] {
        let mut c = test_config();
        c.attention_backend = Some(backend.to_string());
        check_reference(&mut engine(c), backend);
    }
}

#[test]
fn forced_backend_errors_are_explained() {
    let mut c = test_config();
    c.attention_backend = Some("paged".into());
    let err = LLMEngine::new(c)
        .err()
        .expect("paged alone cannot prefill")
        .to_string();
    assert!(err.contains("prefill"), "{err}");
    let mut c = test_config();
    c.attention_backend = Some("no-such-backend".into());
    let err = LLMEngine::new(c)
        .err()
        .expect("unknown backend")
        .to_string();
    for name in ["naive", "paged", "flash"] {
        assert!(err.contains(name), "error should list `{name}`: {err}");
    }
}

/// 32 requests at once each give the same tokens as the request run alone.
#[test]
fn concurrent_requests_equal_solo_runs() {
    let prompts: Vec<String> = (0..32)
        .map(|i| {
            format!(
                "Request {i}: write a short note about the number {} and the colour {}.",
                i * 7 + 3,
                ["red", "green", "blue", "gold"][i % 4]
            )
        })
        .collect();
    let params = SamplingParams {
        max_tokens: Some(12),
        temperature: 0.8,
        seed: Some(1234),
        ..SamplingParams::default()
    };
    let mut e = engine(test_config());
    let inputs: Vec<PromptInput> = prompts.iter().cloned().map(PromptInput::Text).collect();
    let together = e.generate(&inputs, &params).unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let alone = e
            .generate(&[PromptInput::Text(p.clone())], &params)
            .unwrap();
        assert_eq!(
            alone[0].token_ids, together[i].token_ids,
            "request {i} differs when batched"
        );
    }
    assert_all_blocks_free(&e, "concurrent");
}

/// A request sharing a 64-token prefix with a finished one hits the cache and
/// produces the same output as with caching off.
#[test]
fn prefix_cache_hit_gives_same_output() {
    let shared: Vec<u32> = (0..64).map(|i| 1000 + (i * 37 % 500) as u32).collect();
    let mut first = shared.clone();
    first.extend([42, 43, 44]);
    let mut second = shared.clone();
    second.extend([7, 8, 9, 10]);
    let params = SamplingParams::greedy(8);

    let mut cached = engine(test_config());
    cached
        .generate(&[PromptInput::Tokens(first)], &params)
        .unwrap();
    let hit = cached
        .generate(&[PromptInput::Tokens(second.clone())], &params)
        .unwrap();
    assert!(
        hit[0].num_cached_tokens >= 48,
        "only {} cached prompt tokens",
        hit[0].num_cached_tokens
    );
    assert_all_blocks_free(&cached, "prefix cached");

    let mut c = test_config();
    c.enable_prefix_caching = false;
    let mut uncached = engine(c);
    let miss = uncached
        .generate(&[PromptInput::Tokens(second)], &params)
        .unwrap();
    assert_eq!(miss[0].num_cached_tokens, 0);
    assert_eq!(hit[0].token_ids, miss[0].token_ids);
}

/// Aborting requests mid-flight frees every block.
#[test]
fn aborts_free_all_blocks() {
    let mut e = engine(test_config());
    let params = SamplingParams {
        max_tokens: Some(64),
        ignore_eos: true,
        ..SamplingParams::greedy(64)
    };
    for i in 0..6 {
        e.add_request(
            format!("r{i}"),
            PromptInput::Text(format!("Count slowly from {i}:")),
            params.clone(),
            None,
        )
        .unwrap();
    }
    for _ in 0..3 {
        e.step().unwrap();
    }
    for i in 0..3 {
        e.abort_request(&format!("r{i}"));
    }
    while e.has_unfinished_requests() {
        e.step().unwrap();
    }
    assert_all_blocks_free(&e, "aborts");
}

#[test]
fn bad_inputs_get_clear_errors() {
    let mut c = test_config();
    c.max_model_len = Some(64);
    let mut e = engine(c);
    let long = "word ".repeat(200);
    let err = e
        .add_request(
            "long".into(),
            PromptInput::Text(long),
            SamplingParams::greedy(4),
            None,
        )
        .unwrap_err();
    assert!(err.to_string().contains("context length"), "{err}");
    let err = e
        .add_request(
            "empty".into(),
            PromptInput::Tokens(vec![]),
            SamplingParams::greedy(4),
            None,
        )
        .unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    let err = e
        .add_request(
            "oov".into(),
            PromptInput::Tokens(vec![999_999]),
            SamplingParams::greedy(4),
            None,
        )
        .unwrap_err();
    assert!(err.to_string().contains("vocabulary"), "{err}");

    let mut c = test_config();
    c.model_path = "/nonexistent/model.gguf".into();
    let err = LLMEngine::new(c).err().unwrap().to_string();
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
}

/// Prompt logprobs of the reference prompts, one per prompt token after the first.
fn prompt_logprobs(config: pagoda_engine::EngineConfig, label: &str) -> Vec<Vec<(u32, f32)>> {
    let cases = reference_cases();
    let prompts: Vec<PromptInput> = cases
        .iter()
        .map(|c| PromptInput::Text(c.prompt.clone()))
        .collect();
    let mut params = SamplingParams::greedy(8);
    params.prompt_logprobs = Some(2);
    let mut e = engine(config);
    let outs = e.generate(&prompts, &params).expect("generate");
    assert_all_blocks_free(&e, label);
    cases
        .iter()
        .zip(outs)
        .map(|(c, o)| {
            let n = c.safe_len.min(8);
            assert_eq!(o.token_ids[..n], c.greedy_ids[..n], "[{label}] greedy ids");
            let lps = o.prompt_logprobs.expect("prompt logprobs");
            let ids: Vec<u32> = lps.iter().map(|p| p.token_id).collect();
            assert_eq!(
                ids,
                c.prompt_ids[1..],
                "[{label}] one entry per prompt token"
            );
            for p in &lps {
                assert_eq!(p.top.len(), 2, "[{label}]");
                assert!(p.logprob <= 0.0 && p.rank >= 1, "[{label}] {p:?}");
                assert!(p.top[0].1 >= p.top[1].1 && p.logprob <= p.top[0].1 + 1e-6);
            }
            lps.iter().map(|p| (p.token_id, p.logprob)).collect()
        })
        .collect()
}

#[test]
fn prompt_logprobs_survive_chunking_preemption_and_cache() {
    let want = prompt_logprobs(test_config(), "default");
    let mut chunked = test_config();
    chunked.max_num_batched_tokens = 8;
    let mut preempt = test_config();
    preempt.num_kv_blocks = Some(24);
    preempt.block_size = 4;
    let mut no_cache = test_config();
    no_cache.enable_prefix_caching = false;
    for (c, label) in [
        (chunked, "max_num_batched_tokens=8"),
        (preempt, "num_kv_blocks=24 block_size=4"),
        (no_cache, "no prefix caching"),
    ] {
        let got = prompt_logprobs(c, label);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.len(), w.len(), "[{label}]");
            for (a, b) in g.iter().zip(w) {
                assert_eq!(a.0, b.0, "[{label}]");
                assert!((a.1 - b.1).abs() < 1e-4, "[{label}] {a:?} vs {b:?}");
            }
        }
    }
}

/// `EngineConfig::seed` (vLLM's `--seed`): unseeded requests draw their seeds from
/// the engine's RNG in arrival order, so two engines with the same seed sample the
/// same tokens and another seed samples others.
#[test]
fn engine_seed_replays_unseeded_sampling() {
    let params = SamplingParams {
        temperature: 1.5,
        max_tokens: Some(16),
        ..SamplingParams::default()
    };
    let prompts = [
        PromptInput::Text("Once upon a time".into()),
        PromptInput::Text("The best thing about".into()),
    ];
    let run = |seed: u64| {
        let mut c = test_config();
        c.seed = seed;
        let outs = engine(c).generate(&prompts, &params).expect("generate");
        outs.into_iter().map(|o| o.token_ids).collect::<Vec<_>>()
    };
    let a = run(5);
    assert_ne!(a[0], a[1], "each request draws its own seed");
    assert_eq!(a, run(5), "the same engine seed replays the run");
    assert_ne!(a, run(6), "another seed samples differently");
}

/// A finished request's output carries its timeline: queued <= first scheduled <=
/// first token <= last token, with its token counts and effective `max_tokens`.
#[test]
fn finished_outputs_carry_request_metrics() {
    let mut e = engine(test_config());
    e.add_request(
        "m".into(),
        PromptInput::Text("The capital of France is".into()),
        SamplingParams::greedy(5),
        None,
    )
    .unwrap();
    let mut last = None;
    while e.has_unfinished_requests() {
        for o in e.step().unwrap() {
            assert_eq!(
                o.metrics.is_some(),
                o.finished,
                "metrics on the final output only"
            );
            if o.finished {
                last = o.metrics;
            }
        }
    }
    let m = last.expect("a final output");
    let (s, f, l) = (
        m.scheduled.unwrap(),
        m.first_token.unwrap(),
        m.last_token.unwrap(),
    );
    assert!(m.queued <= s && s < f && f <= l, "{m:?}");
    assert_eq!(m.num_generation_tokens, 5);
    assert_eq!(m.max_tokens, 5);
    assert!(m.num_prompt_tokens > 0);
    assert_eq!(
        m.inference_time().unwrap(),
        m.prefill_time().unwrap() + m.decode_time().unwrap()
    );
    let it = e.stats().iteration_tokens;
    assert_eq!(it.sum, (m.num_prompt_tokens + 5) as u64);
    assert_eq!(it.count, 5, "one prefill step and four decode steps");
}
