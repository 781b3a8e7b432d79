//! The error of one benchmark request, [`BenchError`].
//!
//! Its own leaf module, below the client that returns it, so that the client does
//! not reach up into the crate root (which dispatches to `serve`, which uses the
//! client): the crate's modules then depend on each other in one direction only.

/// Why one benchmark request failed (kept per request in the results).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("bad base URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("transport error: {0}")]
    Transport(String),
    #[error("server sent an error event: {0}")]
    ServerEvent(String),
    #[error("malformed stream event: {detail}")]
    BadEvent { detail: String },
    #[error("request timed out after {secs:.0} s")]
    Timeout { secs: f64 },
    #[error("stream ended without any generated token")]
    NoTokens,
}
