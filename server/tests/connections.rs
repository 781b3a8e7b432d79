//! Connection-level limits (issue 9, reproduction 3): silent sockets, idle
//! keep-alive, slowloris headers and half-sent bodies are closed in time, and the
//! server stays reachable with 2,000 silent sockets open under a 1,024 file limit.

mod common;

use common::{assert_error, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn connect(s: &Server) -> TcpStream {
    let addr = s.base.trim_start_matches("http://");
    let c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c
}

/// Reads until the server closes; returns what it sent and how long it took.
fn read_until_closed(c: &mut TcpStream) -> (String, Duration) {
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("read: {e} after {:?}", t0.elapsed()),
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), t0.elapsed())
}

const TIMEOUTS: &[&str] = &[
    "--kv-cache-memory-mib",
    "64",
    "--timeout-keep-alive",
    "1",
    "--header-read-timeout",
    "2",
    "--body-read-timeout",
    "2",
];

#[test]
fn silent_idle_slow_and_half_sent_connections_are_closed() {
    let s = Server::start(TIMEOUTS);
    // A socket that never sends a byte: closed after the keep-alive timeout.
    let mut silent = connect(&s);
    let (_, took) = read_until_closed(&mut silent);
    assert!(
        took < Duration::from_secs(10),
        "silent socket held {took:?}"
    );

    // Idle keep-alive after one request: the answer, then a close.
    let mut idle = connect(&s);
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (text, took) = read_until_closed(&mut idle);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        took < Duration::from_secs(10),
        "idle keep-alive held {took:?}"
    );

    // Slowloris: a header byte every 300 ms never completes the head.
    let mut slow = connect(&s);
    let t0 = Instant::now();
    let head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut closed = false;
    for b in head.iter().cycle().take(200) {
        if slow.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
        if t0.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    if !closed {
        slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        closed = matches!(slow.read(&mut buf), Ok(0) | Err(_));
    }
    assert!(closed, "a slowloris head was held for {:?}", t0.elapsed());

    // A body that stops half-way: 408 with an error object.
    let mut half = connect(&s);
    half.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":",
    )
    .unwrap();
    let (text, took) = read_until_closed(&mut half);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    assert_error(408, body.trim(), 408, "half-sent body");
    assert!(
        took < Duration::from_secs(15),
        "half-sent body held {took:?}"
    );
    assert_eq!(s.get("/health").0, 200);
}

/// Raises this process's soft open-file limit to its hard limit.
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write only the struct passed.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur
}

/// 2,000 silent sockets against a server limited to 1,024 open files, with a
/// keep-alive timeout long enough that only the connection cap can save it:
/// `/health` and a completion still answer while they are all open.
#[test]
fn reachable_with_2000_silent_sockets_under_1024_files() {
    let have = raise_nofile();
    if have < 2200 {
        eprintln!("skipped: this process may open only {have} files");
        return;
    }
    let s = Server::start_with_nofile(
        &["--kv-cache-memory-mib", "64", "--timeout-keep-alive", "120"],
        1024,
    );
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut silent = Vec::with_capacity(2000);
    for _ in 0..2000 {
        match TcpStream::connect(&addr) {
            Ok(c) => silent.push(c),
            Err(e) => panic!("connect #{}: {e}", silent.len()),
        }
    }
    let (st, _) = s.get("/health");
    assert_eq!(st, 200, "log:\n{}", s.log_text());
    let v = s.post_ok(
        "/v1/completions",
        &serde_json::json!({"prompt": "Hi", "max_tokens": 2}),
    );
    assert!(v["choices"][0]["text"].is_string());
    // Even while they are kept open, more probes get through.
    for _ in 0..20 {
        assert_eq!(s.get("/health").0, 200);
    }
    drop(silent);
    assert!(
        !s.log_text().contains("Too many open files") || s.get("/health").0 == 200,
        "{}",
        s.log_text()
    );
}
