//! One request's grammar: the matcher, how far it has consumed the request's output,
//! the reasoning gate ahead of it and the mask it allows next, plus [`apply_mask`],
//! which applies a mask to a logits row. A leaf below both the compile pool (which
//! builds grammars) and the mask threads (which advance them).

use super::gate;
use super::gate::ReasoningGate;
use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

/// One request's matcher and how many of its output tokens it has consumed.
/// Cloning a fresh grammar is how `n` samples of one request get theirs without
/// compiling again.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    num_consumed: usize,
    /// Output tokens the matcher consumed (fewer than `num_consumed` after reasoning).
    matcher_consumed: usize,
    /// Reasoning ahead of the constrained answer ([`Grammar::after_reasoning`]).
    gate: gate::Gate,
    /// The mask before any output token, computed on the compile pool; the
    /// first [`Grammar::compute_mask`] returns it.
    first_mask: Option<SimpleVob>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("num_consumed", &self.num_consumed)
            .field("gate", &self.gate)
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Grammar {
    pub(super) fn new(matcher: Matcher) -> Self {
        Grammar {
            matcher,
            num_consumed: 0,
            matcher_consumed: 0,
            gate: gate::Gate::Open,
            first_mask: None,
        }
    }

    /// The constraint applies after the request's reasoning ([`ReasoningGate`]'s
    /// markers; `prompt` says whether reasoning is open or closed already): until
    /// then every token is allowed. For a fresh grammar (before any output).
    pub fn after_reasoning(mut self, markers: &ReasoningGate, prompt: &[u32]) -> Grammar {
        self.gate = gate::Gate::new(markers, prompt);
        self
    }

    /// Computes the first mask now (where the compile runs): an error means the
    /// constraint cannot produce any output.
    pub(super) fn precompute_first_mask(&mut self) -> Result<(), String> {
        let m = self.compute_mask()?;
        self.first_mask = Some(m);
        Ok(())
    }

    /// The tokens allowed next: EOS only once the grammar is complete.
    pub fn compute_mask(&mut self) -> Result<SimpleVob, String> {
        match self.gate {
            gate::Gate::Open => {}
            gate::Gate::Closed { .. } => {
                let len = match &self.first_mask {
                    Some(m) => m.len(),
                    None => self.grammar_mask()?.len(),
                };
                return Ok(SimpleVob::alloc_ones(len));
            }
            gate::Gate::Undecided { start, .. } => {
                let mut m = self.grammar_mask()?;
                if (start as usize) < m.len() {
                    m.allow_token(start);
                }
                return Ok(m);
            }
        }
        if let Some(m) = self.first_mask.take() {
            if self.matcher_consumed == 0 {
                return Ok(m);
            }
        }
        self.grammar_mask()
    }

    /// The matcher's mask now (the precomputed first one while it consumed nothing).
    fn grammar_mask(&mut self) -> Result<SimpleVob, String> {
        if self.matcher_consumed == 0 {
            if let Some(m) = &self.first_mask {
                return Ok(m.clone());
            }
        }
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("structured outputs: {e}"))
    }

    /// Advances the matcher by a sampled token (nothing once it stopped, e.g. on
    /// the EOS that ends a complete grammar).
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        self.num_consumed += 1;
        if !self.gate.accept(token) {
            return Ok(());
        }
        self.matcher_consumed += 1;
        self.first_mask = None;
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| format!("structured outputs: token {token} rejected: {e}"))
    }

    /// Output tokens consumed so far: must equal the request's output length
    /// whenever its next token is sampled.
    pub fn num_consumed(&self) -> usize {
        self.num_consumed
    }

    /// Whether the grammar is complete (only EOS may follow).
    pub fn is_stopped(&self) -> bool {
        self.gate == gate::Gate::Open && self.matcher.is_stopped()
    }
}

/// Sets every logit whose token `mask` does not allow to `-inf`; tokens past the
/// mask's end (a model vocabulary wider than the grammar's) are disallowed too.
pub fn apply_mask(logits: &mut [f32], mask: &SimpleVob) {
    let words = mask.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        match words.get(w).copied().unwrap_or(0) {
            u32::MAX => {}
            0 => chunk.fill(f32::NEG_INFINITY),
            bits => {
                for (b, l) in chunk.iter_mut().enumerate() {
                    if bits & (1 << b) == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_sets_disallowed_to_neg_inf() {
        let mut mask = SimpleVob::alloc(64);
        mask.allow_token(1);
        mask.allow_token(33);
        // The logits are wider than the mask: the tail is disallowed.
        let mut logits = vec![0.5f32; 70];
        apply_mask(&mut logits, &mask);
        for (i, l) in logits.iter().enumerate() {
            if i == 1 || i == 33 {
                assert_eq!(*l, 0.5, "token {i}");
            } else {
                assert_eq!(*l, f32::NEG_INFINITY, "token {i}");
            }
        }
        let mut all = SimpleVob::alloc(32);
        all.set_all(true);
        let mut logits = vec![1.0f32; 32];
        apply_mask(&mut logits, &all);
        assert!(logits.iter().all(|&l| l == 1.0));
    }
}
