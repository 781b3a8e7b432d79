//! The error type of the models crate.

use std::path::PathBuf;
use thiserror::Error;

/// Everything that can go wrong loading or running a model.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("model file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("model path {path} does not exist")]
    NotFound { path: PathBuf },
    #[error("{path} is not a GGUF file or HF model directory ({reason})")]
    UnknownFormat { path: PathBuf, reason: String },
    #[error("corrupt GGUF file {path}: {reason}")]
    CorruptGguf { path: PathBuf, reason: String },
    #[error("unsupported tensor type {ggml_type} for tensor `{tensor}`")]
    UnsupportedTensorType { tensor: String, ggml_type: String },
    #[error("missing tensor `{name}`")]
    MissingTensor { name: String },
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("missing or invalid metadata `{key}`: {reason}")]
    Metadata { key: String, reason: String },
    #[error(
        "unsupported architecture `{arch}` (supported: {})",
        crate::arch::Architecture::supported_hf()
    )]
    UnsupportedArchitecture { arch: String },
    /// A config field whose value changes the math in a way the decoder does not
    /// implement (rather than ignore it and compute something else).
    #[error("unsupported config field `{field}` = {value} for {arch}: {reason}")]
    UnsupportedConfig {
        arch: String,
        field: String,
        value: String,
        reason: String,
    },
    #[error("unsupported tokenizer: {reason}")]
    UnsupportedTokenizer { reason: String },
    /// A text prompt for a model loaded without a tokenizer (`--load-format dummy`
    /// and no `tokenizer.json` beside its config).
    #[error(
        "this model has no tokenizer (--load-format dummy with no tokenizer.json beside \
         its config.json): send the prompt as token ids, not text ({chars} characters)"
    )]
    NoTokenizer { chars: usize },
    #[error("tokenizer error: {message}")]
    Tokenizer { message: String },
    #[error("chat template error: {message}")]
    ChatTemplate { message: String },
    #[error("safetensors error in {path}: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("invalid config.json: {message}")]
    Config { message: String },
    #[error("packing weight `{name}` for the kernels: {source}")]
    Pack {
        name: String,
        #[source]
        source: pagoda_kernels::KernelError,
    },
    #[error("forward pass: {message}")]
    Forward { message: String },
    #[error(transparent)]
    Core(#[from] pagoda_core::CoreError),
}

/// A kernel's error inside a forward pass: the forward fails with its message.
pub(crate) fn kernel(e: pagoda_kernels::KernelError) -> ModelError {
    ModelError::Forward {
        message: e.to_string(),
    }
}
