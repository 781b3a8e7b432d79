//! Structured outputs after the reasoning (vLLM's rule for a reasoning model): a
//! constraint applies to the answer, not to the `<think>…</think>` before it, so
//! a reasoning model under a JSON schema may think first. While the reasoning
//! runs the grammar allows every token and consumes none; the token that
//! completes the end marker opens it, and from the next token the constraint
//! applies as if the output started there.
//!
//! Where the reasoning starts is the parser's: `starts_in_reasoning` (DeepSeek-R1,
//! whose template opens `<think>` in the prompt) closes the gate from the first
//! token; otherwise (Qwen3) reasoning comes only when the output opens with the
//! start marker, so the first token may be the marker (when it is one token) or
//! any token the grammar allows. A prompt whose last marker is an end marker
//! (Qwen3's `enable_thinking: false` writes an empty think block) has no
//! reasoning to come: the constraint applies from the first token; one whose last
//! marker is a start marker is in reasoning already.

use std::sync::Arc;

/// The markers of a reasoning format, as token ids of the model's tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningGate {
    pub start: Vec<u32>,
    pub end: Vec<u32>,
    /// The output is reasoning from its first token (without a start marker).
    pub starts_in_reasoning: bool,
}

/// Where a gated grammar is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    /// The constraint applies.
    Open,
    /// In reasoning: every token is allowed until `end` has been generated.
    Closed { end: Arc<[u32]>, recent: Vec<u32> },
    /// The first token decides: `start` opens reasoning, anything else (the
    /// grammar's) opens the constraint.
    Undecided { start: u32, end: Arc<[u32]> },
}

/// Last position at which `pat` occurs in `ids`.
fn rfind(ids: &[u32], pat: &[u32]) -> Option<usize> {
    if pat.is_empty() || pat.len() > ids.len() {
        return None;
    }
    (0..=ids.len() - pat.len())
        .rev()
        .find(|&i| &ids[i..i + pat.len()] == pat)
}

impl Gate {
    /// The gate of a request with this prompt.
    pub(crate) fn new(g: &ReasoningGate, prompt: &[u32]) -> Gate {
        if g.end.is_empty() {
            return Gate::Open;
        }
        let end: Arc<[u32]> = g.end.clone().into();
        let closed = || Gate::Closed {
            end: end.clone(),
            recent: Vec::new(),
        };
        match (rfind(prompt, &g.start), rfind(prompt, &g.end)) {
            (s, Some(e)) if s.is_none_or(|s| s < e) => return Gate::Open,
            (Some(_), _) => return closed(),
            _ => {}
        }
        match (g.starts_in_reasoning, g.start.as_slice()) {
            (true, _) => closed(),
            (false, &[start]) => Gate::Undecided { start, end },
            // A start marker of several tokens cannot be offered beside the
            // grammar's first mask: the constraint applies from the first token.
            (false, _) => Gate::Open,
        }
    }

    /// Advances by a generated token; true when the grammar's matcher must consume
    /// it (the gate is open for it).
    pub(crate) fn accept(&mut self, token: u32) -> bool {
        match self {
            Gate::Open => true,
            Gate::Closed { end, recent } => {
                recent.push(token);
                if recent.len() > end.len() {
                    recent.remove(0);
                }
                if recent.as_slice() == &end[..] {
                    *self = Gate::Open;
                }
                false
            }
            Gate::Undecided { start, end } => {
                if token == *start {
                    *self = Gate::Closed {
                        end: end.clone(),
                        recent: Vec::new(),
                    };
                    false
                } else {
                    *self = Gate::Open;
                    true
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(start: &[u32], end: &[u32], sir: bool) -> ReasoningGate {
        ReasoningGate {
            start: start.to_vec(),
            end: end.to_vec(),
            starts_in_reasoning: sir,
        }
    }

    #[test]
    fn the_prompt_decides_first() {
        let g = gate(&[7], &[8, 9], false);
        // An empty think block closed in the prompt: no reasoning to come.
        assert_eq!(Gate::new(&g, &[1, 7, 8, 9, 2]), Gate::Open);
        // Opened in the prompt: in reasoning already.
        assert!(matches!(Gate::new(&g, &[1, 7, 2]), Gate::Closed { .. }));
        assert!(matches!(
            Gate::new(&g, &[7, 8, 9, 1, 7]),
            Gate::Closed { .. }
        ));
        // No marker: the parser's rule.
        assert!(matches!(
            Gate::new(&g, &[1, 2]),
            Gate::Undecided { start: 7, .. }
        ));
        let r1 = gate(&[7], &[8, 9], true);
        assert!(matches!(Gate::new(&r1, &[1, 2]), Gate::Closed { .. }));
        assert_eq!(Gate::new(&gate(&[5, 6], &[8], false), &[1]), Gate::Open);
    }

    #[test]
    fn the_end_marker_opens_it_on_its_last_token() {
        let mut gt = Gate::new(&gate(&[7], &[8, 9], true), &[]);
        for t in [3, 8, 4, 9, 8] {
            assert!(!gt.accept(t), "{t}: still reasoning");
        }
        assert!(!gt.accept(9), "the marker's last token is reasoning's");
        assert_eq!(gt, Gate::Open);
        assert!(gt.accept(5));
    }

    #[test]
    fn the_first_token_decides_when_undecided() {
        let g = gate(&[7], &[8], false);
        let mut a = Gate::new(&g, &[]);
        assert!(a.accept(3), "an answer token: the grammar consumes it");
        assert_eq!(a, Gate::Open);
        let mut b = Gate::new(&g, &[]);
        assert!(!b.accept(7));
        assert!(!b.accept(3));
        assert!(!b.accept(8));
        assert!(b.accept(3));
    }
}
