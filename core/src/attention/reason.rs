//! Why a backend cannot serve a configuration ([`InvalidReason`]) and the kinds of
//! rows it is asked to serve ([`Role`]).
//!
//! A leaf of the attention protocol: it names only the plain device and dtype
//! values, so that [`CoreError`](crate::CoreError), which carries a backend's reasons,
//! can name them without a cycle (error -> here, never back). What a backend
//! serves and the checks that produce these reasons are in `config`.

use crate::tensor::{DType, Device};
use std::fmt;

/// Which rows of a batch a backend is asked to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Rows with query length 1.
    Decode,
    /// Rows with query length > 1 (prompt chunks).
    Prefill,
    /// Both kinds of rows.
    Both,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Decode => "decode",
            Role::Prefill => "prefill",
            Role::Both => "decode+prefill",
        })
    }
}

/// Why a backend cannot serve a configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum InvalidReason {
    DeviceUnsupported {
        device: Device,
    },
    QDTypeUnsupported {
        dtype: DType,
        supported: Vec<DType>,
    },
    KvDTypeUnsupported {
        dtype: DType,
        supported: Vec<DType>,
    },
    HeadDimUnsupported {
        head_dim: usize,
        supported: Vec<usize>,
    },
    BlockSizeUnsupported {
        block_size: usize,
        supported: Vec<usize>,
    },
    GqaRatioUnsupported {
        ratio: usize,
        max: usize,
    },
    HeadsNotDivisible {
        num_heads: usize,
        num_kv_heads: usize,
    },
    SlidingWindowUnsupported,
    SoftCapUnsupported,
    RoleUnsupported {
        role: Role,
    },
    /// The backend is registered but its code is behind a cargo feature that is off.
    NotCompiled {
        feature: &'static str,
    },
    Other {
        message: String,
    },
}

impl fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidReason::DeviceUnsupported { device } => {
                write!(f, "device {device} is not supported")
            }
            InvalidReason::QDTypeUnsupported { dtype, supported } => {
                write!(
                    f,
                    "query dtype {dtype} is not supported (supported: {})",
                    list(supported)
                )
            }
            InvalidReason::KvDTypeUnsupported { dtype, supported } => {
                write!(
                    f,
                    "KV cache dtype {dtype} is not supported (supported: {})",
                    list(supported)
                )
            }
            InvalidReason::HeadDimUnsupported {
                head_dim,
                supported,
            } => {
                write!(
                    f,
                    "head dim {head_dim} is not supported (supported: {})",
                    list(supported)
                )
            }
            InvalidReason::BlockSizeUnsupported {
                block_size,
                supported,
            } => {
                write!(
                    f,
                    "block size {block_size} is not supported (supported: {})",
                    list(supported)
                )
            }
            InvalidReason::GqaRatioUnsupported { ratio, max } => {
                write!(f, "GQA ratio {ratio} exceeds the supported maximum {max}")
            }
            InvalidReason::HeadsNotDivisible {
                num_heads,
                num_kv_heads,
            } => {
                write!(
                    f,
                    "{num_heads} query heads are not a multiple of {num_kv_heads} KV heads"
                )
            }
            InvalidReason::SlidingWindowUnsupported => {
                write!(f, "sliding-window attention is not supported")
            }
            InvalidReason::SoftCapUnsupported => write!(f, "logits soft-capping is not supported"),
            InvalidReason::RoleUnsupported { role } => match role {
                Role::Prefill => write!(f, "does not handle prefill rows (query length > 1)"),
                Role::Decode => write!(f, "does not handle decode rows (query length 1)"),
                Role::Both => write!(f, "does not handle both decode and prefill rows"),
            },
            InvalidReason::NotCompiled { feature } => {
                write!(
                    f,
                    "not compiled with {} (this build lacks the backend crate's `{feature}` cargo feature)",
                    feature.to_uppercase()
                )
            }
            InvalidReason::Other { message } => f.write_str(message),
        }
    }
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
