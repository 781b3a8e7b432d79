//! Models: loading weights and tokenizers from GGUF files or HF directories, chat
//! templates, and the Llama-family forward pass on CPU.
//!
//! Architecture invariant: models knows the attention protocol of `pagoda-core`
//! but no concrete backend, nothing of scheduling, and nothing of HTTP.

pub mod config;
pub mod error;
pub mod weights;

pub use config::{LlamaConfig, RopeScaling};
pub use error::ModelError;
pub use weights::{LayerWeights, LlamaWeights, Mat};
