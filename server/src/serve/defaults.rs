//! Request defaults from a model's `generation_config.json`
//! (`--generation-config`): [`GenerationDefaults`].
//!
//! Its own module, apart from the frontend routes, because the shared
//! [`AppState`](super::state::AppState) holds them: the state sits below the
//! routes and so cannot reach up into their module for this plain type.

use super::protocol::CommonFields;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Request defaults a model's `generation_config.json` recommends (vLLM's
/// "default sampling parameters"): used where a request leaves the field out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    /// `max_new_tokens`: a cap on every request's `max_tokens`.
    pub max_new_tokens: Option<i64>,
}

impl GenerationDefaults {
    /// `--generation-config`: `auto` (the model directory's file, if any), `vllm`
    /// (none) or a folder holding `generation_config.json`.
    pub fn load(arg: &str, model_path: &Path) -> anyhow::Result<GenerationDefaults> {
        let file = match arg {
            "vllm" => return Ok(Self::default()),
            "auto" => {
                let f = model_path.join("generation_config.json");
                if !model_path.is_dir() || !f.is_file() {
                    return Ok(Self::default());
                }
                f
            }
            dir => {
                let f = PathBuf::from(dir).join("generation_config.json");
                if !f.is_file() {
                    anyhow::bail!(
                        "--generation-config {dir}: no generation_config.json there (valid values: auto, vllm, or a folder holding generation_config.json)"
                    );
                }
                f
            }
        };
        let text = std::fs::read_to_string(&file)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("parsing {}: {e}", file.display()))?;
        let d = Self::from_json(&v);
        if d != Self::default() {
            tracing::info!(
                "request defaults from {} (relaunch with --generation-config vllm to ignore them): {d:?}",
                file.display()
            );
        }
        Ok(d)
    }

    /// The fields that differ from transformers' `GenerationConfig` defaults (what
    /// vLLM takes through `to_diff_dict`).
    pub fn from_json(v: &Value) -> GenerationDefaults {
        let f = |k: &str, hf_default: Option<f64>| {
            v.get(k)
                .and_then(Value::as_f64)
                .filter(|x| Some(*x) != hf_default)
        };
        let i = |k: &str, hf_default: Option<i64>| {
            v.get(k)
                .and_then(Value::as_i64)
                .filter(|x| Some(*x) != hf_default)
        };
        GenerationDefaults {
            temperature: f("temperature", Some(1.0)),
            top_p: f("top_p", Some(1.0)),
            top_k: i("top_k", Some(50)),
            min_p: f("min_p", None),
            repetition_penalty: f("repetition_penalty", Some(1.0)),
            max_new_tokens: i("max_new_tokens", None),
        }
    }

    /// Fills the sampling fields a request left out.
    pub fn apply(&self, c: &mut CommonFields) {
        c.temperature = c.temperature.or(self.temperature);
        c.top_p = c.top_p.or(self.top_p);
        c.top_k = c.top_k.or(self.top_k);
        c.min_p = c.min_p.or(self.min_p);
        c.repetition_penalty = c.repetition_penalty.or(self.repetition_penalty);
    }

    /// `max_tokens` under the `max_new_tokens` cap (None stays None: the room left).
    pub fn cap_max_tokens(&self, max_tokens: Option<i64>) -> Option<i64> {
        match (max_tokens, self.max_new_tokens) {
            (Some(m), Some(cap)) => Some(m.min(cap)),
            (None, cap) => cap,
            (m, None) => m,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn generation_defaults_keep_what_differs_from_hf() {
        let d = GenerationDefaults::from_json(&json!({
            "temperature": 0.6, "top_p": 1.0, "top_k": 50, "min_p": 0.05,
            "repetition_penalty": 1.1, "max_new_tokens": 7, "do_sample": true
        }));
        assert_eq!(
            d,
            GenerationDefaults {
                temperature: Some(0.6),
                top_p: None,
                top_k: None,
                min_p: Some(0.05),
                repetition_penalty: Some(1.1),
                max_new_tokens: Some(7),
            }
        );
        let mut c = CommonFields {
            temperature: Some(0.0),
            ..Default::default()
        };
        d.apply(&mut c);
        assert_eq!(c.temperature, Some(0.0), "the request's own value wins");
        assert_eq!(c.min_p, Some(0.05));
        assert_eq!(d.cap_max_tokens(Some(16)), Some(7));
        assert_eq!(d.cap_max_tokens(Some(3)), Some(3));
        assert_eq!(d.cap_max_tokens(None), Some(7));
        assert_eq!(GenerationDefaults::default().cap_max_tokens(None), None);
    }
}
