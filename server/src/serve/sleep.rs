//! vLLM's sleep-mode endpoints, served under `VLLM_SERVER_DEV_MODE=1` as vLLM
//! serves them and acting only with `--enable-sleep-mode`: `POST /sleep?level=1|2`,
//! `POST /wake_up[?tags=weights&tags=kv_cache]`, `GET /is_sleeping`. What each
//! level releases on the CPU is `pagoda_engine::sleep`'s. While asleep,
//! generation requests get a 503 naming the state; `/tokenize`, `/v1/models`,
//! `/metrics` and `/health` keep answering, as in vLLM.

use super::error::ApiError;
use super::state::AppState;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// `POST /sleep?level=N` (default 1).
pub async fn sleep(State(st): State<Arc<AppState>>, RawQuery(q): RawQuery) -> Response {
    let level = match parse_level(q.as_deref()) {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    run(&st, move |engine| engine.sleep(level)).await
}

/// `POST /wake_up[?tags=weights&tags=kv_cache]` (no tags: everything).
pub async fn wake_up(State(st): State<Arc<AppState>>, RawQuery(q): RawQuery) -> Response {
    let (weights, kv_cache) = match parse_tags(q.as_deref()) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    run(&st, move |engine| engine.wake_up(weights, kv_cache)).await
}

/// `GET /is_sleeping`: `{"is_sleeping": bool}`.
pub async fn is_sleeping(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(serde_json::json!({ "is_sleeping": st.engine.sleep_level() > 0 })).into_response()
}

/// Runs a sleep or wake-up on the blocking pool (a level-2 wake-up loads the
/// model) and maps its outcome: 200 with an empty body, as vLLM answers.
async fn run(
    st: &Arc<AppState>,
    f: impl FnOnce(&pagoda_engine::EngineHandle) -> Result<(), pagoda_engine::EngineError>
        + Send
        + 'static,
) -> Response {
    if !st.sleep_mode {
        return ApiError::BadRequest {
            message: "sleep mode is not enabled: start the server with --enable-sleep-mode".into(),
            param: None,
        }
        .into_response();
    }
    let engine = st.engine.clone();
    match tokio::task::spawn_blocking(move || f(&engine)).await {
        Ok(Ok(())) => StatusCode::OK.into_response(),
        Ok(Err(pagoda_engine::EngineError::SleepState { message })) => {
            ApiError::Conflict { message }.into_response()
        }
        Ok(Err(e)) => ApiError::from(e).into_response(),
        Err(e) => ApiError::Internal {
            message: e.to_string(),
        }
        .into_response(),
    }
}

/// The query's key/value pairs (no percent-decoding needed: the values are
/// plain words and digits, and anything else is refused).
fn pairs(q: Option<&str>) -> impl Iterator<Item = (&str, &str)> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
}

fn parse_level(q: Option<&str>) -> Result<u8, ApiError> {
    let mut level = 1;
    for (k, v) in pairs(q) {
        match k {
            "level" => {
                level = v
                    .parse::<u8>()
                    .ok()
                    .filter(|l| (1..=2).contains(l))
                    .ok_or_else(|| {
                        ApiError::bad("level", format!("level must be 1 or 2, got {v:?}"))
                    })?
            }
            // vLLM's later `mode` (what to do with running requests): Pagoda sleeps
            // only when idle, which is its `wait` once the requests are done.
            other => {
                return Err(ApiError::bad(
                    other,
                    format!("unknown query parameter {other:?} (expected level)"),
                ))
            }
        }
    }
    Ok(level)
}

fn parse_tags(q: Option<&str>) -> Result<(bool, bool), ApiError> {
    let (mut weights, mut kv_cache, mut any) = (false, false, false);
    for (k, v) in pairs(q) {
        if k != "tags" {
            return Err(ApiError::bad(
                k,
                format!("unknown query parameter {k:?} (expected tags)"),
            ));
        }
        any = true;
        for tag in v.split(',') {
            match tag {
                "weights" => weights = true,
                "kv_cache" => kv_cache = true,
                other => {
                    return Err(ApiError::bad(
                        "tags",
                        format!("unknown tag {other:?}: expected weights or kv_cache"),
                    ))
                }
            }
        }
    }
    Ok(if any {
        (weights, kv_cache)
    } else {
        (true, true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_tags() {
        assert_eq!(parse_level(None).unwrap(), 1);
        assert_eq!(parse_level(Some("level=2")).unwrap(), 2);
        assert!(parse_level(Some("level=3")).is_err());
        assert!(parse_level(Some("level=x")).is_err());
        assert!(parse_level(Some("depth=1")).is_err());
        assert_eq!(parse_tags(None).unwrap(), (true, true));
        assert_eq!(parse_tags(Some("tags=weights")).unwrap(), (true, false));
        assert_eq!(
            parse_tags(Some("tags=weights&tags=kv_cache")).unwrap(),
            (true, true)
        );
        assert_eq!(parse_tags(Some("tags=kv_cache")).unwrap(), (false, true));
        assert!(parse_tags(Some("tags=gpu")).is_err());
        assert!(parse_tags(Some("level=1")).is_err());
    }
}
