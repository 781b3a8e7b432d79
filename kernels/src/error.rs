//! The error type of the kernels crate.

use thiserror::Error;

/// Bad arguments to a kernel. Kernels check shapes up front and never panic on them.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum KernelError {
    #[error("buffer `{name}` has {actual} elements, expected {expected}")]
    ShapeMismatch {
        name: &'static str,
        expected: usize,
        actual: usize,
    },
    #[error("position {position} is beyond the RoPE cache of {max_position} positions")]
    PositionOutOfRange {
        position: usize,
        max_position: usize,
    },
    #[error("invalid argument `{name}`: {message}")]
    InvalidArgument { name: &'static str, message: String },
}

/// Checks that a buffer has exactly `expected` elements.
pub(crate) fn check_len(
    name: &'static str,
    actual: usize,
    expected: usize,
) -> Result<(), KernelError> {
    if actual != expected {
        return Err(KernelError::ShapeMismatch {
            name,
            expected,
            actual,
        });
    }
    Ok(())
}
