//! API errors: one enum, each variant with its HTTP status, rendered as OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` object.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use pagoda_engine::EngineError;
use serde_json::json;

/// Everything a request can fail with, as the client sees it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// 400: a value the client sent is invalid.
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<String>,
    },
    /// 401: the API key is missing or wrong.
    #[error("invalid or missing API key")]
    Unauthorized,
    /// 404: unknown model or route.
    #[error("{message}")]
    NotFound { message: String },
    /// 405: the route exists, the method does not.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// 413: the body is larger than `--max-body-bytes`.
    #[error("request body too large (limit {limit} bytes)")]
    PayloadTooLarge { limit: usize },
    /// 408: the request body did not arrive within `--body-read-timeout`.
    #[error("{message}")]
    Timeout { message: String },
    /// 415: the body is not JSON.
    #[error("{message}")]
    UnsupportedMediaType { message: String },
    /// 409: the request cannot be done in the server's present state.
    #[error("{message}")]
    Conflict { message: String },
    /// 503: the waiting queue is full or the engine is shutting down.
    #[error("{message}")]
    Unavailable { message: String },
    /// 500: a real engine fault.
    #[error("{message}")]
    Internal { message: String },
}

impl ApiError {
    pub fn bad(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            message: message.into(),
            param: Some(param.into()),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's error `type` strings.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. }
            | ApiError::PayloadTooLarge { .. }
            | ApiError::Timeout { .. }
            | ApiError::UnsupportedMediaType { .. }
            | ApiError::Conflict { .. }
            | ApiError::MethodNotAllowed => "invalid_request_error",
            ApiError::Unauthorized => "authentication_error",
            ApiError::NotFound { .. } => "not_found_error",
            ApiError::Unavailable { .. } => "service_unavailable_error",
            ApiError::Internal { .. } => "server_error",
        }
    }

    pub fn param(&self) -> Option<&str> {
        match self {
            ApiError::BadRequest { param, .. } => param.as_deref(),
            _ => None,
        }
    }

    /// The JSON error object (also sent as an SSE event when a stream fails midway).
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.to_string(),
                "type": self.kind(),
                "param": self.param(),
                "code": self.status().as_u16(),
            }
        })
    }

    /// Maps axum's body-reading failure: too large is 413, anything else 400.
    pub fn from_body_rejection(
        rejection: axum::extract::rejection::BytesRejection,
        limit: usize,
    ) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { limit }
        } else {
            ApiError::BadRequest {
                message: rejection.body_text(),
                param: None,
            }
        }
    }

    /// A JSON body that does not parse (or does not fit the schema) is a 400.
    pub fn from_json(e: serde_json::Error) -> Self {
        ApiError::BadRequest {
            message: format!("invalid JSON body: {e}"),
            param: None,
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidRequest { param, message } => {
                ApiError::BadRequest { message, param }
            }
            EngineError::InvalidGrammar { param, message } => ApiError::BadRequest {
                message,
                param: Some(param),
            },
            EngineError::DuplicateRequest { .. } => ApiError::BadRequest {
                message: e.to_string(),
                param: None,
            },
            EngineError::QueueFull { .. }
            | EngineError::Shutdown
            | EngineError::Sleeping { .. } => ApiError::Unavailable {
                message: e.to_string(),
            },
            EngineError::Model { .. }
            | EngineError::Selector { .. }
            | EngineError::Device { .. }
            | EngineError::Fault { .. }
            | EngineError::RequestFailed { .. } => ApiError::Internal {
                message: e.to_string(),
            },
            EngineError::SleepState { message } => ApiError::Conflict { message },
        }
    }
}

impl From<pagoda_core::CoreError> for ApiError {
    fn from(e: pagoda_core::CoreError) -> Self {
        match e {
            pagoda_core::CoreError::InvalidSamplingParam { param, message } => {
                ApiError::bad(param, format!("{param}: {message}"))
            }
            other => ApiError::Internal {
                message: other.to_string(),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(self.to_json())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_statuses() {
        let cases = [
            (EngineError::invalid("top_p", "bad"), 400),
            (EngineError::QueueFull { max_waiting: 3 }, 503),
            (EngineError::Shutdown, 503),
            (
                EngineError::Fault {
                    message: "boom".into(),
                },
                500,
            ),
            (
                EngineError::DuplicateRequest {
                    request_id: "x".into(),
                },
                400,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(ApiError::from(e).status().as_u16(), status);
        }
    }

    #[test]
    fn error_object_has_the_four_fields() {
        let v = ApiError::bad("temperature", "must be >= 0").to_json();
        let e = &v["error"];
        assert_eq!(e["message"], "must be >= 0");
        assert_eq!(e["type"], "invalid_request_error");
        assert_eq!(e["param"], "temperature");
        assert_eq!(e["code"], 400);
        let v = ApiError::Unauthorized.to_json();
        assert!(v["error"]["param"].is_null());
        assert_eq!(v["error"]["code"], 401);
    }
}
