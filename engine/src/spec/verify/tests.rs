//! The rejection sampler against its definitions: greedy verification equals the
//! sequential argmax chain (with every logit-processing step), and sampled
//! verification's tokens follow the target distribution (chi-square).

use super::*;
use pagoda_core::SamplingParams;
use proptest::prelude::*;

const V: usize = 6;

fn checked(p: SamplingParams) -> CheckedParams {
    p.checked(V).expect("valid parameters")
}

/// The sampler's processed distribution of `row`, as probabilities.
fn softmax(row: &[f32], t: f32) -> Vec<f64> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let w: Vec<f64> = row
        .iter()
        .map(|&l| ((l as f64 - m) / t as f64).exp())
        .collect();
    let s: f64 = w.iter().sum();
    w.into_iter().map(|x| x / s).collect()
}

/// Pearson's statistic of `counts` against `probs` (cells of zero probability must
/// be empty: any count there is an infinite statistic).
fn chi_square(counts: &[u64], probs: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .map(|(&o, &p)| {
            let e = p * n as f64;
            if e == 0.0 {
                if o == 0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (o as f64 - e).powi(2) / e
            }
        })
        .sum()
}

/// The 1 - 1e-6 quantile of chi-square with 5 degrees of freedom is 35.9 (survival
/// 1.5e-6 at 35, 1.5e-7 at 40): a correct sampler exceeds 40 with probability 1.5e-7,
/// and the seeds are fixed, so the test is deterministic.
const CHI2_5DOF_BOUND: f64 = 40.0;

fn run(params: &CheckedParams, tokens: &[u32], k: usize, rows: &[f32], seed: u64) -> Vec<u32> {
    let sampler = Sampler::new(V);
    let input = VerifyInput {
        params,
        tokens,
        num_prompt_tokens: 2,
        num_drafts: k,
        seed,
        eos_ids: &[],
    };
    let mut logits = rows.to_vec();
    verify_row(&sampler, &input, &mut logits).unwrap().0
}

#[test]
fn sampled_tokens_follow_the_target_distribution() {
    let row0 = [2.0f32, 1.0, 0.5, 0.0, -1.0, 1.5];
    let row1 = [0.0f32, 0.3, -0.5, 1.2, 0.8, -2.0];
    // Row 2 (after both drafts) gives the bonus token; its distribution is not tested.
    let rows: Vec<f32> = row0.iter().chain(&row1).chain(&[0.0; V]).copied().collect();
    let params = checked(SamplingParams {
        temperature: 0.8,
        ..SamplingParams::default()
    });
    let (p0, p1) = (softmax(&row0, 0.8), softmax(&row1, 0.8));
    // Prompt [1, 2], drafts [5, 3]: the first draft is accepted with p0[5] ~ 0.24.
    let tokens = [1u32, 2, 5, 3];
    let n = 40_000u64;
    let mut first = [0u64; V];
    let mut second = [0u64; V];
    for seed in 0..n {
        let out = run(&params, &tokens, 2, &rows, seed);
        first[out[0] as usize] += 1;
        if out[0] == 5 {
            // Accepted: the next token is row 1's (draft 3 accepted or a residual draw).
            second[out[1] as usize] += 1;
        }
    }
    let c0 = chi_square(&first, &p0);
    let c1 = chi_square(&second, &p1);
    assert!(
        c0 < CHI2_5DOF_BOUND,
        "first token: chi2 {c0}, counts {first:?}, p {p0:?}"
    );
    assert!(
        c1 < CHI2_5DOF_BOUND,
        "second token: chi2 {c1}, counts {second:?}, p {p1:?}"
    );
    // The test has power: always accepting the draft, or the residual alone, is far off.
    let mut residual = p0.clone();
    residual[5] = 0.0;
    let s: f64 = residual.iter().sum();
    residual.iter_mut().for_each(|x| *x /= s);
    let smeared: Vec<f64> = p0
        .iter()
        .zip(&residual)
        .map(|(a, b)| 0.9 * a + 0.1 * b)
        .collect();
    assert!(chi_square(&first, &smeared) > CHI2_5DOF_BOUND);
}

#[test]
fn filtered_target_rejects_drafts_outside_it() {
    // top-k 2 keeps tokens 0 and 5: a draft of 3 (probability 0) is always rejected
    // and the emitted token follows the filtered target.
    let row0 = [2.0f32, 1.0, 0.5, 0.0, -1.0, 1.5];
    let rows: Vec<f32> = row0.iter().chain(&[0.0f32; V]).copied().collect();
    let params = checked(SamplingParams {
        temperature: 1.0,
        top_k: 2,
        ..SamplingParams::default()
    });
    let mut p = softmax(&row0, 1.0);
    for (i, x) in p.iter_mut().enumerate() {
        if i != 0 && i != 5 {
            *x = 0.0;
        }
    }
    let s: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= s);
    let mut counts = [0u64; V];
    for seed in 0..20_000 {
        let out = run(&params, &[1, 2, 3], 1, &rows, seed);
        assert_eq!(out.len(), 1, "a zero-probability draft is never accepted");
        counts[out[0] as usize] += 1;
    }
    // One degree of freedom (two cells): 40 is far beyond its 1 - 1e-9 quantile (37.3).
    let c = chi_square(&counts, &p);
    assert!(c < CHI2_5DOF_BOUND, "chi2 {c}, counts {counts:?}, p {p:?}");
}

/// The slow reference: the sampler at each position in turn, with the tokens emitted
/// before it as outputs, stopping after the first token that is not the draft.
fn greedy_chain(params: &CheckedParams, tokens: &[u32], k: usize, rows: &[f32]) -> Vec<u32> {
    let mut sampler = Sampler::new(V);
    let known = tokens.len() - k;
    let mut seq = tokens[..known].to_vec();
    let mut out = Vec::new();
    for j in 0..=k {
        let mut row = rows[j * V..(j + 1) * V].to_vec();
        let input = SampleInput {
            params,
            prompt_ids: &seq[..2],
            output_ids: &seq[2..],
            seed: 0,
            eos_ids: &[],
        };
        let tok = sampler.sample_batch(&mut row, &[input]).unwrap()[0]
            .clone()
            .unwrap()
            .0;
        out.push(tok);
        seq.push(tok);
        if j == k || tok != tokens[known + j] {
            break;
        }
    }
    out
}

proptest! {
    /// Greedy verification equals the sequential chain, penalties and biases included
    /// (they see the accepted drafts as outputs).
    #[test]
    fn greedy_equals_the_sequential_chain(
        rows in proptest::collection::vec(-3.0f32..3.0, 5 * V),
        drafts in proptest::collection::vec(0u32..V as u32, 0..5),
        outputs in proptest::collection::vec(0u32..V as u32, 0..4),
        repetition in prop_oneof![Just(1.0f32), 0.5f32..2.0],
        presence in prop_oneof![Just(0.0f32), -1.0f32..1.0],
        bias in proptest::option::of((0u32..V as u32, -3.0f32..3.0)),
    ) {
        let mut p = SamplingParams {
            temperature: 0.0,
            repetition_penalty: repetition,
            presence_penalty: presence,
            ..SamplingParams::default()
        };
        if let Some((t, b)) = bias {
            p.logit_bias = std::sync::Arc::from(vec![(t, b)]);
        }
        let params = checked(p);
        let k = drafts.len();
        let tokens: Vec<u32> = [1u32, 2].iter().chain(&outputs).chain(&drafts).copied().collect();
        let rows = &rows[..(k + 1) * V];
        prop_assert_eq!(run(&params, &tokens, k, rows, 7), greedy_chain(&params, &tokens, k, rows));
    }
}
