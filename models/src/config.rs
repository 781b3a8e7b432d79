//! The decoder's hyper-parameters, from `config.json` or GGUF metadata: the Llama
//! shape plus the family switches ([`ArchConfig`]).

use crate::arch::{ArchConfig, AttnKind};
use crate::error::ModelError;
use pagoda_core::AttentionConfig;
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
    /// Per-frequency RoPE divisors (`head_dim / 2` of them): inverse frequency `i` is
    /// divided by `rope_freq_factors[i]`. GGUF files store Llama 3.1's llama3 scaling
    /// this way, as the tensor `rope_freqs.weight`.
    #[serde(default)]
    pub rope_freq_factors: Option<Vec<f32>>,
    /// The context length the model was trained for (the default max model length).
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// The family switches (default: plain Llama).
    #[serde(default)]
    pub arch: ArchConfig,
}

impl LlamaConfig {
    /// Weights of the linear layers one token's forward multiplies by, LM head left
    /// out (it runs on sampled rows only): attention Q, K, V, O and the MLP, or the
    /// `top_k` experts of a MoE MLP plus its router. About a prompt token's cost.
    pub fn linear_params_per_token(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let attn = h * (2 * q + 2 * kv);
        let mlp = match self.arch.moe {
            Some(m) => 3 * h * self.intermediate_size * m.top_k + h * m.num_experts,
            None => 3 * h * self.intermediate_size,
        };
        self.num_layers * (attn + mlp)
    }

    /// The distinct attention kinds of the layers, and each layer's index into them
    /// (one backend instance serves each kind: Gemma 2's sliding and global layers
    /// get two).
    pub fn attention_kinds(&self) -> (Vec<AttnKind>, Vec<usize>) {
        let mut kinds: Vec<AttnKind> = Vec::new();
        let mut of_layer = Vec::with_capacity(self.num_layers);
        for l in 0..self.num_layers {
            let k = self.arch.attn_kind(l, self.head_dim);
            let i = match kinds.iter().position(|x| *x == k) {
                Some(i) => i,
                None => {
                    kinds.push(k);
                    kinds.len() - 1
                }
            };
            of_layer.push(i);
        }
        (kinds, of_layer)
    }

    /// The attention configurations (CPU, f32) of [`LlamaConfig::attention_kinds`],
    /// in that order.
    pub fn attention_configs(&self, block_size: usize) -> Vec<AttentionConfig> {
        self.attention_kinds()
            .0
            .iter()
            .map(|k| AttentionConfig {
                scale: k.scale,
                sliding_window: k.sliding_window,
                logits_soft_cap: k.logits_soft_cap,
                ..AttentionConfig::cpu_f32(
                    self.num_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    block_size,
                )
            })
            .collect()
    }

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

/// One configuration that needs everything `configs` need (a sliding window if any
/// has one, a soft cap if any has one): what a backend must support to serve every
/// layer, for the selector and `pagoda backends`.
pub fn merge_attention_configs(configs: &[AttentionConfig]) -> AttentionConfig {
    let mut merged = configs[0].clone();
    for c in &configs[1..] {
        merged.sliding_window = merged.sliding_window.or(c.sliding_window);
        merged.logits_soft_cap = merged.logits_soft_cap.or(c.logits_soft_cap);
    }
    merged
}
