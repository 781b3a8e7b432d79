//! vLLM's rejection sampler for one verified row: `k` drafts, `k + 1` rows of target
//! logits (row `j` predicts the token after draft `j - 1`).
//!
//! At each position the row is first processed exactly as the sampler processes a
//! plain row, with the drafts before it counted as output tokens (penalties,
//! `min_tokens`, bad words and biases see what a run without speculation would
//! have seen had it generated those drafts). Then:
//! - greedy: the draft is accepted while it equals the target's argmax; the first
//!   mismatch emits the argmax instead. So the output is the argmax chain itself:
//!   identical to decoding without speculation whenever the logits are (batch
//!   invariance makes them bit-identical on the CPU);
//! - sampled (the n-gram draft puts probability 1 on its token, `q = δ_d`): the draft
//!   is accepted with probability `min(1, p(d) / q(d)) = p(d)`; on rejection a token
//!   is drawn from `max(p - q, 0)` renormalised, that is `p` without `d`. Each emitted
//!   token is then distributed exactly as `p` (Leviathan et al., 2023).
//! - after `k` accepted drafts the last row's token is drawn as the sampler draws
//!   (the bonus token).
//!
//! The uniform numbers are counter-based like the sampler's, keyed by the output
//! index, so a seeded request is reproducible: the acceptance test uses the seed
//! mixed with [`ACCEPT_KEY`], the draws the sampler's own stream.

use super::probs::{draw, target_weights};
use crate::sampler::{
    counter_uniform, draw_filtered, row_logprobs, SampleInput, Sampler, SamplerError,
};
use pagoda_core::{CheckedParams, TokenLogprobs};

/// Mixed into a request's seed for the acceptance tests' uniform numbers, so they are
/// independent of the draws'.
pub const ACCEPT_KEY: u64 = 0xA5C3_D1E2_F00D_5EED;

/// One verified row's request.
#[derive(Debug, Clone, Copy)]
pub struct VerifyInput<'a> {
    pub params: &'a CheckedParams,
    /// Prompt, outputs so far, then the `num_drafts` drafts.
    pub tokens: &'a [u32],
    pub num_prompt_tokens: usize,
    pub num_drafts: usize,
    pub seed: u64,
    pub eos_ids: &'a [u32],
}

/// The accepted drafts then the target's token, with their logprobs when asked for.
pub type Verified = (Vec<u32>, Vec<TokenLogprobs>);

/// Verifies one row; `logits` holds its `num_drafts + 1` rows (processed in place).
pub fn verify_row(
    sampler: &Sampler,
    input: &VerifyInput<'_>,
    logits: &mut [f32],
) -> Result<Verified, SamplerError> {
    let k = input.num_drafts;
    let vocab = sampler.vocab_size();
    let known = input.tokens.len() - k;
    let np = input.num_prompt_tokens;
    let mut tokens = Vec::with_capacity(k + 1);
    let mut logprobs = Vec::new();
    for j in 0..=k {
        let row = &mut logits[j * vocab..(j + 1) * vocab];
        let sample = SampleInput {
            params: input.params,
            prompt_ids: &input.tokens[..np],
            output_ids: &input.tokens[np..known + j],
            seed: input.seed,
            eos_ids: input.eos_ids,
        };
        let (argmax, max) = sampler.prepare(j, row, &sample)?;
        let index = (known + j - np) as u64;
        let draft = (j < k).then(|| input.tokens[known + j]);
        let (tok, accepted) = choose(row, max, argmax, draft, input, index);
        tokens.push(tok);
        if let Some(lp) = row_logprobs(row, max, tok, input.params) {
            logprobs.push(lp);
        }
        if !accepted {
            break;
        }
    }
    Ok((tokens, logprobs))
}

/// The token at one position and whether it is the draft (accepted).
fn choose(
    row: &[f32],
    max: f32,
    argmax: u32,
    draft: Option<u32>,
    input: &VerifyInput<'_>,
    index: u64,
) -> (u32, bool) {
    let p = input.params;
    if p.is_greedy() {
        return (argmax, draft == Some(argmax));
    }
    let Some(d) = draft else {
        return (
            draw_filtered(row, max, p, counter_uniform(input.seed, index)),
            false,
        );
    };
    let mut w = target_weights(row, max, p);
    let total: f64 = w.iter().sum();
    let p_d = w[d as usize] / total;
    if counter_uniform(input.seed ^ ACCEPT_KEY, index) < p_d {
        return (d, true);
    }
    w[d as usize] = 0.0;
    if w.iter().all(|&x| x == 0.0) {
        return (d, true); // p(d) = 1: unreachable (u < 1), kept total
    }
    (draw(&w, counter_uniform(input.seed, index)), false)
}

#[cfg(test)]
mod tests;
