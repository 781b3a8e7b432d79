//! Prompt logprobs (vLLM's `prompt_logprobs`, and what `echo` with `logprobs`
//! shows): the raw model's log-probability of each prompt token given the tokens
//! before it, with its rank and the most likely alternatives.
//!
//! The runner asks the model for the logits of every prompt row of a request that
//! wants them (row `p` predicts prompt token `p + 1`), after the rows it samples;
//! this module turns each such row into a [`PromptLogprob`]. No sampling parameter
//! applies (no temperature, penalty or bias), as in vLLM.

use pagoda_core::PromptLogprob;
use rayon::prelude::*;
use std::cmp::Ordering;

/// Below this many rows the work stays on the calling thread.
const PARALLEL_MIN_ROWS: usize = 4;

/// Largest `k` for which the top list is kept by insertion (cheap for the usual
/// k <= 20); larger ones (up to the whole vocabulary) select then sort.
const INSERTION_MAX_K: usize = 64;

/// One entry per logits row: `logits` is `[targets.len(), vocab]`, row `i` scored
/// against token `targets[i]`, with the `k` most likely tokens listed.
pub fn compute_rows(logits: &[f32], vocab: usize, targets: &[u32], k: usize) -> Vec<PromptLogprob> {
    debug_assert_eq!(logits.len(), targets.len() * vocab);
    let one = |(row, &t): (&[f32], &u32)| prompt_logprob(row, t, k);
    if targets.len() >= PARALLEL_MIN_ROWS {
        logits
            .par_chunks(vocab)
            .zip(targets.par_iter())
            .map(one)
            .collect()
    } else {
        logits.chunks(vocab).zip(targets).map(one).collect()
    }
}

/// Log-softmax of one row (f64 accumulation) for `token`, its rank (the number of
/// tokens at least as likely, itself included, as vLLM counts it) and the `k` most
/// likely tokens, descending, ties to the lower id.
pub fn prompt_logprob(logits: &[f32], token: u32, k: usize) -> PromptLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    let lp = |l: f32| (l as f64 - lse) as f32;
    let target = logits
        .get(token as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    let rank = logits.iter().filter(|&&l| l >= target).count().max(1) as u32;
    PromptLogprob {
        token_id: token,
        logprob: lp(target),
        rank,
        top: top_k(logits, k)
            .into_iter()
            .map(|i| (i, lp(logits[i as usize])))
            .collect(),
    }
}

/// Ids of the `k` largest logits, descending, ties to the lower id.
fn top_k(logits: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let desc = |a: &u32, b: &u32| {
        logits[*b as usize]
            .partial_cmp(&logits[*a as usize])
            .unwrap_or(Ordering::Equal)
            .then(a.cmp(b))
    };
    if k <= INSERTION_MAX_K {
        let mut top: Vec<u32> = Vec::with_capacity(k + 1);
        for (i, &l) in logits.iter().enumerate() {
            if top.len() == k && l <= logits[top[k - 1] as usize] {
                continue; // equal values keep the earlier (lower) id
            }
            let pos = top.partition_point(|&j| logits[j as usize] >= l);
            top.insert(pos, i as u32);
            top.truncate(k);
        }
        return top;
    }
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    if k < ids.len() {
        ids.select_nth_unstable_by(k - 1, desc);
        ids.truncate(k);
    }
    ids.sort_by(desc);
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The obvious definition: full sort, exp/sum in f64.
    fn reference(logits: &[f32], token: u32, k: usize) -> PromptLogprob {
        let lse = logits.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
        let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
        ids.sort_by(|&a, &b| {
            logits[b as usize]
                .partial_cmp(&logits[a as usize])
                .unwrap()
                .then(a.cmp(&b))
        });
        let t = logits[token as usize];
        PromptLogprob {
            token_id: token,
            logprob: (t as f64 - lse) as f32,
            rank: logits.iter().filter(|&&l| l >= t).count() as u32,
            top: ids
                .iter()
                .take(k)
                .map(|&i| (i, (logits[i as usize] as f64 - lse) as f32))
                .collect(),
        }
    }

    proptest::proptest! {
        /// Matches the reference within 1e-5 (same f64 math, different order of
        /// the sum), for small and large k, with ties from a coarse value grid.
        #[test]
        fn matches_reference(
            raw in proptest::collection::vec(-40i32..40, 2..300),
            token_seed in 0usize..10_000,
            k in proptest::prop_oneof![0usize..25, 60usize..400],
        ) {
            let logits: Vec<f32> = raw.iter().map(|&v| v as f32 * 0.25).collect();
            let token = (token_seed % logits.len()) as u32;
            let got = prompt_logprob(&logits, token, k);
            let want = reference(&logits, token, k);
            proptest::prop_assert_eq!(got.rank, want.rank);
            proptest::prop_assert!((got.logprob - want.logprob).abs() < 1e-5);
            let ids = |v: &PromptLogprob| v.top.iter().map(|t| t.0).collect::<Vec<_>>();
            proptest::prop_assert_eq!(ids(&got), ids(&want));
            for (a, b) in got.top.iter().zip(&want.top) {
                proptest::prop_assert!((a.1 - b.1).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn rows_in_order_serial_and_parallel() {
        let vocab = 7;
        let logits: Vec<f32> = (0..vocab * 9).map(|i| ((i * 37) % 11) as f32).collect();
        let targets: Vec<u32> = (0..9).map(|i| (i % vocab) as u32).collect();
        let all = compute_rows(&logits, vocab, &targets, 3);
        for (i, e) in all.iter().enumerate() {
            assert_eq!(
                *e,
                prompt_logprob(&logits[i * vocab..(i + 1) * vocab], targets[i], 3)
            );
        }
        let few = compute_rows(&logits[..2 * vocab], vocab, &targets[..2], 3);
        assert_eq!(few[..], all[..2]);
    }

    #[test]
    fn whole_vocabulary_is_sorted() {
        let logits = [0.5f32, 2.0, -1.0, 2.0];
        let e = prompt_logprob(&logits, 2, usize::MAX);
        assert_eq!(
            e.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![1, 3, 0, 2]
        );
        assert_eq!(e.rank, 4);
        let sum: f64 = e.top.iter().map(|t| (t.1 as f64).exp()).sum();
        assert!((sum - 1.0).abs() < 1e-6);
    }
}
