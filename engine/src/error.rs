//! The error type of the engine crate.

use thiserror::Error;

/// Errors from the engine. `InvalidRequest` and `QueueFull` are the caller's
/// problem (HTTP 400 / 503); the rest are engine faults.
#[derive(Debug, Error, Clone)]
pub enum EngineError {
    #[error("{message}")]
    InvalidRequest {
        param: Option<String>,
        message: String,
    },
    /// A structured-output constraint (JSON schema, regex, choice, grammar) that
    /// llguidance cannot compile; the message is llguidance's.
    #[error("{message}")]
    InvalidGrammar { param: String, message: String },
    #[error("request id `{request_id}` is already in use")]
    DuplicateRequest { request_id: String },
    #[error("the waiting queue is full ({max_waiting} requests); retry later")]
    QueueFull { max_waiting: usize },
    #[error("model: {message}")]
    Model { message: String },
    #[error("device {device}: {message}")]
    Device {
        device: pagoda_core::Device,
        message: String,
    },
    #[error("attention backend selection: {message}")]
    Selector { message: String },
    #[error("engine fault: {message}")]
    Fault { message: String },
    /// One request failed on its own (e.g. its logits could not be sampled); the
    /// engine and every other request go on.
    #[error("request `{request_id}` failed: {message}")]
    RequestFailed { request_id: String, message: String },
    #[error("the engine has shut down")]
    Shutdown,
    /// Sleep mode (`POST /sleep`): nothing runs until `POST /wake_up`.
    #[error("the engine is sleeping (level {level}): POST /wake_up first")]
    Sleeping { level: u8 },
    /// A sleep or wake-up that cannot be done in the engine's present state.
    #[error("{message}")]
    SleepState { message: String },
}

impl EngineError {
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        EngineError::InvalidRequest {
            param: Some(param.into()),
            message: message.into(),
        }
    }
    /// Whether the caller, not the engine, is at fault.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            EngineError::InvalidRequest { .. }
                | EngineError::InvalidGrammar { .. }
                | EngineError::DuplicateRequest { .. }
                | EngineError::QueueFull { .. }
        )
    }
}

impl From<pagoda_core::CoreError> for EngineError {
    fn from(e: pagoda_core::CoreError) -> Self {
        match e {
            pagoda_core::CoreError::InvalidSamplingParam { param, message } => {
                EngineError::InvalidRequest {
                    param: Some(param.to_string()),
                    message: format!("{param}: {message}"),
                }
            }
            other => EngineError::Fault {
                message: other.to_string(),
            },
        }
    }
}

impl From<pagoda_models::ModelError> for EngineError {
    fn from(e: pagoda_models::ModelError) -> Self {
        match e {
            // A text prompt to a model without a tokenizer: the caller's to fix.
            e @ pagoda_models::ModelError::NoTokenizer { .. } => {
                EngineError::invalid("prompt", e.to_string())
            }
            e => EngineError::Model {
                message: e.to_string(),
            },
        }
    }
}
