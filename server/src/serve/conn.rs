//! The connection layer: our own accept loop over hyper, so that every socket is
//! bounded in time and in number.
//!
//! * **Idle keep-alive** (`--timeout-keep-alive`, uvicorn's 5 s): a connection with
//!   no request in flight that sends nothing is closed. This also ends silent
//!   sockets that never send a byte.
//! * **Header read** (`--header-read-timeout`): once a client starts a request it
//!   must finish the head in time (slowloris).
//! * **Body read** (`--body-read-timeout`): the whole body must arrive in time; see
//!   [`read_body_with_timeout`], a middleware, since the body is read by handlers.
//! * **Connection cap** (`--max-connections`, by default what the open-file limit
//!   allows): at the cap the longest-idle connection is closed to make room, so a
//!   flood of silent sockets cannot lock out a health probe; when every connection
//!   has a request in flight, a few more are accepted only to answer `/health` and
//!   `/metrics`, and 503 otherwise.
//!
//! Each connection runs one watchdog beside hyper's connection future; state
//! changes are a few atomics, the registry lock is taken at accept and close only.

use super::error::ApiError;
use super::state::{AppState, TRIM_AFTER_BODY_BYTES};
use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

/// Time and number limits on connections (see the module doc).
#[derive(Debug, Clone)]
pub struct ConnLimits {
    pub keep_alive: Duration,
    pub header_read: Duration,
    pub body_read: Duration,
    pub max_connections: usize,
    /// Connections accepted beyond the cap (while none is idle) to answer probes.
    pub probe_headroom: usize,
}

/// File descriptors kept free for everything but client sockets (model file,
/// logs, the engine's threads, a probe's socket while the cap is enforced).
pub const FD_RESERVE: usize = 64;

/// Raises the soft open-file limit to the hard one (as nginx and many servers
/// do) and returns the soft limit now in force.
pub fn raise_open_file_limit() -> Option<usize> {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return None;
            }
            if lim.rlim_cur < lim.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: lim.rlim_max,
                    rlim_max: lim.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    lim = raised;
                }
            }
        }
        Some(usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX))
    }
    #[cfg(not(unix))]
    None
}

/// Paths still answered on a connection accepted over the cap.
fn is_probe(path: &str) -> bool {
    matches!(path, "/health" | "/metrics" | "/version")
}

/// One connection's state, shared by its watchdog, its service and the registry.
struct ConnState {
    /// Requests whose response body has not yet been dropped.
    in_flight: AtomicUsize,
    /// Milliseconds since `epoch` at which the connection last became idle.
    idle_since_ms: AtomicU64,
    /// Bytes arrived since it became idle (a request head is being sent).
    read_since_idle: AtomicBool,
    close: Notify,
    overload: bool,
}

struct Registry {
    epoch: Instant,
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
    num_overload: AtomicUsize,
    next_id: AtomicU64,
}

impl Registry {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Closes the connection idle for longest; false when none is idle.
    fn evict_oldest_idle(&self) -> bool {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let victim = conns
            .values()
            .filter(|c| !c.overload && c.in_flight.load(Ordering::Acquire) == 0)
            .min_by_key(|c| c.idle_since_ms.load(Ordering::Acquire));
        match victim {
            Some(c) => {
                c.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Counts a request in flight on its connection until its response body is
/// dropped (sent or abandoned), then marks the connection idle again.
struct InFlight {
    conn: Arc<ConnState>,
    registry: Arc<Registry>,
}

impl InFlight {
    fn enter(conn: &Arc<ConnState>, registry: &Arc<Registry>) -> Self {
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight {
            conn: conn.clone(),
            registry: registry.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn
            .idle_since_ms
            .store(self.registry.now_ms(), Ordering::Release);
        self.conn.read_since_idle.store(false, Ordering::Release);
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The socket, noting when bytes arrive while the connection is idle.
struct Tracked {
    inner: TcpStream,
    conn: Arc<ConnState>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before && self.conn.in_flight.load(Ordering::Acquire) == 0 {
            self.conn.read_since_idle.store(true, Ordering::Release);
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Why the watchdog ends a connection, or None while it may live.
fn expired(conn: &ConnState, limits: &ConnLimits, now_ms: u64) -> Option<&'static str> {
    if conn.in_flight.load(Ordering::Acquire) > 0 {
        return None;
    }
    let idle =
        Duration::from_millis(now_ms.saturating_sub(conn.idle_since_ms.load(Ordering::Acquire)));
    if conn.read_since_idle.load(Ordering::Acquire) {
        (idle >= limits.header_read).then_some("request head not received in time")
    } else {
        (idle >= limits.keep_alive).then_some("idle")
    }
}

/// Serves `app` on `listener` until `shutdown` turns true, then lets connections
/// finish their requests (the caller bounds how long) and returns once all closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    mut shutdown: watch::Receiver<u8>,
) {
    let registry = Arc::new(Registry {
        epoch: Instant::now(),
        conns: Mutex::new(HashMap::new()),
        num_overload: AtomicUsize::new(0),
        next_id: AtomicU64::new(0),
    });
    let mut tasks = tokio::task::JoinSet::new();
    let mut last_accept_error = None::<Instant>;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait_for(|&s| s > 0) => break,
            // Reap finished connection tasks so the set stays small.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors (or a transient error): make room, back off.
                if last_accept_error.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) {
                    tracing::warn!("accept failed: {e}; closing the longest-idle connection");
                    last_accept_error = Some(Instant::now());
                }
                registry.evict_oldest_idle();
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let num_open = registry.conns.lock().map(|c| c.len()).unwrap_or(0);
        let overload = if num_open >= limits.max_connections && !registry.evict_oldest_idle() {
            if registry.num_overload.load(Ordering::Acquire) >= limits.probe_headroom {
                drop(stream); // over the cap and the headroom: close at once
                continue;
            }
            true
        } else {
            false
        };
        let conn = Arc::new(ConnState {
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(registry.now_ms()),
            read_since_idle: AtomicBool::new(false),
            close: Notify::new(),
            overload,
        });
        let id = registry.next_id.fetch_add(1, Ordering::Relaxed);
        if overload {
            registry.num_overload.fetch_add(1, Ordering::AcqRel);
        } else if let Ok(mut c) = registry.conns.lock() {
            c.insert(id, conn.clone());
        }
        tasks.spawn(run_connection(
            stream,
            conn,
            id,
            registry.clone(),
            app.clone(),
            limits.clone(),
            shutdown.clone(),
        ));
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

async fn run_connection(
    stream: TcpStream,
    conn: Arc<ConnState>,
    id: u64,
    registry: Arc<Registry>,
    app: Router,
    limits: ConnLimits,
    mut shutdown: watch::Receiver<u8>,
) {
    let io = TokioIo::new(Tracked {
        inner: stream,
        conn: conn.clone(),
    });
    let svc_conn = conn.clone();
    let svc_registry = registry.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let guard = InFlight::enter(&svc_conn, &svc_registry);
        let overload = svc_conn.overload;
        let app = app.clone();
        async move {
            let req = req.map(Body::new);
            let resp = if overload && !is_probe(req.uri().path()) {
                let mut r = ApiError::Unavailable {
                    message: "the server is at its connection limit; retry later".into(),
                }
                .into_response();
                r.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
                r
            } else {
                call(app, req).await
            };
            // The guard lives as long as the response body: streams count as in flight.
            Ok::<_, std::convert::Infallible>(resp.map(move |b| {
                Body::new(b.map_frame(move |f| {
                    let _ = &guard;
                    f
                }))
            }))
        }
    });
    let backstop = limits.header_read.max(limits.keep_alive) + Duration::from_secs(1);
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(backstop)
        .keep_alive(!conn.overload)
        .serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut draining = false;
    loop {
        tokio::select! {
            _ = connection.as_mut() => break,
            _ = conn.close.notified() => break,
            _ = tick.tick() => {
                if let Some(why) = expired(&conn, &limits, registry.now_ms()) {
                    tracing::debug!("closing connection {id}: {why}");
                    break;
                }
            }
            _ = shutdown.wait_for(|&s| s > 0), if !draining => {
                draining = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
    if conn.overload {
        registry.num_overload.fetch_sub(1, Ordering::AcqRel);
    } else if let Ok(mut c) = registry.conns.lock() {
        c.remove(&id);
    }
}

async fn call(app: Router, req: Request) -> Response {
    use tower_service::Service;
    let mut app = app;
    match app.call(req).await {
        Ok(r) => r,
        Err(e) => match e {},
    }
}

/// Middleware: reads the whole body within `--body-read-timeout` (408 after it),
/// so a client trickling a body cannot hold a handler forever.
pub async fn read_body_with_timeout(
    axum::extract::State(st): axum::extract::State<Arc<AppState>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let timeout = st.body_read_timeout;
    let limit = st.max_body_bytes;
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => {
            if bytes.len() >= TRIM_AFTER_BODY_BYTES {
                st.needs_trim.store(true, Ordering::Release);
            }
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit");
            if over {
                ApiError::PayloadTooLarge { limit }.into_response()
            } else {
                ApiError::BadRequest {
                    message: format!("cannot read the request body: {e}"),
                    param: None,
                }
                .into_response()
            }
        }
        Err(_) => ApiError::Timeout {
            message: format!(
                "the request body was not received within {} s",
                timeout.as_secs_f64()
            ),
        }
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(in_flight: usize, idle_since_ms: u64, read: bool) -> ConnState {
        ConnState {
            in_flight: AtomicUsize::new(in_flight),
            idle_since_ms: AtomicU64::new(idle_since_ms),
            read_since_idle: AtomicBool::new(read),
            close: Notify::new(),
            overload: false,
        }
    }

    fn limits() -> ConnLimits {
        ConnLimits {
            keep_alive: Duration::from_secs(5),
            header_read: Duration::from_secs(10),
            body_read: Duration::from_secs(30),
            max_connections: 10,
            probe_headroom: 2,
        }
    }

    #[test]
    fn watchdog_rules() {
        let l = limits();
        // Busy connections never expire, however long.
        assert_eq!(expired(&state(1, 0, false), &l, 1_000_000), None);
        // Silent/idle: keep-alive.
        assert_eq!(expired(&state(0, 0, false), &l, 4_999), None);
        assert_eq!(expired(&state(0, 0, false), &l, 5_000), Some("idle"));
        // A head in progress gets the header timeout instead.
        assert_eq!(expired(&state(0, 0, true), &l, 9_999), None);
        assert!(expired(&state(0, 0, true), &l, 10_000).is_some());
    }
}
