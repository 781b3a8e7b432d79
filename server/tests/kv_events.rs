//! Issue 26: KV-cache events through `pagoda serve --kv-events-config`, read as a
//! router reads them: a ZMQ SUB on the PUB endpoint and a DEALER on the replay
//! ROUTER, the payloads decoded as generic MessagePack in vLLM's layout (a
//! positional batch of tagged-map events).
//!
//! A consumer that starts from a replay of sequence 0 and applies the live stream
//! after it must hold exactly the hashes the engine caches: every removed hash was
//! stored before, the stored tokens are the requests' tokens in blocks of 16, a
//! chain's runs name their parents, a reset is `AllBlocksCleared`; the replay's
//! batches are byte-identical to the live ones.

mod common;

use common::Server;
use rmpv::Value as Mp;
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[derive(Debug, Clone, PartialEq)]
enum Event {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: u64,
    },
    Removed(Vec<u64>),
    Cleared,
}

fn u64s(v: &Mp) -> Vec<u64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_u64().expect("a u64"))
        .collect()
}

/// Decodes `[ts, [events], dp_rank]`, checking every field's type and place.
fn decode(payload: &[u8]) -> (f64, Vec<Event>, u64) {
    let v = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack");
    let a = v.as_array().expect("batch is an array");
    assert_eq!(a.len(), 3, "[ts, events, dp_rank]: {v}");
    let ts = a[0].as_f64().expect("ts is a float");
    let events = a[1]
        .as_array()
        .expect("events array")
        .iter()
        .map(|e| {
            let m: BTreeMap<&str, &Mp> = e
                .as_map()
                .expect("an event is a tagged map")
                .iter()
                .map(|(k, v)| (k.as_str().expect("string keys"), v))
                .collect();
            let keys: Vec<&str> = m.keys().copied().collect();
            match m["type"].as_str().expect("the tag") {
                "BlockStored" => {
                    let want = [
                        "block_hashes",
                        "block_size",
                        "lora_id",
                        "lora_name",
                        "medium",
                        "parent_block_hash",
                        "token_ids",
                        "type",
                    ];
                    assert_eq!(keys, want, "{e}");
                    assert!(m["lora_id"].is_nil() && m["lora_name"].is_nil(), "{e}");
                    assert_eq!(m["medium"].as_str(), Some("GPU"), "medium: {e}");
                    let parent = m["parent_block_hash"];
                    Event::Stored {
                        hashes: u64s(m["block_hashes"]),
                        parent: (!parent.is_nil()).then(|| parent.as_u64().expect("parent")),
                        tokens: u64s(m["token_ids"]).into_iter().map(|t| t as u32).collect(),
                        block_size: m["block_size"].as_u64().expect("block_size"),
                    }
                }
                "BlockRemoved" => {
                    assert_eq!(keys, ["block_hashes", "medium", "type"], "{e}");
                    assert_eq!(m["medium"].as_str(), Some("GPU"), "medium: {e}");
                    Event::Removed(u64s(m["block_hashes"]))
                }
                "AllBlocksCleared" => {
                    assert_eq!(keys, ["type"], "{e}");
                    Event::Cleared
                }
                other => panic!("unknown tag {other}"),
            }
        })
        .collect();
    (ts, events, a[2].as_u64().expect("dp_rank"))
}

fn seq_of(frame: &[u8]) -> i64 {
    i64::from_be_bytes(frame.try_into().expect("8-byte seq"))
}

/// Every batch from `start`, through the replay socket: `(seq, payload)`.
async fn replay(port: u16, start: u64) -> Vec<(u64, Vec<u8>)> {
    let mut d = zeromq::DealerSocket::new();
    d.connect(&format!("tcp://127.0.0.1:{port}")).await.unwrap();
    let req: Vec<bytes::Bytes> = vec![
        bytes::Bytes::new(),
        bytes::Bytes::copy_from_slice(&start.to_be_bytes()),
    ];
    d.send(ZmqMessage::try_from(req).unwrap()).await.unwrap();
    let mut out = Vec::new();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), d.recv())
            .await
            .expect("replay answers")
            .unwrap()
            .into_vec();
        assert_eq!(m.len(), 3, "[\"\", seq, payload]");
        let seq = seq_of(&m[1]);
        if seq == -1 {
            assert!(m[2].is_empty());
            return out;
        }
        out.push((seq as u64, m[2].to_vec()));
    }
}

/// A router's view: the hashes it believes cached, and their tokens.
#[derive(Default)]
struct View {
    cached: BTreeMap<u64, Vec<u32>>,
    stored_runs: usize,
    removed: usize,
    cleared: usize,
}

impl View {
    fn apply(&mut self, e: &Event) {
        match e {
            Event::Stored {
                hashes,
                parent,
                tokens,
                block_size,
            } => {
                assert_eq!(*block_size, 16);
                assert_eq!(tokens.len(), hashes.len() * 16, "{e:?}");
                if let Some(p) = parent {
                    assert!(self.cached.contains_key(p), "parent {p} not cached: {e:?}");
                }
                for (h, t) in hashes.iter().zip(tokens.chunks(16)) {
                    assert!(self.cached.insert(*h, t.to_vec()).is_none(), "{h} twice");
                }
                self.stored_runs += 1;
            }
            Event::Removed(hs) => {
                for h in hs {
                    assert!(self.cached.remove(h).is_some(), "{h} removed, never stored");
                }
                self.removed += hs.len();
            }
            Event::Cleared => {
                self.cached.clear();
                self.cleared += 1;
            }
        }
    }
}

fn prompt(i: usize) -> String {
    format!(
        "Tenant {i} asks: explain, in plain words and with an example, how a \
         paged key-value cache lets a serving engine share prompt prefixes \
         between requests ({i})."
    )
}

#[test]
fn kv_events_published_replayed_and_consistent() {
    let (pub_port, replay_port) = (free_port(), free_port());
    let cfg = json!({
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": format!("tcp://*:{pub_port}"),
        "replay_endpoint": format!("tcp://*:{replay_port}"),
        "topic": "kv-events",
    })
    .to_string();
    // 24 blocks of 16: a few prompts fill it, so later ones evict.
    let s = Server::start_with_env(
        &["--kv-events-config", &cfg, "--num-kv-blocks", "24"],
        &[("VLLM_SERVER_DEV_MODE", "1")],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut sub = zeromq::SubSocket::new();
    rt.block_on(async {
        sub.connect(&format!("tcp://127.0.0.1:{pub_port}"))
            .await
            .unwrap();
        sub.subscribe("kv-events").await.unwrap();
    });
    let complete = |p: &str| {
        let body = json!({"prompt": p, "max_tokens": 4, "temperature": 0});
        let (st, v) = s.post("/v1/completions", &body);
        assert_eq!(st, 200, "{v}");
    };
    for i in 0..10 {
        complete(&prompt(i));
    }
    complete(&prompt(0)); // a prefix hit (or a recompute if evicted)
    let (st, text) = s.post_raw("/reset_prefix_cache", b"");
    assert_eq!(st, 200, "{text}");
    complete(&prompt(1));

    // Live: everything published after the subscription reached the server.
    let mut live: Vec<(u64, Vec<u8>)> = Vec::new();
    rt.block_on(async {
        while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(3), sub.recv()).await {
            let f = m.into_vec();
            assert_eq!(f.len(), 3, "[topic, seq, payload]");
            assert_eq!(&f[0][..], b"kv-events");
            live.push((seq_of(&f[1]) as u64, f[2].to_vec()));
        }
    });
    let all = rt.block_on(replay(replay_port, 0));
    assert!(!all.is_empty());
    for (k, (seq, _)) in all.iter().enumerate() {
        assert_eq!(*seq, k as u64, "replay is every batch from 0, in order");
    }
    assert!(!live.is_empty(), "no live batch arrived");
    for (seq, payload) in &live {
        assert_eq!(&all[*seq as usize].1, payload, "replay of {seq} differs");
    }
    let tail = rt.block_on(replay(replay_port, all.len() as u64 - 2));
    assert_eq!(tail.len(), 2);

    let mut view = View::default();
    let mut events = Vec::new();
    for (_, payload) in &all {
        let (ts, evs, rank) = decode(payload);
        assert!(ts > 1.6e9, "ts is seconds since the epoch: {ts}");
        assert_eq!(rank, 0);
        events.extend(evs);
    }
    for e in &events {
        view.apply(e);
    }
    assert!(view.removed > 0, "24 blocks and 10 prompts must evict");
    assert_eq!(view.cleared, 1);
    let cleared_at = events.iter().position(|e| *e == Event::Cleared).unwrap();

    // The first run stored is prompt 0's first blocks, tokens as /tokenize gives.
    let (_, tok) = s.post("/tokenize", &json!({"prompt": prompt(0)}));
    let ids: Vec<u32> = tok["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let Event::Stored { parent, tokens, .. } = &events[0] else {
        panic!("first event {:?}", events[0]);
    };
    assert_eq!(*parent, None);
    assert_eq!(tokens[..], ids[..tokens.len()]);
    // After the reset, prompt 1 is stored again from its first block.
    let again: Vec<&Event> = events[cleared_at + 1..].iter().collect();
    assert!(
        matches!(again.first(), Some(Event::Stored { parent: None, .. })),
        "{again:?}"
    );
    // The view is what the engine caches now: prompt 1's blocks (and its output's).
    let (_, tok1) = s.post("/tokenize", &json!({"prompt": prompt(1)}));
    let n1 = tok1["tokens"].as_array().unwrap().len() / 16;
    let cached: HashSet<Vec<u32>> = view.cached.values().cloned().collect();
    let ids1: Vec<u32> = tok1["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    for b in ids1.chunks(16).take(n1) {
        assert!(cached.contains(b), "prompt 1's block {b:?} not in the view");
    }
    assert!(view.stored_runs >= 11);
}

#[test]
fn kv_events_config_errors_are_clear() {
    let bin = env!("CARGO_BIN_EXE_pagoda");
    for (cfg, want) in [
        (
            r#"{"enable_kv_cache_events": true, "publisher": "kafka"}"#,
            "kafka",
        ),
        (
            r#"{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/e"}"#,
            "tcp://",
        ),
        (r#"{"enable_kv_cache_events": true, "hwmm": 3}"#, "hwmm"),
        ("not json", "--kv-events-config"),
    ] {
        let out = std::process::Command::new(bin)
            .args(["serve", "--kv-events-config", cfg])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{cfg}: {err}");
    }
}

#[test]
fn kv_events_port_in_use_fails_at_start() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg = json!({"enable_kv_cache_events": true, "endpoint": format!("tcp://*:{port}")});
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .args(["serve", "--port", &free_port().to_string()])
        .arg("--model")
        .arg(common::model_path())
        .args(["--kv-events-config", &cfg.to_string()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("KV-event endpoint"), "{err}");
    drop(taken);
}
