//! Models: loading weights and tokenizers from GGUF files or HF directories, chat
//! templates, and the one decoder forward pass (`decoder`) that runs every supported
//! family (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Mixtral; see [`arch`]) on every
//! device: with the host's ops ([`Llama`], `cpu`) or a device's ([`device`]: weights
//! on a device, every op through core's `ModelOps`).
//!
//! Architecture invariant: models knows the attention protocol of `pagoda-core`
//! but no concrete backend, nothing of scheduling, and nothing of HTTP.

pub mod arch;
pub mod chat;
pub mod config;
mod cpu;
mod decoder;
pub mod dequant;
pub mod device;
pub mod dummy;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod hf_arch;
pub mod linear;
pub mod llama;
pub mod loaded;
pub mod loader;
mod moe;
pub mod spm;
pub mod tokenizer;
pub mod weights;

pub use arch::{ArchConfig, Architecture, AttnKind};
pub use chat::{ChatMessage, ChatTemplate};
pub use config::{merge_attention_configs, LlamaConfig, RopeScaling};
pub use device::{
    capture_sizes, device_unsupported, DecodeGraphs, DeviceLlama, DeviceOutput, DeviceRun,
    DeviceScratch,
};
pub use dummy::{dummy_layer, dummy_weights, load_dummy, LoadFormat};
pub use error::ModelError;
pub use linear::{Linear, WeightDtype};
pub use llama::{ForwardScratch, Llama};
pub use loaded::LoadedModel;
pub use loader::{inspect_model, load_model};
pub use tokenizer::Tokenizer;
pub use weights::{
    ExpertWeights, LayerExtras, LayerWeights, LlamaWeights, Mat, MoeWeights, QuantBlocks,
};
