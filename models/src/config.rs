//! The Llama-family hyper-parameters, from `config.json` or GGUF metadata.

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
