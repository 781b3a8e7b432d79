//! Speculative decoding in the scheduler (vLLM V1's lookahead tokens).
//!
//! The model runner proposes draft tokens after a row is sampled
//! ([`pagoda_core::ModelRunnerOutput::spec_token_ids`]); they wait in
//! [`Request::spec_token_ids`] until the request's next step, which schedules its
//! last known token *plus* the drafts (the token budget counts them, and
//! `allocate_slots` gives them KV slots). Prefix caching only ever registers blocks
//! full of known tokens (`allocate_slots` caps at `num_tokens`, which drafts are not
//! part of), so a draft never enters the cache's hash map.
//!
//! After the step the runner reports a [`SpecDecodeRow`]: the accepted drafts and the
//! target's own token. `num_computed_tokens` is stepped back over the rejected drafts,
//! so their KV slots are simply overwritten later (the blocks stay with the request
//! and are reused, as in vLLM); the tokens are then appended one by one with the
//! stop check after each, so a stop token or `max_tokens` ends the request exactly
//! where it would have ended without speculation, and the rest is dropped.

use crate::hashing::update_block_hashes;
use pagoda_core::{Request, SpecDecodeRow, TokenLogprobs};

/// vLLM's spec-decode counters (`vllm:spec_decode_*`), cumulative.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecDecodingStats {
    /// Verified rows that carried at least one draft.
    pub num_drafts: u64,
    /// Draft tokens verified.
    pub num_draft_tokens: u64,
    /// Draft tokens accepted.
    pub num_accepted_tokens: u64,
    /// Per draft position: how many times the draft at that position was accepted.
    pub num_accepted_tokens_per_pos: Vec<u64>,
}

impl SpecDecodingStats {
    pub fn observe(&mut self, num_draft_tokens: usize, num_accepted: usize) {
        if num_draft_tokens == 0 {
            return;
        }
        self.num_drafts += 1;
        self.num_draft_tokens += num_draft_tokens as u64;
        self.num_accepted_tokens += num_accepted as u64;
        if self.num_accepted_tokens_per_pos.len() < num_draft_tokens {
            self.num_accepted_tokens_per_pos.resize(num_draft_tokens, 0);
        }
        for c in &mut self.num_accepted_tokens_per_pos[..num_accepted] {
            *c += 1;
        }
    }

    /// Accepted over drafted tokens (0 before any draft).
    pub fn acceptance_rate(&self) -> f64 {
        if self.num_draft_tokens == 0 {
            0.0
        } else {
            self.num_accepted_tokens as f64 / self.num_draft_tokens as f64
        }
    }

    /// Sums another core's counters into these.
    pub fn add(&mut self, other: &SpecDecodingStats) {
        self.num_drafts += other.num_drafts;
        self.num_draft_tokens += other.num_draft_tokens;
        self.num_accepted_tokens += other.num_accepted_tokens;
        let n = other.num_accepted_tokens_per_pos.len();
        if self.num_accepted_tokens_per_pos.len() < n {
            self.num_accepted_tokens_per_pos.resize(n, 0);
        }
        for (a, b) in self
            .num_accepted_tokens_per_pos
            .iter_mut()
            .zip(&other.num_accepted_tokens_per_pos)
        {
            *a += b;
        }
    }
}

/// Steps a verified row's request back over its rejected drafts and counts the row.
pub(super) fn roll_back(req: &mut Request, row: &SpecDecodeRow, stats: &mut SpecDecodingStats) {
    req.num_computed_tokens -= row.num_rejected().min(req.num_computed_tokens);
    stats.observe(row.num_draft_tokens, row.num_accepted());
}

/// What [`append_tokens`] kept of a step's tokens.
pub(super) struct Appended {
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprobs>,
    pub finished: bool,
}

/// Appends `tokens` one at a time, each followed by the block hashes' update and the
/// stop check, stopping at the first that finishes the request (the rest are
/// dropped, as if never sampled). `logprobs` is empty or one per token.
pub(super) fn append_tokens(
    req: &mut Request,
    tokens: &[u32],
    logprobs: &[TokenLogprobs],
    max_len: usize,
    caching: Option<usize>,
) -> Appended {
    let mut out = Appended {
        token_ids: Vec::with_capacity(tokens.len()),
        logprobs: Vec::new(),
        finished: false,
    };
    for (i, &tok) in tokens.iter().enumerate() {
        req.append_output_token(tok);
        if let Some(bs) = caching {
            if req.num_tokens() / bs > req.block_hashes.len() {
                update_block_hashes(req, bs);
            }
        }
        out.token_ids.push(tok);
        if let Some(lp) = logprobs.get(i) {
            out.logprobs.push(lp.clone());
        }
        if super::stop::check_stop(req, max_len) {
            out.finished = true;
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_position_counts_are_prefixes() {
        let mut s = SpecDecodingStats::default();
        s.observe(3, 2);
        s.observe(3, 0);
        s.observe(2, 2);
        s.observe(0, 0); // no draft: not a draft
        assert_eq!(s.num_drafts, 3);
        assert_eq!(s.num_draft_tokens, 8);
        assert_eq!(s.num_accepted_tokens, 4);
        assert_eq!(s.num_accepted_tokens_per_pos, vec![2, 2, 0]);
        assert!((s.acceptance_rate() - 0.5).abs() < 1e-12);
        let mut t = SpecDecodingStats::default();
        t.observe(4, 4);
        t.add(&s);
        assert_eq!(t.num_accepted_tokens_per_pos, vec![3, 3, 1, 1]);
        assert_eq!(t.num_drafts, 4);
    }
}
