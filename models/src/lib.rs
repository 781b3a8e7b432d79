//! Models: loading weights and tokenizers from GGUF files or HF directories, chat
//! templates, and the Llama-family forward pass on CPU.
//!
//! Architecture invariant: models knows the attention protocol of `pagoda-core`
//! but no concrete backend, nothing of scheduling, and nothing of HTTP.

pub mod chat;
pub mod config;
pub mod dequant;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod linear;
pub mod llama;
pub mod loaded;
pub mod loader;
pub mod tokenizer;
pub mod weights;

pub use chat::{ChatMessage, ChatTemplate};
pub use config::{LlamaConfig, RopeScaling};
pub use error::ModelError;
pub use linear::{Linear, WeightDtype};
pub use llama::{ForwardScratch, Llama};
pub use loaded::LoadedModel;
pub use loader::{inspect_model, load_model};
pub use tokenizer::Tokenizer;
pub use weights::{LayerWeights, LlamaWeights, Mat, QuantBlocks};
