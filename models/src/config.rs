//! The Llama-family hyper-parameters, from `config.json` or GGUF metadata.

use crate::error::ModelError;
use serde::{Deserialize, Serialize};

/// Llama-3-style RoPE frequency scaling (`rope_scaling.rope_type == "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

/// Shape and constants of a Llama-family model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    /// The context length the model was trained for (the default max model length).
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
}

impl LlamaConfig {
    /// Rejects sizes no real model has, so later products of them cannot overflow and
    /// nothing is allocated from a corrupt count.
    pub fn check_bounds(self) -> Result<Self, ModelError> {
        let c = self;
        const MAX_DIM: usize = 1 << 20;
        const MAX_VOCAB: usize = 1 << 24;
        let checks = [
            ("hidden_size", c.hidden_size, MAX_DIM),
            ("intermediate_size", c.intermediate_size, MAX_DIM),
            ("num_layers", c.num_layers, 4096),
            ("num_heads", c.num_heads, 4096),
            ("head_dim", c.head_dim, 4096),
            ("vocab_size", c.vocab_size, MAX_VOCAB),
        ];
        for (name, v, max) in checks {
            if v == 0 || v > max {
                return Err(ModelError::Metadata {
                    key: name.to_string(),
                    reason: format!("{v} is outside 1..={max}"),
                });
            }
        }
        Ok(c)
    }
}
