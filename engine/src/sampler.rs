//! The sampler: turns one row of logits per request into one token (and optional
//! log-probabilities), deterministically and independently of the batch.
//!
//! Processing order per row (vLLM's):
//! * before the sampler sees a row, the model runner applies the request's
//!   structured-output grammar mask (disallowed tokens `-inf`, see
//!   [`crate::structured`]), as vLLM applies its bitmask before its sampler; so the
//!   log-probabilities below are those of the masked distribution, and every step
//!   below composes with the mask;
//! 0. with `allowed_token_ids`, every other token is masked to `-inf`;
//!    then each `bad_words` sequence whose prefix ends the output so far has its
//!    last token masked;
//! 1. `logit_bias` is added;
//! 2. while fewer than `min_tokens` tokens were generated, EOS (unless `ignore_eos`)
//!    and `stop_token_ids` are masked to `-inf`;
//! 3. repetition penalty over the distinct prompt + output tokens
//!    (`logit > 0 ? logit / p : logit * p`);
//! 4. frequency and presence penalties over output tokens
//!    (`logit -= f * count; logit -= presence`);
//! 5. log-probabilities, if asked for (top `logprobs`, or exactly the
//!    `logprob_token_ids`), are taken from these processed logits, before
//!    temperature and filtering (vLLM's default "processed logprobs" are after
//!    temperature; we report the distribution before it, which is what
//!    [`TokenLogprobs`] documents and what OpenAI clients expect from a request
//!    with `temperature != 1`);
//! 6. greedy (`temperature < 1e-5`): argmax, ties to the lowest id; otherwise the
//!    logits are divided by the temperature, then top-k, top-p and min-p filter the
//!    candidates and one is drawn by inverse CDF in ascending token-id order.
//!
//! After the call each row of the logits buffer holds the processed logits of
//! steps 1-4, which callers and tests may inspect.
//!
//! Filtering rules, stated exactly because the reference in the tests follows them:
//! * top-k keeps every token whose logit is `>=` the k-th largest (ties at the
//!   boundary are kept, as vLLM's threshold mask does);
//! * weights are `w_i = exp(z_i - z_max)` in f64, with `z = logit * (1 / T)` in f64;
//! * top-p sorts the survivors by `(w desc, id asc)` and keeps the shortest prefix
//!   whose running sum reaches `top_p * S`, `S` being the id-order sum of survivors;
//! * min-p keeps `w_i >= min_p` (that is `p_i >= min_p * p_max`, as `w_max = 1`);
//! * the draw walks the kept tokens in id order and returns the first whose running
//!   weight exceeds `u * S_kept`.
//!
//! Randomness is counter based: the uniform number for the k-th output token of a
//! request is a hash of `(seed, k)` ([`counter_uniform`]), so the same seed gives the
//! same tokens whatever the batch, and again after preemption and recomputation.

use std::sync::Mutex;

use pagoda_core::{CheckedParams, SamplingParams, TokenLogprobs};
use pagoda_kernels::{first_nan_or_inf, max_index};
use rayon::prelude::*;

/// Rows times vocabulary above which the rows of a batch are sampled in parallel;
/// below it thread hand-off costs more than it saves.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 17;
/// First block of candidates sorted for top-p; grows by 4x while the nucleus is
/// not yet covered, so a sharp distribution costs one O(V) selection and a tiny sort.
const TOP_P_FIRST_BLOCK: usize = 64;

/// Why a batch could not be sampled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    #[error("logits hold {len} values, expected {rows} rows x {vocab} vocabulary entries")]
    ShapeMismatch {
        len: usize,
        rows: usize,
        vocab: usize,
    },
    #[error("row {row}: logit of token {token} is {value}, logits must be finite or -inf")]
    NonFiniteLogit {
        row: usize,
        token: usize,
        value: f32,
    },
    #[error("row {row}: token id {token} in {field} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        row: usize,
        field: &'static str,
        token: u32,
        vocab: usize,
    },
    #[error("row {row}: invalid sampling parameter {param}: {message}")]
    InvalidParam {
        row: usize,
        param: &'static str,
        message: String,
    },
    #[error(
        "row {row}: parameters checked against a vocabulary of {checked}, the model has {vocab}"
    )]
    VocabMismatch {
        row: usize,
        checked: usize,
        vocab: usize,
    },
    #[error("row {row}: every token is masked (-inf), nothing can be sampled")]
    AllMasked { row: usize },
}

/// One row's outcome: the sampled token and its log-probabilities, or the reason
/// the row could not be sampled.
pub type RowResult = Result<(u32, Option<TokenLogprobs>), SamplerError>;

/// What the sampler needs to know about one request for one row of logits.
#[derive(Debug, Clone, Copy)]
pub struct SampleInput<'a> {
    /// Checked once where the request entered the engine: not re-checked here.
    pub params: &'a CheckedParams,
    pub prompt_ids: &'a [u32],
    /// Tokens generated so far; its length is the index of the token being sampled.
    pub output_ids: &'a [u32],
    /// The request's seed: `params.seed`, or one the engine drew for it at arrival.
    pub seed: u64,
    /// The model's EOS ids, masked before `min_tokens` unless `ignore_eos`.
    pub eos_ids: &'a [u32],
}

/// Reusable per-row working buffers, so that steady-state sampling does not
/// allocate vocabulary-sized vectors.
#[derive(Default)]
struct Scratch {
    /// Candidate weights (0 for filtered-out tokens), indexed by token id.
    weights: Vec<f64>,
    /// Logit copies for the top-k selection.
    values: Vec<f32>,
    /// `(weight, id)` pairs for the top-p sort.
    pairs: Vec<(f64, u32)>,
    /// Sorted output ids, for counting.
    ids: Vec<u32>,
    /// One bit per token id, to visit each prompt/output token once.
    seen: Vec<u64>,
}

/// Samples batches of logit rows. Holds scratch buffers reused across calls.
pub struct Sampler {
    vocab_size: usize,
    pool: Mutex<Vec<Scratch>>,
}

/// Returns a [`Scratch`] to its pool when a rayon split (or the sequential path) ends.
struct PooledScratch<'p> {
    pool: &'p Mutex<Vec<Scratch>>,
    scratch: Option<Scratch>,
}

impl Drop for PooledScratch<'_> {
    fn drop(&mut self) {
        if let (Some(s), Ok(mut pool)) = (self.scratch.take(), self.pool.lock()) {
            pool.push(s);
        }
    }
}

impl<'p> PooledScratch<'p> {
    fn take(pool: &'p Mutex<Vec<Scratch>>) -> Self {
        let scratch = pool
            .lock()
            .ok()
            .and_then(|mut p| p.pop())
            .unwrap_or_default();
        PooledScratch {
            pool,
            scratch: Some(scratch),
        }
    }
    fn get(&mut self) -> &mut Scratch {
        self.scratch.get_or_insert_with(Scratch::default)
    }
}

impl Sampler {
    pub fn new(vocab_size: usize) -> Self {
        Sampler {
            vocab_size,
            pool: Mutex::new(Vec::new()),
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Samples one token per row. `logits` is `[inputs.len(), vocab]` row-major and
    /// is modified in place (it ends holding the processed logits, see the module
    /// doc). Returns one result per row: `(token, logprobs)`, logprobs only when
    /// `params.logprobs` is set, or why that row (and only that row) could not be
    /// sampled. Only a logits buffer of the wrong shape fails the whole call.
    pub fn sample_batch(
        &mut self,
        logits: &mut [f32],
        inputs: &[SampleInput<'_>],
    ) -> Result<Vec<RowResult>, SamplerError> {
        let vocab = self.vocab_size;
        let rows = inputs.len();
        if vocab == 0 || logits.len() != rows * vocab {
            return Err(SamplerError::ShapeMismatch {
                len: logits.len(),
                rows,
                vocab,
            });
        }
        let pool = &self.pool;
        let results: Vec<RowResult> = if rows > 1 && logits.len() >= PARALLEL_MIN_ELEMENTS {
            logits
                .par_chunks_mut(vocab)
                .zip(inputs.par_iter())
                .enumerate()
                .map_init(
                    || PooledScratch::take(pool),
                    |scratch, (row, (l, input))| sample_row(row, l, input, scratch.get()),
                )
                .collect()
        } else {
            let mut scratch = PooledScratch::take(pool);
            logits
                .chunks_mut(vocab)
                .zip(inputs)
                .enumerate()
                .map(|(row, (l, input))| sample_row(row, l, input, scratch.get()))
                .collect()
        };
        Ok(results)
    }
}

/// Whether sampling this row is the argmax of its raw logits and nothing else: greedy,
/// no log-probabilities, and none of steps 0-4 (module doc) changes a logit. Such rows
/// can take the device's argmax instead of copying logits to the sampler.
pub fn is_plain_greedy(input: &SampleInput<'_>) -> bool {
    let p = input.params;
    let masks_stops = input.output_ids.len() < p.min_tokens
        && (!p.stop_token_ids.is_empty() || (!p.ignore_eos && !input.eos_ids.is_empty()));
    p.is_greedy()
        && p.logprobs.is_none()
        && p.logprob_token_ids.is_none()
        && p.allowed_token_ids.is_none()
        && p.bad_words_token_ids.is_empty()
        && p.logit_bias.is_empty()
        && !masks_stops
        && p.repetition_penalty == 1.0
        && p.frequency_penalty == 0.0
        && p.presence_penalty == 0.0
}

/// The uniform number in `[0, 1)` used to draw output token number `k` of a request
/// seeded with `seed`: a counter-based hash (two splitmix64 finalizer rounds keyed
/// by the seed), so no RNG state is shared or carried between steps.
pub fn counter_uniform(seed: u64, k: u64) -> f64 {
    let h = splitmix64(splitmix64(seed) ^ k.wrapping_mul(0xD1B5_4A32_D192_ED03));
    // Top 53 bits: every value is an exact f64 in [0, 1).
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The runner's token ids (prompt, outputs) index the logits: one outside the
/// vocabulary fails the row instead of panicking.
fn check_ids(
    row: usize,
    field: &'static str,
    ids: &[u32],
    vocab: usize,
) -> Result<(), SamplerError> {
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(&token) => Err(SamplerError::TokenOutOfRange {
            row,
            field,
            token,
            vocab,
        }),
        None => Ok(()),
    }
}

fn sample_row(
    row: usize,
    logits: &mut [f32],
    input: &SampleInput<'_>,
    scratch: &mut Scratch,
) -> Result<(u32, Option<TokenLogprobs>), SamplerError> {
    let (argmax, max) = prepare_row(row, logits, input, scratch)?;
    let p = input.params;
    let token = if p.is_greedy() {
        argmax
    } else {
        let u = counter_uniform(input.seed, input.output_ids.len() as u64);
        sample_filtered(logits, max, p, u, scratch)
    };
    Ok((token, row_logprobs(logits, max, token, p)))
}

/// The log-probabilities a row reports for `token` (module doc, step 5), if asked for;
/// `logits` are the processed ones and `max` their maximum.
pub(crate) fn row_logprobs(
    logits: &[f32],
    max: f32,
    token: u32,
    p: &SamplingParams,
) -> Option<TokenLogprobs> {
    match &p.logprob_token_ids {
        Some(ids) => Some(logprobs_of(logits, max, token, ids)),
        None => p.logprobs.map(|n| compute_logprobs(logits, max, token, n)),
    }
}

impl Sampler {
    /// Checks one row and applies steps 0-4 of the module doc in place; returns the
    /// processed row's argmax (ties to the lowest id) and maximum. What
    /// [`Sampler::sample_batch`] does to a row before it draws, for callers that
    /// draw differently (speculative decoding's verification).
    pub(crate) fn prepare(
        &self,
        row: usize,
        logits: &mut [f32],
        input: &SampleInput<'_>,
    ) -> Result<(u32, f32), SamplerError> {
        let mut scratch = PooledScratch::take(&self.pool);
        prepare_row(row, logits, input, scratch.get())
    }
}

/// The sampler's temperature/top-k/top-p/min-p draw of one processed row (`max` its
/// maximum) with the uniform number `u`: what [`Sampler::sample_batch`] draws.
pub(crate) fn draw_filtered(logits: &[f32], max: f32, p: &SamplingParams, u: f64) -> u32 {
    sample_filtered(logits, max, p, u, &mut Scratch::default())
}

/// Steps 0-4 with the checks around them; the processed row's argmax and max.
fn prepare_row(
    row: usize,
    logits: &mut [f32],
    input: &SampleInput<'_>,
    scratch: &mut Scratch,
) -> Result<(u32, f32), SamplerError> {
    let vocab = logits.len();
    let p = input.params;
    // Every id the parameters name is below the vocabulary they were checked for.
    if p.vocab_size() > vocab {
        return Err(SamplerError::VocabMismatch {
            row,
            checked: p.vocab_size(),
            vocab,
        });
    }
    if let Some(token) = first_nan_or_inf(logits) {
        let value = logits[token];
        return Err(SamplerError::NonFiniteLogit { row, token, value });
    }
    check_ids(row, "prompt_ids", input.prompt_ids, vocab)?;
    check_ids(row, "output_ids", input.output_ids, vocab)?;

    process_logits(logits, input, scratch);
    // Huge biases or tiny repetition penalties can overflow to +inf.
    if let Some(token) = first_nan_or_inf(logits) {
        let value = logits[token];
        return Err(SamplerError::NonFiniteLogit { row, token, value });
    }

    // Greedy needs the argmax; logprobs need the max too, so find it once.
    let (argmax, max) = argmax(logits);
    if max == f32::NEG_INFINITY {
        return Err(SamplerError::AllMasked { row });
    }
    Ok((argmax, max))
}

/// Steps 1-4 of the module doc, in place.
fn process_logits(logits: &mut [f32], input: &SampleInput<'_>, scratch: &mut Scratch) {
    let p = input.params;
    let vocab = logits.len();
    if let Some(allowed) = &p.allowed_token_ids {
        let kept = &mut scratch.values;
        kept.clear();
        kept.extend(allowed.iter().map(|&t| logits[t as usize]));
        logits.fill(f32::NEG_INFINITY);
        for (&t, &l) in allowed.iter().zip(kept.iter()) {
            logits[t as usize] = l;
        }
    }
    for w in p.bad_words_token_ids.iter() {
        // vLLM: a bad word's last token is banned when the output ends with the
        // rest of the word (a one-token word is always banned).
        if let Some((&last, prefix)) = w.split_last() {
            if input.output_ids.ends_with(prefix) {
                logits[last as usize] = f32::NEG_INFINITY;
            }
        }
    }
    for &(t, b) in p.logit_bias.iter() {
        logits[t as usize] += b;
    }
    if input.output_ids.len() < p.min_tokens {
        let eos: &[u32] = if p.ignore_eos { &[] } else { input.eos_ids };
        // Out-of-range stop ids can never be sampled anyway, so they are skipped.
        for &t in eos.iter().chain(p.stop_token_ids.iter()) {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    let rep = p.repetition_penalty;
    if rep != 1.0 {
        // Each distinct token is penalized once; the bitset is cleared afterwards by
        // walking the same ids, so the cost is O(prompt + output), not O(vocab).
        let words = vocab.div_ceil(64);
        if scratch.seen.len() < words {
            scratch.seen.resize(words, 0);
        }
        let seen = &mut scratch.seen;
        for &t in input.prompt_ids.iter().chain(input.output_ids) {
            let (w, bit) = (t as usize / 64, 1u64 << (t % 64));
            if seen[w] & bit == 0 {
                seen[w] |= bit;
                let l = &mut logits[t as usize];
                *l = if *l > 0.0 { *l / rep } else { *l * rep };
            }
        }
        for &t in input.prompt_ids.iter().chain(input.output_ids) {
            seen[t as usize / 64] = 0;
        }
    }
    let (freq, pres) = (p.frequency_penalty, p.presence_penalty);
    if (freq != 0.0 || pres != 0.0) && !input.output_ids.is_empty() {
        let ids = &mut scratch.ids;
        ids.clear();
        ids.extend_from_slice(input.output_ids);
        ids.sort_unstable();
        for run in ids.chunk_by(|a, b| a == b) {
            let l = &mut logits[run[0] as usize];
            *l -= freq * run.len() as f32;
            *l -= pres;
        }
    }
}

/// Largest logit and its lowest index.
fn argmax(logits: &[f32]) -> (u32, f32) {
    let (i, v) = max_index(logits);
    (i as u32, v)
}

/// Orders `(weight, id)` by weight descending, then id ascending: a total order.
fn desc(a: &(f64, u32), b: &(f64, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// Temperature, top-k, top-p, min-p and the inverse-CDF draw (module doc rules).
fn sample_filtered(
    logits: &[f32],
    max: f32,
    p: &SamplingParams,
    u: f64,
    scratch: &mut Scratch,
) -> u32 {
    let vocab = logits.len();
    let finite = logits.iter().filter(|l| **l > f32::NEG_INFINITY).count();
    // Top-k threshold on raw logits: dividing by T > 0 keeps their order exactly.
    let mut threshold = f32::NEG_INFINITY;
    if p.top_k > 0 && (p.top_k as usize) < finite {
        let k = p.top_k as usize;
        let values = &mut scratch.values;
        values.clear();
        values.extend(logits.iter().copied().filter(|l| *l > f32::NEG_INFINITY));
        let (_, kth, _) = values.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        threshold = *kth;
    }
    let inv_t = 1.0 / p.temperature as f64;
    let z_max = max as f64 * inv_t;
    let weights = &mut scratch.weights;
    weights.clear();
    weights.extend(logits.iter().map(|&l| {
        if l > f32::NEG_INFINITY && l >= threshold {
            (l as f64 * inv_t - z_max).exp()
        } else {
            0.0
        }
    }));
    let min_p = p.min_p as f64;

    if p.top_p < 1.0 {
        let total: f64 = weights.iter().sum();
        let target = p.top_p as f64 * total;
        let pairs = &mut scratch.pairs;
        pairs.clear();
        pairs.extend(
            weights
                .iter()
                .enumerate()
                .filter(|(_, w)| **w > 0.0)
                .map(|(i, &w)| (w, i as u32)),
        );
        let n = nucleus_len(pairs, target);
        // The nucleus is small: sort it by id and draw from it in id order.
        let kept = &mut pairs[..n];
        kept.sort_unstable_by_key(|&(_, id)| id);
        let kept_total: f64 = kept
            .iter()
            .filter(|(w, _)| *w >= min_p)
            .map(|(w, _)| w)
            .sum();
        let goal = u * kept_total;
        let mut cum = 0.0;
        let mut last = kept[0].1;
        for &(w, id) in kept.iter().filter(|(w, _)| *w >= min_p) {
            cum += w;
            last = id;
            if cum > goal {
                return id;
            }
        }
        return last;
    }

    let keep = |w: f64| w > 0.0 && w >= min_p;
    let kept_total: f64 = weights.iter().filter(|w| keep(**w)).sum();
    let goal = u * kept_total;
    let mut cum = 0.0;
    let mut last = 0u32;
    for (id, &w) in weights.iter().enumerate().take(vocab) {
        if keep(w) {
            cum += w;
            last = id as u32;
            if cum > goal {
                return id as u32;
            }
        }
    }
    last
}

/// Length of the shortest prefix of `pairs` sorted by [`desc`] whose running sum
/// reaches `target`, leaving that prefix sorted at the front of `pairs`. Sorts
/// blocks of growing size instead of everything: select the next block's members
/// in O(n), sort only them.
fn nucleus_len(pairs: &mut [(f64, u32)], target: f64) -> usize {
    let mut start = 0;
    let mut block = TOP_P_FIRST_BLOCK;
    let mut cum = 0.0;
    while start < pairs.len() {
        let rest = &mut pairs[start..];
        let end = if rest.len() > block {
            rest.select_nth_unstable_by(block - 1, desc);
            start + block
        } else {
            pairs.len()
        };
        pairs[start..end].sort_unstable_by(desc);
        for (i, &(w, _)) in pairs[start..end].iter().enumerate() {
            cum += w;
            if cum >= target {
                return start + i + 1;
            }
        }
        start = end;
        block = block.saturating_mul(4);
    }
    pairs.len()
}

/// Natural-log normaliser of the processed logits (f64 accumulation).
fn log_sum_exp(logits: &[f32], max: f32) -> f64 {
    let m = max as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - m).exp()).sum();
    m + sum.ln()
}

/// Logprobs of the sampled token and of the listed tokens, in their order
/// (`logprob_token_ids`).
fn logprobs_of(logits: &[f32], max: f32, token: u32, ids: &[u32]) -> TokenLogprobs {
    let lse = log_sum_exp(logits, max);
    let logprob = |t: u32| (logits[t as usize] as f64 - lse) as f32;
    TokenLogprobs {
        token_id: token,
        logprob: logprob(token),
        top: ids.iter().map(|&t| (t, logprob(t))).collect(),
    }
}

/// Log-softmax of the processed logits (f64 accumulation) for the sampled token and
/// the `n` most likely tokens, descending with ties to the lower id.
fn compute_logprobs(logits: &[f32], max: f32, token: u32, n: usize) -> TokenLogprobs {
    let lse = log_sum_exp(logits, max);
    let logprob = |l: f32| (l as f64 - lse) as f32;
    // Insertion into a tiny sorted list; most logits fail the first comparison.
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if top.len() == n && l <= top[n - 1].1 {
                continue; // equal values keep the earlier (lower) id
            }
            let pos = top.partition_point(|&(_, v)| v >= l);
            top.insert(pos, (i as u32, l));
            top.truncate(n);
        }
    }
    TokenLogprobs {
        token_id: token,
        logprob: logprob(logits[token as usize]),
        top: top.into_iter().map(|(i, l)| (i, logprob(l))).collect(),
    }
}
