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
