//! Speculative decoding (vLLM's `--speculative-config`): n-gram proposals, or a
//! draft model's ([`draft`]).
//!
//! The pieces, in the order a step meets them:
//! - [`SpeculativeConfig`]: the parsed JSON (vLLM's field names), refused at start
//!   with the reason when a field or method is unknown;
//! - [`ngram`]: prompt lookup, proposing up to `num_speculative_tokens` tokens that
//!   followed the longest earlier occurrence of the sequence's suffix;
//! - the scheduler (pagoda-scheduler's `scheduler/spec.rs`) schedules the drafts
//!   after the last known token, counting them in the budget and giving them KV slots;
//! - the runner appends them to the row's input ids, asks for logits at all `k + 1`
//!   positions, and hands the attention backends one decode row per token (causal by
//!   construction, served by `paged` with a decode row's arithmetic);
//! - [`verify`]: vLLM's rejection sampler, exact for greedy and sampled requests;
//! - the scheduler rolls `num_computed_tokens` back over the rejected drafts and
//!   appends the kept tokens one stop check at a time.
//!
//! Which requests speculate ([`eligible`]): all but those with a structured-output
//! grammar (its mask would have to advance through every draft) and those with stop
//! strings (matched on text by the engine, which would see tokens past the stop that
//! a run without speculation never generates). Every other sampling parameter
//! (penalties, `min_tokens`, bad words, biases, logprobs, seeds) is applied at each
//! verified position with the drafts before it as output tokens, so it behaves as
//! without speculation.

pub mod draft;
pub mod ngram;
pub mod probs;
pub mod verify;

use crate::EngineError;
use pagoda_core::CheckedParams;
use pagoda_scheduler::SpecDecodingStats;
use serde::Deserialize;

/// The supported speculation methods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecMethod {
    /// Prompt lookup over the request's own tokens (vLLM's `"ngram"`).
    Ngram,
    /// A smaller model with the target's vocabulary, greedy (vLLM's
    /// `"draft_model"`, its `"model"` field: a GGUF file or an HF directory).
    DraftModel { model: std::path::PathBuf },
}

/// `--speculative-config`, resolved (vLLM's defaults filled in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculativeConfig {
    pub method: SpecMethod,
    /// Drafts proposed per step (`k`).
    pub num_speculative_tokens: usize,
    /// Shortest suffix that may match (vLLM's `prompt_lookup_min`).
    pub prompt_lookup_min: usize,
    /// Longest suffix tried first (vLLM's `prompt_lookup_max`).
    pub prompt_lookup_max: usize,
}

/// The JSON as vLLM spells it; any other field is refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    method: Option<String>,
    num_speculative_tokens: Option<usize>,
    prompt_lookup_min: Option<usize>,
    prompt_lookup_max: Option<usize>,
    model: Option<String>,
}

/// vLLM's default lookup window when neither bound is given.
pub const DEFAULT_PROMPT_LOOKUP: usize = 5;

impl SpeculativeConfig {
    /// Parses `--speculative-config` JSON. vLLM's rules: `method` and
    /// `num_speculative_tokens` are required; with neither lookup bound both are 5,
    /// with one the other equals it; both at least 1 and `min <= max`.
    pub fn parse(json: &str) -> Result<Self, EngineError> {
        let bad = |m: String| EngineError::invalid("speculative_config", m);
        let raw: RawConfig = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        const SUPPORTED: &str = "supported: \"ngram\", \"draft_model\"";
        let method = match (raw.method.as_deref(), &raw.model) {
            (Some("ngram"), None) => SpecMethod::Ngram,
            (Some("ngram"), Some(_)) => {
                return Err(bad("\"model\" is not used by method \"ngram\"".into()))
            }
            (Some("draft_model"), Some(m)) => {
                if raw.prompt_lookup_min.is_some() || raw.prompt_lookup_max.is_some() {
                    return Err(bad(
                        "prompt_lookup_min/max are not used by method \"draft_model\"".into(),
                    ));
                }
                SpecMethod::DraftModel { model: m.into() }
            }
            (Some("draft_model"), None) => {
                return Err(bad(
                    "method \"draft_model\" needs \"model\" (a GGUF file or HF directory)".into(),
                ))
            }
            (Some(other), _) => {
                return Err(bad(format!(
                    "method {other:?} is not supported ({SUPPORTED})"
                )))
            }
            (None, _) => return Err(bad(format!("\"method\" is required ({SUPPORTED})"))),
        };
        let k = raw
            .num_speculative_tokens
            .ok_or_else(|| bad("\"num_speculative_tokens\" is required".into()))?;
        if k == 0 {
            return Err(bad("\"num_speculative_tokens\" must be at least 1".into()));
        }
        let (min, max) = match (raw.prompt_lookup_min, raw.prompt_lookup_max) {
            (None, None) => (DEFAULT_PROMPT_LOOKUP, DEFAULT_PROMPT_LOOKUP),
            (Some(m), None) | (None, Some(m)) => (m, m),
            (Some(a), Some(b)) => (a, b),
        };
        if min == 0 || max == 0 {
            return Err(bad(
                "prompt_lookup_min and prompt_lookup_max must be at least 1".into(),
            ));
        }
        if min > max {
            return Err(bad(format!(
                "prompt_lookup_min ({min}) must not exceed prompt_lookup_max ({max})"
            )));
        }
        Ok(SpeculativeConfig {
            method,
            num_speculative_tokens: k,
            prompt_lookup_min: min,
            prompt_lookup_max: max,
        })
    }

    /// Drafts for a sequence (prompt then outputs), at most `limit` of them.
    pub fn propose(&self, tokens: &[u32], limit: usize) -> Vec<u32> {
        let k = self.num_speculative_tokens.min(limit);
        if k == 0 {
            return Vec::new();
        }
        match self.method {
            SpecMethod::Ngram => {
                ngram::propose(tokens, self.prompt_lookup_min, self.prompt_lookup_max, k)
            }
            // Batched over the step's requests by the runner ([`draft`]).
            SpecMethod::DraftModel { .. } => Vec::new(),
        }
    }
}

/// Logs the speculation set up at start.
pub fn log_config(spec: Option<&SpeculativeConfig>) {
    match spec {
        Some(c) => tracing::info!(
            "speculative decoding: {:?}, {} tokens per step{} \
             (not for requests with stop strings or structured outputs)",
            c.method,
            c.num_speculative_tokens,
            match c.method {
                SpecMethod::Ngram => format!(
                    ", prompt lookup {}..={}",
                    c.prompt_lookup_min, c.prompt_lookup_max
                ),
                SpecMethod::DraftModel { .. } => String::new(),
            }
        ),
        None => tracing::debug!("speculative decoding: off"),
    }
}

/// vLLM's periodic spec-decode log line for the counters' change since `prev`.
pub fn log_line(now: &SpecDecodingStats, prev: &SpecDecodingStats) -> Option<String> {
    let drafts = now.num_drafts - prev.num_drafts;
    if drafts == 0 {
        return None;
    }
    let drafted = now.num_draft_tokens - prev.num_draft_tokens;
    let accepted = now.num_accepted_tokens - prev.num_accepted_tokens;
    let per_pos: Vec<String> = now
        .num_accepted_tokens_per_pos
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let before = prev
                .num_accepted_tokens_per_pos
                .get(i)
                .copied()
                .unwrap_or(0);
            format!("{:.3}", (c - before) as f64 / drafts as f64)
        })
        .collect();
    Some(format!(
        "SpecDecoding metrics: Mean acceptance length: {:.2}, Accepted: {accepted} tokens, \
         Drafted: {drafted} tokens, Per-position acceptance rate: {}, \
         Avg Draft acceptance rate: {:.1}%",
        1.0 + accepted as f64 / drafts as f64,
        per_pos.join(", "),
        100.0 * accepted as f64 / drafted.max(1) as f64
    ))
}

/// Whether a request may speculate (module doc): no grammar, no stop strings.
pub fn eligible(params: &CheckedParams, has_grammar: bool) -> bool {
    !has_grammar && params.stop.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_defaults_and_errors() {
        let c =
            SpeculativeConfig::parse(r#"{"method":"ngram","num_speculative_tokens":3}"#).unwrap();
        assert_eq!((c.prompt_lookup_min, c.prompt_lookup_max), (5, 5));
        let c = SpeculativeConfig::parse(
            r#"{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3}"#,
        )
        .unwrap();
        assert_eq!(
            (
                c.num_speculative_tokens,
                c.prompt_lookup_min,
                c.prompt_lookup_max
            ),
            (4, 3, 3)
        );
        let c = SpeculativeConfig::parse(
            r#"{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":2,"prompt_lookup_max":4}"#,
        )
        .unwrap();
        assert_eq!((c.prompt_lookup_min, c.prompt_lookup_max), (2, 4));
        for (json, needle) in [
            (
                r#"{"method":"eagle","num_speculative_tokens":3}"#,
                "not supported",
            ),
            (r#"{"num_speculative_tokens":3}"#, "\"method\" is required"),
            (r#"{"method":"ngram"}"#, "num_speculative_tokens"),
            (
                r#"{"method":"ngram","num_speculative_tokens":0}"#,
                "at least 1",
            ),
            (
                r#"{"method":"ngram","num_speculative_tokens":3,"model":"x"}"#,
                "not used by method",
            ),
            (
                r#"{"method":"draft_model","num_speculative_tokens":3}"#,
                "needs \"model\"",
            ),
            (
                r#"{"method":"draft_model","model":"d.gguf","num_speculative_tokens":3,"prompt_lookup_max":2}"#,
                "not used by method",
            ),
            (
                r#"{"method":"ngram","num_speculative_tokens":3,"draft_model":"x"}"#,
                "unknown field",
            ),
            (
                r#"{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":4,"prompt_lookup_max":2}"#,
                "must not exceed",
            ),
            ("not json", "expected"),
        ] {
            let e = SpeculativeConfig::parse(json).unwrap_err().to_string();
            assert!(e.contains(needle), "{json}: {e}");
        }
    }
}
