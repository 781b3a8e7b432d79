//! Property tests of the sampler against a slow, obviously correct reference that
//! sorts the whole vocabulary and works in f64, following the rules stated in the
//! `sampler` module doc.

use std::collections::{BTreeSet, HashMap};

use pagoda_core::{CheckedParams, SamplingParams, TokenLogprobs};
use pagoda_engine::sampler::{counter_uniform, SampleInput, Sampler, SamplerError};
use proptest::prelude::*;

/// One request as the tests describe it (owning what `SampleInput` borrows).
#[derive(Debug, Clone)]
struct Case {
    params: SamplingParams,
    prompt: Vec<u32>,
    output: Vec<u32>,
    seed: u64,
    eos: Vec<u32>,
}

impl Case {
    /// The parameters as the engine hands them to the sampler: checked once.
    fn checked(&self, vocab: usize) -> CheckedParams {
        self.params.clone().checked(vocab).expect("valid case")
    }

    fn input<'a>(&'a self, params: &'a CheckedParams) -> SampleInput<'a> {
        SampleInput {
            params,
            prompt_ids: &self.prompt,
            output_ids: &self.output,
            seed: self.seed,
            eos_ids: &self.eos,
        }
    }
}

struct RefResult {
    token: u32,
    processed: Vec<f32>,
    logprobs: Option<TokenLogprobs>,
}

/// vLLM's bad-words rule, spelt out: the output's last `len - 1` tokens equal the
/// word's first `len - 1`.
fn ban_bad_words(l: &mut [f32], case: &Case) {
    for w in case.params.bad_words_token_ids.iter() {
        let k = w.len() - 1;
        let out = &case.output;
        if out.len() >= k && out[out.len() - k..] == w[..k] {
            l[w[k] as usize] = f32::NEG_INFINITY;
        }
    }
}

/// The reference: every step written out plainly, full sorts, f64 probabilities.
fn reference(logits: &[f32], case: &Case, u: f64) -> RefResult {
    let p = &case.params;
    let v = logits.len();
    let mut l = logits.to_vec();
    ban_bad_words(&mut l, case);
    for &(t, b) in p.logit_bias.iter() {
        l[t as usize] += b;
    }
    if case.output.len() < p.min_tokens {
        let mut stops: Vec<u32> = p.stop_token_ids.to_vec();
        if !p.ignore_eos {
            stops.extend(&case.eos);
        }
        for t in stops {
            if (t as usize) < v {
                l[t as usize] = f32::NEG_INFINITY;
            }
        }
    }
    let seen: BTreeSet<u32> = case.prompt.iter().chain(&case.output).copied().collect();
    for t in seen {
        let x = &mut l[t as usize];
        *x = if *x > 0.0 {
            *x / p.repetition_penalty
        } else {
            *x * p.repetition_penalty
        };
    }
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in &case.output {
        *counts.entry(t).or_default() += 1;
    }
    for (t, x) in l.iter_mut().enumerate() {
        let c = counts.get(&(t as u32)).copied().unwrap_or(0);
        *x -= p.frequency_penalty * c as f32;
        *x -= p.presence_penalty * if c > 0 { 1.0 } else { 0.0 };
    }

    // All ids sorted by (logit desc, id asc).
    let mut by_logit: Vec<u32> = (0..v as u32).collect();
    by_logit.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
    let max = l[by_logit[0] as usize];

    let token = if p.temperature < 1e-5 {
        by_logit[0]
    } else {
        let finite = l.iter().filter(|x| **x > f32::NEG_INFINITY).count();
        let threshold = if p.top_k > 0 && (p.top_k as usize) < finite {
            l[by_logit[p.top_k as usize - 1] as usize]
        } else {
            f32::NEG_INFINITY
        };
        let inv_t = 1.0 / p.temperature as f64;
        let w: Vec<f64> = l
            .iter()
            .map(|&x| {
                if x > f32::NEG_INFINITY && x >= threshold {
                    (x as f64 * inv_t - max as f64 * inv_t).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let mut kept: Vec<bool> = w.iter().map(|_| true).collect();
        if p.top_p < 1.0 {
            let total: f64 = w.iter().sum();
            let mut by_w: Vec<usize> = (0..v).collect();
            by_w.sort_by(|&a, &b| w[b].total_cmp(&w[a]).then(a.cmp(&b)));
            kept = vec![false; v];
            let mut cum = 0.0;
            for &i in &by_w {
                kept[i] = true;
                cum += w[i];
                if cum >= p.top_p as f64 * total {
                    break;
                }
            }
        }
        for (i, k) in kept.iter_mut().enumerate() {
            *k = *k && w[i] >= p.min_p as f64;
        }
        let kept_total: f64 = (0..v).filter(|&i| kept[i]).map(|i| w[i]).sum();
        let mut cum = 0.0;
        let mut chosen = None;
        let mut last = None;
        for i in (0..v).filter(|&i| kept[i] && w[i] > 0.0) {
            cum += w[i];
            last = Some(i as u32);
            if cum > u * kept_total {
                chosen = Some(i as u32);
                break;
            }
        }
        chosen.or(last).expect("reference: nothing kept")
    };

    let sum: f64 = l.iter().map(|&x| (x as f64 - max as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let lp = |t: u32| (l[t as usize] as f64 - lse) as f32;
    let logprobs = match &p.logprob_token_ids {
        Some(ids) => Some(TokenLogprobs {
            token_id: token,
            logprob: lp(token),
            top: ids.iter().map(|&t| (t, lp(t))).collect(),
        }),
        None => p.logprobs.map(|n| TokenLogprobs {
            token_id: token,
            logprob: lp(token),
            top: by_logit.iter().take(n).map(|&t| (t, lp(t))).collect(),
        }),
    };
    RefResult {
        token,
        processed: l,
        logprobs,
    }
}

fn sample_one(logits: &[f32], case: &Case) -> (u32, Vec<f32>, Option<TokenLogprobs>) {
    let mut sampler = Sampler::new(logits.len());
    let mut buf = logits.to_vec();
    let out = sampler
        .sample_batch(&mut buf, &[case.input(&case.checked(logits.len()))])
        .expect("sample");
    let (t, lp) = out.into_iter().next().unwrap().expect("row samples");
    (t, buf, lp)
}

/// Logits with ties and masked entries; `scale` spans sharp to nearly flat rows.
fn logits_strategy(vocab: std::ops::Range<usize>) -> impl Strategy<Value = Vec<f32>> {
    (vocab, 0.01f32..20.0).prop_flat_map(|(v, scale)| {
        prop::collection::vec(
            prop_oneof![
                8 => (-1.0f32..1.0).prop_map(move |x| x * scale),
                1 => (-3i32..3).prop_map(|x| x as f32), // exact ties
                1 => Just(f32::NEG_INFINITY),
            ],
            v,
        )
        .prop_filter("need one finite logit", |l| l.iter().any(|x| x.is_finite()))
    })
}

fn case_strategy(vocab: usize) -> impl Strategy<Value = Case> {
    let v = vocab as u32;
    (
        (
            prop_oneof![Just(0.0f32), 0.05f32..2.5],
            prop_oneof![Just(0i32), 1i32..40],
            prop_oneof![Just(1.0f32), 0.01f32..1.0],
            prop_oneof![Just(0.0f32), 0.0f32..0.5],
        ),
        (
            prop_oneof![Just(1.0f32), 0.5f32..2.0],
            -2.0f32..2.0,
            -2.0f32..2.0,
            prop::collection::vec((0..v, -5.0f32..5.0), 0..4),
            0usize..6,
            any::<bool>(),
            prop::option::of(0usize..=20),
        ),
        prop::collection::vec(0..v, 0..30),
        prop::collection::vec(0..v, 0..12),
        any::<u64>(),
        prop::collection::vec(0..v, 0..3),
        prop::collection::vec(0..v, 1..3),
        (
            prop::collection::vec(prop::collection::vec(0..v, 1..3), 0..3),
            prop::option::of(prop::collection::vec(0..v, 1..4)),
        ),
    )
        .prop_map(
            |(
                (t, k, tp, mp),
                (rep, fr, pr, bias, min_tokens, ignore_eos, logprobs),
                prompt,
                output,
                seed,
                stop_ids,
                eos,
                (bad_words, logprob_ids),
            )| Case {
                params: SamplingParams {
                    temperature: t,
                    top_k: k,
                    top_p: tp,
                    min_p: mp,
                    repetition_penalty: rep,
                    frequency_penalty: fr,
                    presence_penalty: pr,
                    logit_bias: bias.into(),
                    min_tokens,
                    ignore_eos,
                    logprobs,
                    stop_token_ids: stop_ids.into(),
                    bad_words_token_ids: bad_words.into(),
                    logprob_token_ids: logprob_ids.map(Into::into),
                    ..Default::default()
                },
                prompt,
                output,
                seed,
                eos,
            },
        )
}

fn row_and_case(vocab: std::ops::Range<usize>) -> impl Strategy<Value = (Vec<f32>, Case)> {
    logits_strategy(vocab).prop_flat_map(|l| {
        let v = l.len();
        (Just(l), case_strategy(v))
    })
}

fn all_masked_after_processing(logits: &[f32], case: &Case) -> bool {
    let mut l = logits.to_vec();
    ban_bad_words(&mut l, case);
    for &(t, b) in case.params.logit_bias.iter() {
        l[t as usize] += b;
    }
    if case.output.len() < case.params.min_tokens {
        for &t in case
            .params
            .stop_token_ids
            .iter()
            .chain(if case.params.ignore_eos {
                &[][..]
            } else {
                &case.eos[..]
            })
        {
            l[t as usize] = f32::NEG_INFINITY;
        }
    }
    l.iter().all(|x| *x == f32::NEG_INFINITY)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// The fast path equals the reference: processed logits exactly, the token
    /// exactly (same uniform number, same summation orders), logprobs to 1e-5.
    #[test]
    fn fast_path_matches_reference((logits, case) in row_and_case(1..300)) {
        prop_assume!(!all_masked_after_processing(&logits, &case));
        let u = counter_uniform(case.seed, case.output.len() as u64);
        let want = reference(&logits, &case, u);
        let (token, processed, lp) = sample_one(&logits, &case);
        prop_assert_eq!(&processed, &want.processed);
        prop_assert_eq!(token, want.token);
        prop_assert_eq!(lp.is_some(), want.logprobs.is_some());
        if let (Some(got), Some(want)) = (lp, want.logprobs) {
            prop_assert_eq!(got.token_id, want.token_id);
            prop_assert!((got.logprob - want.logprob).abs() <= 1e-5 || got.logprob == want.logprob);
            let ids: Vec<u32> = got.top.iter().map(|x| x.0).collect();
            let want_ids: Vec<u32> = want.top.iter().map(|x| x.0).collect();
            prop_assert_eq!(ids, want_ids);
            for (a, b) in got.top.iter().zip(&want.top) {
                prop_assert!((a.1 - b.1).abs() <= 1e-5 || a.1 == b.1);
            }
        }
    }

    /// `allowed_token_ids` is exactly "every other logit is -inf" (step 0), whatever
    /// the other parameters do afterwards: same token, same processed logits.
    #[test]
    fn allowed_token_ids_equal_masking_the_rest(
        (logits, case) in row_and_case(2..200),
        pick in prop::collection::vec(any::<prop::sample::Index>(), 1..8),
    ) {
        let v = logits.len();
        let allowed: Vec<u32> = pick.iter().map(|i| i.index(v) as u32).collect();
        let mut masked = vec![f32::NEG_INFINITY; v];
        for &t in &allowed {
            masked[t as usize] = logits[t as usize];
        }
        let plain = case.clone();
        prop_assume!(masked.iter().any(|x| x.is_finite()));
        prop_assume!(!all_masked_after_processing(&masked, &plain));
        let with = Case {
            params: SamplingParams { allowed_token_ids: Some(allowed.into()), ..case.params.clone() },
            ..case.clone()
        };
        let (t1, p1, lp1) = sample_one(&logits, &with);
        let (t2, p2, lp2) = sample_one(&masked, &plain);
        prop_assert_eq!(t1, t2);
        prop_assert_eq!(p1, p2);
        prop_assert_eq!(lp1, lp2);
    }

    /// Large, flat rows make top-p need several sort blocks.
    #[test]
    fn top_p_on_flat_large_rows_matches_reference(
        logits in prop::collection::vec(-0.5f32..0.5, 2000..5000),
        top_p in 0.05f32..0.999,
        top_k in prop_oneof![Just(0i32), 100i32..3000],
        seed in any::<u64>(),
    ) {
        let case = Case {
            params: SamplingParams { temperature: 0.7, top_p, top_k, ..Default::default() },
            prompt: vec![], output: vec![1, 2, 3], seed, eos: vec![],
        };
        let want = reference(&logits, &case, counter_uniform(seed, 3));
        prop_assert_eq!(sample_one(&logits, &case).0, want.token);
    }

    /// Greedy returns the argmax of the processed logits, lowest id on ties.
    #[test]
    fn greedy_is_argmax((logits, mut case) in row_and_case(1..300)) {
        prop_assume!(!all_masked_after_processing(&logits, &case));
        case.params.temperature = 0.0;
        let (token, processed, _) = sample_one(&logits, &case);
        let max = processed.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let first = processed.iter().position(|x| *x == max).unwrap() as u32;
        prop_assert_eq!(token, first);
    }

    /// top_k = 1, a tiny top_p and min_p = 1 all reduce to (near) greedy.
    #[test]
    fn degenerate_filters_are_greedy((logits, mut case) in row_and_case(1..300)) {
        prop_assume!(!all_masked_after_processing(&logits, &case));
        case.params.temperature = case.params.temperature.max(0.1);
        let mut greedy = case.clone();
        greedy.params.temperature = 0.0;
        let (g, processed, _) = sample_one(&logits, &greedy);
        let max = processed[g as usize];

        let mut k1 = case.clone();
        k1.params.top_k = 1;
        let (t, _, _) = sample_one(&logits, &k1);
        prop_assert_eq!(processed[t as usize], max, "top_k=1 picked a non-maximal token");

        let mut tiny_p = case.clone();
        tiny_p.params.top_p = 1e-9;
        prop_assert_eq!(sample_one(&logits, &tiny_p).0, g, "tiny top_p is not greedy");

        let mut mp1 = case.clone();
        mp1.params.min_p = 1.0;
        let (t, _, _) = sample_one(&logits, &mp1);
        prop_assert_eq!(processed[t as usize], max, "min_p=1 picked a non-maximal token");
    }

    /// A row gives the same token alone and at any position of a batch of others,
    /// on the sequential path and on the parallel one.
    #[test]
    fn seeded_sampling_is_batch_invariant(
        (logits, case) in row_and_case(400..700),
        others in prop::collection::vec((any::<u64>(), 0.1f32..2.0, 0.1f32..1.0), 1..300),
        pos_seed in any::<usize>(),
    ) {
        prop_assume!(!all_masked_after_processing(&logits, &case));
        let v = logits.len();
        let (alone, _, alone_lp) = sample_one(&logits, &case);
        let pos = pos_seed % (others.len() + 1);
        let mut cases: Vec<Case> = others
            .iter()
            .map(|&(seed, t, p)| Case {
                params: SamplingParams { temperature: t, top_p: p, ..Default::default() },
                prompt: vec![], output: vec![(seed % v as u64) as u32], seed, eos: vec![],
            })
            .collect();
        let mut batch: Vec<f32> = cases
            .iter()
            .flat_map(|c| (0..v).map(move |i| ((c.seed.rotate_left(i as u32 % 64) % 1000) as f32) / 100.0))
            .collect();
        cases.insert(pos, case.clone());
        let tail = batch.split_off(pos * v);
        batch.extend_from_slice(&logits);
        batch.extend(tail);
        let checked: Vec<CheckedParams> = cases.iter().map(|c| c.checked(v)).collect();
        let inputs: Vec<SampleInput<'_>> = cases.iter().zip(&checked).map(|(c, p)| c.input(p)).collect();
        let out = Sampler::new(v).sample_batch(&mut batch, &inputs).unwrap();
        let (tok, lp) = out[pos].clone().expect("row samples");
        prop_assert_eq!(tok, alone);
        prop_assert_eq!(&lp, &alone_lp);
    }

    /// With n covering the whole (tiny) vocabulary, probabilities sum to 1 and the
    /// list is sorted and contains the sampled token with the same logprob.
    #[test]
    fn logprobs_are_a_sorted_distribution((logits, mut case) in row_and_case(1..21)) {
        prop_assume!(!all_masked_after_processing(&logits, &case));
        case.params.logprobs = Some(20);
        case.params.logprob_token_ids = None;
        let (token, _, lp) = sample_one(&logits, &case);
        let lp = lp.unwrap();
        prop_assert_eq!(lp.token_id, token);
        prop_assert_eq!(lp.top.len(), logits.len());
        let total: f64 = lp.top.iter().map(|x| (x.1 as f64).exp()).sum();
        prop_assert!((total - 1.0).abs() < 1e-5, "sum of probabilities {}", total);
        prop_assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
        let own = lp.top.iter().find(|x| x.0 == token).unwrap();
        prop_assert_eq!(own.1, lp.logprob);
    }
}

#[test]
fn frequencies_match_softmax() {
    // 6 tokens, temperature 0.8; draws over seeds 0..N at k = 0, then over k at a
    // fixed seed: both axes of the counter-based generator must look uniform.
    let logits = [1.0f32, 0.5, 2.0, -1.0, 0.0, 1.5];
    let t = 0.8f64;
    let z: Vec<f64> = logits.iter().map(|&x| (x as f64 / t).exp()).collect();
    let s: f64 = z.iter().sum();
    let probs: Vec<f64> = z.iter().map(|x| x / s).collect();
    let n = 30_000usize;
    for axis in ["seed", "step"] {
        let mut counts = [0usize; 6];
        let mut sampler = Sampler::new(6);
        let checked = SamplingParams {
            temperature: t as f32,
            ..Default::default()
        }
        .checked(6)
        .unwrap();
        let outputs: Vec<u32> = vec![0; n];
        for i in 0..n {
            let (seed, k) = if axis == "seed" {
                (i as u64, 0)
            } else {
                (12345, i)
            };
            let input = SampleInput {
                params: &checked,
                prompt_ids: &[],
                output_ids: &outputs[..k],
                seed,
                eos_ids: &[],
            };
            let mut row = logits.to_vec();
            counts[sampler.sample_batch(&mut row, &[input]).unwrap()[0]
                .as_ref()
                .unwrap()
                .0 as usize] += 1;
        }
        let chi2: f64 = counts
            .iter()
            .zip(&probs)
            .map(|(&c, &p)| (c as f64 - p * n as f64).powi(2) / (p * n as f64))
            .sum();
        // 5 degrees of freedom: the 99.99% quantile is about 25.7.
        assert!(
            chi2 < 25.7,
            "{axis}: chi2 {chi2}, counts {counts:?}, probs {probs:?}"
        );
    }
}

#[test]
fn min_tokens_masks_eos_and_stop_ids_until_reached() {
    let logits = [0.0f32, 5.0, 4.0, 1.0];
    let mut params = SamplingParams {
        temperature: 0.0,
        min_tokens: 2,
        stop_token_ids: vec![2].into(),
        ..Default::default()
    };
    let eos = [1u32];
    let run = |params: &SamplingParams, out: &[u32]| {
        let mut row = logits.to_vec();
        let params = params.clone().checked(4).unwrap();
        let input = SampleInput {
            params: &params,
            prompt_ids: &[],
            output_ids: out,
            seed: 0,
            eos_ids: &eos,
        };
        Sampler::new(4).sample_batch(&mut row, &[input]).unwrap()[0]
            .as_ref()
            .unwrap()
            .0
    };
    assert_eq!(
        run(&params, &[3]),
        3,
        "EOS and stop id must be masked before min_tokens"
    );
    assert_eq!(
        run(&params, &[3, 3]),
        1,
        "EOS allowed once min_tokens reached"
    );
    params.ignore_eos = true;
    assert_eq!(
        run(&params, &[3]),
        1,
        "ignore_eos: EOS is not a stop token, so not masked"
    );
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let params = SamplingParams::default().checked(4).unwrap();
    let input = SampleInput {
        params: &params,
        prompt_ids: &[],
        output_ids: &[],
        seed: 1,
        eos_ids: &[],
    };
    let mut s = Sampler::new(4);
    let mut short = vec![0.0f32; 7];
    assert!(matches!(
        s.sample_batch(&mut short, &[input, input]),
        Err(SamplerError::ShapeMismatch {
            len: 7,
            rows: 2,
            vocab: 4
        })
    ));
    // A bad row fails alone: the row beside it is still sampled.
    let mut nan = vec![0.0f32, 1.0, 2.0, 3.0, 0.0, f32::NAN, 0.0, 0.0];
    let rows = s.sample_batch(&mut nan, &[input, input]).unwrap();
    assert!(rows[0].is_ok());
    assert!(matches!(
        rows[1],
        Err(SamplerError::NonFiniteLogit {
            row: 1,
            token: 1,
            ..
        })
    ));
    let mut inf = vec![f32::INFINITY, 0.0, 0.0, 0.0];
    assert!(matches!(
        s.sample_batch(&mut inf, &[input]).unwrap()[0],
        Err(SamplerError::NonFiniteLogit {
            row: 0,
            token: 0,
            ..
        })
    ));
    let mut masked = vec![f32::NEG_INFINITY; 4];
    assert!(matches!(
        s.sample_batch(&mut masked, &[input]).unwrap()[0],
        Err(SamplerError::AllMasked { row: 0 })
    ));
    let bad_prompt = SampleInput {
        prompt_ids: &[9],
        ..input
    };
    assert!(matches!(
        s.sample_batch(&mut [0.0; 4], &[bad_prompt]).unwrap()[0],
        Err(SamplerError::TokenOutOfRange {
            field: "prompt_ids",
            token: 9,
            ..
        })
    ));
    // Parameters naming tokens outside the vocabulary, or out of bounds, cannot
    // reach the sampler: they are refused where the request is checked...
    let bias = SamplingParams {
        logit_bias: vec![(4, 1.0)].into(),
        ..Default::default()
    };
    assert!(bias.clone().checked(4).is_err());
    let top_p = SamplingParams {
        top_p: 0.0,
        ..Default::default()
    };
    assert!(top_p.checked(4).is_err());
    // ...and parameters checked for a larger vocabulary fail the row, not the process.
    let wide = bias.checked(5).unwrap();
    assert!(matches!(
        s.sample_batch(
            &mut [0.0; 4],
            &[SampleInput {
                params: &wide,
                ..input
            }]
        )
        .unwrap()[0],
        Err(SamplerError::VocabMismatch {
            checked: 5,
            vocab: 4,
            ..
        })
    ));
    let mut empty: Vec<f32> = vec![];
    assert_eq!(s.sample_batch(&mut empty, &[]).unwrap(), vec![]);
}

#[test]
fn counter_uniform_is_in_range_and_varies() {
    let mut seen = BTreeSet::new();
    for seed in 0..50u64 {
        for k in 0..50u64 {
            let u = counter_uniform(seed, k);
            assert!((0.0..1.0).contains(&u));
            seen.insert(u.to_bits());
        }
    }
    assert_eq!(
        seen.len(),
        2500,
        "collisions in the counter-based generator"
    );
}

#[test]
fn bad_words_ban_the_last_token_after_the_prefix() {
    // Two-token word [3, 4]: token 4 is banned right after a 3, not otherwise; a
    // one-token word is always banned.
    let logits = vec![0.0, 0.0, 0.0, 0.0, 9.0, 8.0];
    let mut case = Case {
        params: SamplingParams {
            temperature: 0.0,
            bad_words_token_ids: vec![vec![3, 4]].into(),
            ..Default::default()
        },
        prompt: vec![1],
        output: vec![2],
        seed: 0,
        eos: vec![0],
    };
    assert_eq!(sample_one(&logits, &case).0, 4);
    case.output = vec![2, 3];
    assert_eq!(sample_one(&logits, &case).0, 5);
    case.params.bad_words_token_ids = vec![vec![3, 4], vec![5]].into();
    let (tok, processed, _) = sample_one(&logits, &case);
    assert!(tok < 4 && processed[4] == f32::NEG_INFINITY && processed[5] == f32::NEG_INFINITY);
}

#[test]
fn logprob_token_ids_report_exactly_those_tokens() {
    let logits = vec![1.0, 3.0, 2.0, 0.5];
    let case = Case {
        params: SamplingParams {
            temperature: 0.0,
            logprob_token_ids: Some(vec![3, 0].into()),
            ..Default::default()
        },
        prompt: vec![1],
        output: vec![],
        seed: 0,
        eos: vec![2],
    };
    let (tok, _, lp) = sample_one(&logits, &case);
    let lp = lp.expect("logprobs");
    assert_eq!(tok, 1);
    assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![3, 0]);
    let lse = logits.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
    assert!((lp.top[0].1 as f64 - (0.5 - lse)).abs() < 1e-6);
    assert!((lp.logprob as f64 - (3.0 - lse)).abs() < 1e-6);
}
