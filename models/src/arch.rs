//! What distinguishes the decoder families from plain Llama: [`Architecture`] (the
//! family a checkpoint names) and [`ArchConfig`] (the switches of the one shared
//! decoder in [`crate::llama`]), plus the per-layer attention each needs
//! ([`AttnKind`]).
//!
//! The families differ in a handful of switches, not in structure, so one decoder
//! runs them all (as vLLM's Llama-derived models do): Qwen2 adds a bias to Q/K/V,
//! Qwen3 normalises each head of Q and K, Mistral limits attention to a sliding
//! window, Gemma 2 scales the embedding, wraps attention and MLP in pre- and
//! post-norms, uses tanh-GELU, soft-caps attention and final logits and alternates
//! sliding and global layers, and Mixtral replaces the MLP by a sparse MoE.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A supported model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Architecture {
    #[default]
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Mixtral,
}

impl Architecture {
    /// Every family, for error messages and docs.
    pub const ALL: [Architecture; 6] = [
        Architecture::Llama,
        Architecture::Mistral,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma2,
        Architecture::Mixtral,
    ];

    /// The HF `architectures` entry of this family.
    pub fn hf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Gemma2 => "Gemma2ForCausalLM",
            Architecture::Mixtral => "MixtralForCausalLM",
        }
    }

    /// The family of an HF `architectures` entry.
    pub fn from_hf(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.hf_name() == name)
    }

    /// The HF `model_type` of this family (used when `architectures` is absent).
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma2 => "gemma2",
            Architecture::Mixtral => "mixtral",
        }
    }

    /// Comma-separated HF names, for "supported: ..." messages.
    pub fn supported_hf() -> String {
        Self::ALL.map(|a| a.hf_name()).join(", ")
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.model_type())
    }
}

/// Which layers use the sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SlidingLayers {
    /// Every layer (Mistral, Mixtral).
    #[default]
    All,
    /// Layers 0, 2, 4, ... (Gemma 2: sliding and global layers alternate, the first
    /// sliding).
    Even,
}

/// The MLP's activation (applied to the gate projection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Activation {
    /// SwiGLU (`silu(gate) * up`).
    #[default]
    Silu,
    /// GeGLU with the tanh approximation of GELU (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// A Mixtral-style sparse MoE MLP: a router picks `top_k` of `num_experts` SwiGLU
/// experts per token; their outputs are mixed by the renormalised softmax weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
}

/// The family switches of the shared decoder. The default is plain Llama.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ArchConfig {
    pub architecture: Architecture,
    /// Q, K and V projections have a bias (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Attention sees only the last `w` positions (the query's own included).
    pub sliding_window: Option<usize>,
    pub sliding_layers: SlidingLayers,
    /// `s = cap * tanh(s / cap)` on the scaled attention scores (Gemma 2).
    pub attn_logit_softcap: Option<f32>,
    /// `logits = cap * tanh(logits / cap)` on the LM head's output (Gemma 2).
    pub final_logit_softcap: Option<f32>,
    /// The softmax scale is `query_pre_attn_scalar^-1/2` instead of `head_dim^-1/2`
    /// (Gemma 2).
    pub query_pre_attn_scalar: Option<f32>,
    /// The embedding is multiplied by `sqrt(hidden_size)` (Gemma 2).
    pub scale_embedding: bool,
    /// Norms after attention and after the MLP, before their residual adds, and the
    /// MLP's input norm is its own (Gemma 2's four norms per layer).
    pub post_norms: bool,
    pub activation: Activation,
    pub moe: Option<MoeConfig>,
}

/// The attention one layer asks of a backend: what its `AttentionConfig` adds to the
/// model's shape. Layers with equal kinds share a backend instance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnKind {
    pub scale: f32,
    pub sliding_window: Option<usize>,
    pub logits_soft_cap: Option<f32>,
}

impl ArchConfig {
    /// Whether layer `l` uses the sliding window.
    pub fn is_sliding(&self, l: usize) -> bool {
        self.sliding_window.is_some()
            && match self.sliding_layers {
                SlidingLayers::All => true,
                SlidingLayers::Even => l.is_multiple_of(2),
            }
    }

    /// The attention of layer `l` for a model of head dim `head_dim`.
    pub fn attn_kind(&self, l: usize, head_dim: usize) -> AttnKind {
        let scale = match self.query_pre_attn_scalar {
            Some(s) => 1.0 / s.sqrt(),
            None => 1.0 / (head_dim as f32).sqrt(),
        };
        AttnKind {
            scale,
            sliding_window: self.sliding_window.filter(|_| self.is_sliding(l)),
            logits_soft_cap: self.attn_logit_softcap,
        }
    }

    /// The features a user should know the model needs (for logs and `pagoda
    /// backends`): `sliding window 4096 (every other layer)`, `soft cap`, `MoE 8x2`.
    pub fn features(&self) -> Vec<String> {
        let mut f = Vec::new();
        if self.qkv_bias {
            f.push("q/k/v bias".to_string());
        }
        if self.qk_norm {
            f.push("q/k norm".to_string());
        }
        if let Some(w) = self.sliding_window {
            f.push(match self.sliding_layers {
                SlidingLayers::All => format!("sliding window {w}"),
                SlidingLayers::Even => format!("sliding window {w} (even layers)"),
            });
        }
        if let Some(c) = self.attn_logit_softcap {
            f.push(format!("attention soft cap {c}"));
        }
        if let Some(c) = self.final_logit_softcap {
            f.push(format!("final logit soft cap {c}"));
        }
        if let Some(m) = self.moe {
            f.push(format!("MoE {} experts, top {}", m.num_experts, m.top_k));
        }
        f
    }
}
