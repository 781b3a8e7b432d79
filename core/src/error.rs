//! The error type of the core crate.
//!
//! Nearly every module returns a [`CoreError`], so this module names only leaves:
//! the plain values its variants carry (devices and dtypes, a backend's
//! [`InvalidReason`]s, the valid `--kv-cache-dtype` values), each defined in a module
//! that does not use this one back.

use crate::attention::reason::InvalidReason;
use crate::kv::KvCacheDtype;
use crate::tensor::{DType, Device};
use thiserror::Error;

/// Errors raised by core types: invalid sampling parameters, malformed batch
/// descriptors, buffers of the wrong device, dtype or shape, devices that are not
/// available, and attention backends refusing or failing a call.
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
        reasons: Vec<InvalidReason>,
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
    #[error(
        "--kv-cache-dtype `{spec}`: {reason}; valid values: {}",
        KvCacheDtype::VALID
    )]
    InvalidKvCacheDtype { spec: String, reason: String },
    #[error("{what} cannot handle {dtype} data: {reason}")]
    UnsupportedDType {
        what: &'static str,
        dtype: DType,
        reason: &'static str,
    },
    #[error("`{spec}` is not a device (expected one of: cpu, cuda, cuda:N, emu)")]
    InvalidDevice { spec: String },
    #[error("device {device} is not available: {message}")]
    DeviceUnavailable { device: Device, message: String },
    #[error("device {device} failed: {message}")]
    DeviceFailed { device: Device, message: String },
    #[error("{what} cannot be captured in a CUDA graph (use --enforce-eager)")]
    GraphUnsupported { what: String },
    #[error("CUDA graph: {message}")]
    Graph { message: String },
    #[error("invalid shape: {message}")]
    InvalidShape { message: String },
    #[error("buffer `{name}` holds {actual}, expected {expected}")]
    DTypeMismatch {
        name: &'static str,
        expected: DType,
        actual: DType,
    },
    #[error("buffer `{name}` is on device {actual}, expected {expected}")]
    DeviceMismatch {
        name: &'static str,
        expected: Device,
        actual: Device,
    },
    #[error("buffer `{name}` is in {device} memory; this code reads host memory only")]
    NotOnHost { name: &'static str, device: Device },
    #[error("buffer `{name}` has {actual} elements, expected {expected}")]
    ShapeMismatch {
        name: &'static str,
        expected: usize,
        actual: usize,
    },
}

fn join_reasons(reasons: &[InvalidReason]) -> String {
    reasons
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}
