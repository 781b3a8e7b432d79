//! Bounds on the request fields that multiply what one request costs: every list a
//! request may send is capped where it enters, each cap a flag with a default,
//! and a request past one gets a 400 naming the field and the flag.
//!
//! What each cap stops (issue 29's probe): a long `logprob_token_ids` list is
//! reported at every position of every sample (the whole vocabulary over 200
//! tokens answered 287 MB); `logit_bias`, `bad_words`, `stop_token_ids` and
//! `allowed_token_ids` are walked per row at every step. Token-id lists longer
//! than the vocabulary can only repeat ids, so they are capped at its size.
//! `logprobs`/`prompt_logprobs` (`--max-logprobs`), `n` (`--max-seqs-per-request`),
//! stop strings and structured-output constraints have bounds of their own.

use super::error::ApiError;
use super::protocol::CommonFields;

/// vLLM's cap on `logprob_token_ids`.
pub const DEFAULT_MAX_LOGPROB_TOKEN_IDS: usize = 128;
/// Default of `--max-logit-bias` (OpenAI documents no cap; vLLM has none).
pub const DEFAULT_MAX_LOGIT_BIAS: usize = 1024;
/// Default of `--max-bad-words`.
pub const DEFAULT_MAX_BAD_WORDS: usize = 256;

/// The per-request list caps (`pagoda serve` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestLimits {
    /// `--max-logprob-token-ids`.
    pub max_logprob_token_ids: usize,
    /// `--max-logit-bias`: entries of `logit_bias`.
    pub max_logit_bias: usize,
    /// `--max-bad-words`.
    pub max_bad_words: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_logprob_token_ids: DEFAULT_MAX_LOGPROB_TOKEN_IDS,
            max_logit_bias: DEFAULT_MAX_LOGIT_BIAS,
            max_bad_words: DEFAULT_MAX_BAD_WORDS,
        }
    }
}

impl RequestLimits {
    /// Checks every capped list of `c` against its cap (`vocab`: the model's
    /// vocabulary size, the cap of the token-id lists).
    pub fn check(&self, c: &CommonFields, vocab: usize) -> Result<(), ApiError> {
        let over = |field: &str, len: usize, cap: usize, flag: &str| {
            Err(ApiError::bad(
                field,
                format!("`{field}` has {len} entries; at most {cap} are allowed ({flag})"),
            ))
        };
        let len = |v: &Option<Vec<u32>>| v.as_ref().map_or(0, Vec::len);
        if len(&c.logprob_token_ids) > self.max_logprob_token_ids {
            return over(
                "logprob_token_ids",
                len(&c.logprob_token_ids),
                self.max_logprob_token_ids,
                "--max-logprob-token-ids",
            );
        }
        let bias = c.logit_bias.as_ref().map_or(0, |b| b.len());
        if bias > self.max_logit_bias {
            return over("logit_bias", bias, self.max_logit_bias, "--max-logit-bias");
        }
        let bad = c.bad_words.as_ref().map_or(0, Vec::len);
        if bad > self.max_bad_words {
            return over("bad_words", bad, self.max_bad_words, "--max-bad-words");
        }
        for (field, ids) in [
            ("stop_token_ids", &c.stop_token_ids),
            ("allowed_token_ids", &c.allowed_token_ids),
        ] {
            if len(ids) > vocab {
                return over(field, len(ids), vocab, "the vocabulary's size");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(v: serde_json::Value) -> CommonFields {
        serde_json::from_value(v).expect("valid fields")
    }

    #[test]
    fn each_list_is_capped_with_its_flag_named() {
        let l = RequestLimits::default();
        let ok = fields(serde_json::json!({"logprob_token_ids": (0..128).collect::<Vec<u32>>()}));
        assert!(l.check(&ok, 1000).is_ok());
        let cases = [
            (
                serde_json::json!({"logprob_token_ids": (0..129).collect::<Vec<u32>>()}),
                "--max-logprob-token-ids",
            ),
            (
                serde_json::json!({"logit_bias": (0..1025).map(|i| (i.to_string(), serde_json::Value::from(1.0))).collect::<serde_json::Map<_, _>>()}),
                "--max-logit-bias",
            ),
            (
                serde_json::json!({"bad_words": vec!["x"; 257]}),
                "--max-bad-words",
            ),
            (
                serde_json::json!({"stop_token_ids": vec![1; 1001]}),
                "vocabulary",
            ),
            (
                serde_json::json!({"allowed_token_ids": vec![1; 1001]}),
                "vocabulary",
            ),
        ];
        for (v, flag) in cases {
            let e = l.check(&fields(v.clone()), 1000).expect_err("over the cap");
            let msg = format!("{e:?}");
            assert!(msg.contains(flag), "{v}: {msg}");
        }
    }
}
