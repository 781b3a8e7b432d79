//! The error type of the core crate.

use thiserror::Error;

/// Errors raised by core types: invalid sampling parameters, malformed batch
/// descriptors and attention backends refusing or failing a call.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CoreError {
    #[error("invalid sampling parameter `{param}`: {message}")]
    InvalidSamplingParam {
        param: &'static str,
        message: String,
    },
    #[error("invalid batch descriptor: {message}")]
    InvalidBatch { message: String },
    #[error("attention backend `{backend}` cannot serve this configuration: {}", join_reasons(.reasons))]
    BackendInvalid {
        backend: String,
        reasons: Vec<super::InvalidReason>,
    },
    #[error("attention backend `{backend}` failed: {message}")]
    BackendFailed { backend: String, message: String },
    #[error("batch laid out for block size {batch}, the backend is configured for {config}")]
    BlockSizeMismatch { batch: usize, config: usize },
    #[error("block id {block} is out of range for a pool of {num_blocks} blocks")]
    BlockOutOfRange { block: u32, num_blocks: usize },
    #[error("attention backend `{backend}`: run called before a successful plan")]
    NotPlanned { backend: String },
    #[error(
        "two attention backends are registered as `{name}`: one in `{first}`, one in `{second}`"
    )]
    DuplicateBackend {
        name: &'static str,
        first: &'static str,
        second: &'static str,
    },
    #[error("buffer `{name}` has {actual} elements, expected {expected}")]
    ShapeMismatch {
        name: &'static str,
        expected: usize,
        actual: usize,
    },
}

fn join_reasons(reasons: &[super::InvalidReason]) -> String {
    reasons
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}
