//! KV-cache events on the wire, as vLLM publishes them (`--kv-events-config`).
//!
//! Routers with precise prefix-aware policies (vllm-router's `kv_aware`, llm-d's
//! precise prefix scorer, Dynamo's KV router) subscribe to each engine's events to
//! know which blocks it holds. This module is vLLM's `ZmqEventPublisher`
//! (`vllm/distributed/kv_events.py`) for Pagoda's block pool:
//! - a ZMQ PUB socket sends one three-frame message per engine step that changed
//!   the cache: `[topic, seq, payload]`, `seq` a u64 big-endian counting from 0,
//!   `payload` the MessagePack of `[ts, [event, ...], data_parallel_rank]`;
//! - each event is a map tagged by `"type"` (msgspec's `tag=True`): `BlockStored`
//!   with `block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, `lora_id`,
//!   `medium`, `lora_name`; `BlockRemoved` with `block_hashes`, `medium`;
//!   `AllBlocksCleared` alone. This is what vllm-router 0.1.17's `kv_aware` decodes
//!   (it refuses events that are not tagged maps); early vLLM releases wrote events
//!   as positional arrays, which today's consumers no longer read;
//! - an optional ROUTER socket (`replay_endpoint`) answers a request carrying a
//!   start sequence number (8 bytes, big-endian) with every buffered batch from
//!   there, `[seq, payload]` each, then `[-1, ""]`;
//! - endpoints with `*` or `::` are bound, others connected to (vLLM's rule: a
//!   consumer that binds, as llm-d's does, is connected to).
//!
//! The scheduler crate only collects the events (its `kv_events` module); the engine
//! loop hands them to the [`KvEventSink`] built here after every step. The sink never
//! blocks the engine unless `max_queue_size` batches are already waiting (vLLM's queue
//! blocks there too). Block hashes are Pagoda's 128-bit chain hashes folded to the
//! u64 that vLLM's consumers expect; `medium` is `"GPU"`, vLLM's name for the engine's
//! own KV cache (the tier a router prefers), whatever the device.

use anyhow::{bail, Context};
use bytes::Bytes;
use pagoda_core::BlockHash;
use pagoda_engine::KvCacheEvent;
use pagoda_engine::KvEventSink;
use serde::Deserialize;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// vLLM's `KVEventsConfig`, the JSON of `--kv-events-config`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KvEventsConfig {
    #[serde(default)]
    pub enable_kv_cache_events: bool,
    /// `"zmq"` or `"null"`; unset means `"zmq"` when events are enabled (vLLM's rule).
    #[serde(default)]
    pub publisher: Option<String>,
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// Accepted for vLLM's sake; the pure-Rust ZMQ PUB keeps a fixed 100000-message
    /// queue per subscriber and, like libzmq at its high-water mark, drops beyond it.
    #[serde(default = "default_hwm")]
    pub hwm: usize,
    /// Batches waiting for the publisher before the engine waits for it.
    #[serde(default = "default_max_queue_size")]
    pub max_queue_size: usize,
    #[serde(default)]
    pub topic: String,
}

fn default_endpoint() -> String {
    "tcp://*:5557".into()
}
fn default_buffer_steps() -> usize {
    10_000
}
fn default_hwm() -> usize {
    100_000
}
fn default_max_queue_size() -> usize {
    100_000
}

impl KvEventsConfig {
    /// Parses and checks the flag's JSON.
    pub fn parse(json: &str) -> Result<KvEventsConfig, String> {
        let c: KvEventsConfig =
            serde_json::from_str(json).map_err(|e| format!("--kv-events-config: {e}"))?;
        match c.publisher.as_deref() {
            None | Some("zmq") | Some("null") => {}
            Some(other) => {
                return Err(format!(
                    "--kv-events-config: publisher {other:?} is not one of \"zmq\", \"null\""
                ))
            }
        }
        if c.max_queue_size == 0 {
            return Err("--kv-events-config: max_queue_size must be at least 1".into());
        }
        for e in std::iter::once(&c.endpoint).chain(c.replay_endpoint.as_ref()) {
            if !e.starts_with("tcp://") {
                return Err(format!(
                    "--kv-events-config: endpoint {e:?}: only tcp:// endpoints are served"
                ));
            }
        }
        Ok(c)
    }

    /// Whether events are published at all.
    pub fn publishes(&self) -> bool {
        let publisher = self
            .publisher
            .as_deref()
            .unwrap_or(if self.enable_kv_cache_events {
                "zmq"
            } else {
                "null"
            });
        self.enable_kv_cache_events && publisher == "zmq"
    }
}

/// One batch on its way to the publisher task.
struct Batch {
    ts: f64,
    events: Vec<KvCacheEvent>,
}

/// The batches sent, for replay: `(seq, payload)`, oldest first.
type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// vLLM's end-of-replay marker: seq -1 as 8 signed big-endian bytes.
const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// What vLLM's consumers take for a block hash: Pagoda's 128-bit chain hash, its two
/// halves folded (a collision needs both halves' xor to collide).
pub fn external_hash(h: BlockHash) -> u64 {
    (h.0 as u64) ^ ((h.0 >> 64) as u64)
}

/// MessagePack of one batch as vLLM writes it: the batch a positional array
/// `[ts, events, dp_rank]`, each event a map led by its `"type"` tag with the
/// fields that have no default always present (`lora_id`, `medium`, `lora_name`)
/// and those at their default left out (msgspec's `omit_defaults`).
pub fn encode_batch(ts: f64, events: &[KvCacheEvent], dp_rank: u32) -> Vec<u8> {
    use rmp::encode::*;
    let mut b = Vec::with_capacity(64 + events.len() * 48);
    // Writes to a Vec cannot fail.
    let _ = write_array_len(&mut b, 3);
    let _ = write_f64(&mut b, ts);
    let _ = write_array_len(&mut b, len32(events.len()));
    for e in events {
        match e {
            KvCacheEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
            } => {
                let _ = write_map_len(&mut b, 8);
                key_str(&mut b, "type", "BlockStored");
                let _ = write_str(&mut b, "block_hashes");
                write_hashes(&mut b, block_hashes);
                let _ = write_str(&mut b, "parent_block_hash");
                match parent_block_hash {
                    Some(p) => {
                        let _ = write_uint(&mut b, external_hash(*p));
                    }
                    None => write_nil(&mut b).unwrap_or(()),
                }
                let _ = write_str(&mut b, "token_ids");
                let _ = write_array_len(&mut b, len32(token_ids.len()));
                for &t in token_ids {
                    let _ = write_uint(&mut b, u64::from(t));
                }
                let _ = write_str(&mut b, "block_size");
                let _ = write_uint(&mut b, *block_size as u64);
                let _ = write_str(&mut b, "lora_id");
                write_nil(&mut b).unwrap_or(());
                key_str(&mut b, "medium", MEDIUM);
                let _ = write_str(&mut b, "lora_name");
                write_nil(&mut b).unwrap_or(());
            }
            KvCacheEvent::BlockRemoved { block_hashes } => {
                let _ = write_map_len(&mut b, 3);
                key_str(&mut b, "type", "BlockRemoved");
                let _ = write_str(&mut b, "block_hashes");
                write_hashes(&mut b, block_hashes);
                key_str(&mut b, "medium", MEDIUM);
            }
            KvCacheEvent::AllBlocksCleared => {
                let _ = write_map_len(&mut b, 1);
                key_str(&mut b, "type", "AllBlocksCleared");
            }
        }
    }
    let _ = write_uint(&mut b, u64::from(dp_rank));
    b
}

/// vLLM's `MEDIUM_GPU`: the engine's own KV cache.
const MEDIUM: &str = "GPU";

/// A length as MessagePack writes it (the pool's sizes are far below 2^32).
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn key_str(b: &mut Vec<u8>, key: &str, value: &str) {
    let _ = rmp::encode::write_str(b, key);
    let _ = rmp::encode::write_str(b, value);
}

fn write_hashes(b: &mut Vec<u8>, hashes: &[BlockHash]) {
    let _ = rmp::encode::write_array_len(b, len32(hashes.len()));
    for h in hashes {
        let _ = rmp::encode::write_uint(b, external_hash(*h));
    }
}

/// vLLM binds an endpoint with a wildcard host and connects to any other.
fn binds(endpoint: &str) -> bool {
    endpoint.contains('*') || endpoint.contains("::")
}

/// The pure-Rust ZMQ resolves host names, not `*`: the wildcard is every IPv4 interface.
fn bind_address(endpoint: &str) -> String {
    endpoint.replace("//*:", "//0.0.0.0:")
}

/// A running publisher: the sink for the engine loop, and the ports it bound
/// (resolved, for tests that ask for port 0).
pub struct KvEventPublisher {
    pub sink: KvEventSink,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
}

impl KvEventPublisher {
    /// Binds (or connects) the sockets on the current tokio runtime and spawns the
    /// publishing and replay tasks.
    pub async fn start(config: &KvEventsConfig, dp_rank: u32) -> anyhow::Result<Self> {
        let mut publisher = zeromq::PubSocket::new();
        let endpoint = if binds(&config.endpoint) {
            let ep = publisher
                .bind(&bind_address(&config.endpoint))
                .await
                .with_context(|| format!("binding the KV-event endpoint {}", config.endpoint))?;
            ep.to_string()
        } else {
            publisher
                .connect(&config.endpoint)
                .await
                .with_context(|| format!("connecting the KV-event endpoint {}", config.endpoint))?;
            config.endpoint.clone()
        };
        let buffer: ReplayBuffer = Arc::default();
        let replay_endpoint = match &config.replay_endpoint {
            Some(ep) => Some(spawn_replay(ep, buffer.clone()).await?),
            None => None,
        };
        let (tx, rx) = mpsc::channel::<Batch>(config.max_queue_size);
        tokio::spawn(publish_loop(
            publisher,
            rx,
            buffer,
            PublishSettings {
                topic: Bytes::from(config.topic.clone().into_bytes()),
                buffer_steps: config.buffer_steps,
                dp_rank,
            },
        ));
        let sink: KvEventSink = Box::new(move |events| {
            let batch = Batch {
                ts: now_secs(),
                events,
            };
            // Full only if the publisher is `max_queue_size` batches behind: wait
            // then, as vLLM's queue does; a closed channel (shutdown) drops it.
            if let Err(mpsc::error::TrySendError::Full(batch)) = tx.try_send(batch) {
                let _ = tx.blocking_send(batch);
            }
        });
        tracing::info!(
            "KV-cache events: publishing on {endpoint}{}",
            replay_endpoint
                .as_deref()
                .map(|r| format!(", replay on {r}"))
                .unwrap_or_default()
        );
        Ok(KvEventPublisher {
            sink,
            endpoint,
            replay_endpoint,
        })
    }
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

struct PublishSettings {
    topic: Bytes,
    buffer_steps: usize,
    dp_rank: u32,
}

async fn publish_loop(
    mut socket: zeromq::PubSocket,
    mut rx: mpsc::Receiver<Batch>,
    buffer: ReplayBuffer,
    s: PublishSettings,
) {
    let mut seq: u64 = 0;
    while let Some(batch) = rx.recv().await {
        let payload = Bytes::from(encode_batch(batch.ts, &batch.events, s.dp_rank));
        let seq_bytes = Bytes::copy_from_slice(&seq.to_be_bytes());
        let frames = vec![s.topic.clone(), seq_bytes, payload.clone()];
        match ZmqMessage::try_from(frames) {
            Ok(msg) => {
                if let Err(e) = socket.send(msg).await {
                    tracing::warn!("KV-cache events: publishing batch {seq}: {e}");
                }
            }
            Err(e) => tracing::warn!("KV-cache events: batch {seq}: {e}"),
        }
        if s.buffer_steps > 0 {
            let mut buf = buffer.lock().unwrap_or_else(|p| p.into_inner());
            if buf.len() == s.buffer_steps {
                buf.pop_front();
            }
            buf.push_back((seq, payload));
        }
        seq += 1;
    }
}

/// Binds the replay ROUTER and spawns the task that answers it.
async fn spawn_replay(endpoint: &str, buffer: ReplayBuffer) -> anyhow::Result<String> {
    let mut socket = zeromq::RouterSocket::new();
    let bound = socket
        .bind(&bind_address(endpoint))
        .await
        .with_context(|| format!("binding the KV-event replay endpoint {endpoint}"))?
        .to_string();
    tokio::spawn(async move {
        loop {
            match socket.recv().await {
                Ok(request) => {
                    if let Err(e) = answer_replay(&mut socket, request, &buffer).await {
                        tracing::warn!("KV-cache events: replay: {e}");
                    }
                }
                Err(e) => {
                    tracing::debug!("KV-cache events: replay socket: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(bound)
}

/// Answers `[identity, "", start_seq]` with `[identity, "", seq, payload]` for every
/// buffered batch from `start_seq`, then `[identity, "", -1, ""]`.
async fn answer_replay(
    socket: &mut zeromq::RouterSocket,
    request: ZmqMessage,
    buffer: &ReplayBuffer,
) -> anyhow::Result<()> {
    let frames = request.into_vec();
    let [identity, _delim, start] = frames.as_slice() else {
        bail!("a replay request has {} frames, not 3", frames.len());
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
        bail!("a replay start sequence of {} bytes, not 8", start.len());
    };
    let start = u64::from_be_bytes(start);
    let batches: Vec<(u64, Bytes)> = buffer
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(seq, _)| *seq >= start)
        .cloned()
        .collect();
    let reply = |seq: Bytes, payload: Bytes| {
        ZmqMessage::try_from(vec![identity.clone(), Bytes::new(), seq, payload])
            .map_err(|e| anyhow::anyhow!("{e}"))
    };
    for (seq, payload) in batches {
        let seq = Bytes::copy_from_slice(&seq.to_be_bytes());
        socket.send(reply(seq, payload)?).await?;
    }
    socket
        .send(reply(Bytes::from_static(&END_SEQ), Bytes::new())?)
        .await?;
    Ok(())
}

/// `POST /reset_prefix_cache[?reset_running_requests=true]`, served under vLLM's
/// `VLLM_SERVER_DEV_MODE=1` as vLLM serves it: forgets every cached block (and
/// publishes `AllBlocksCleared`). Blocks in use by running requests make it a 409
/// unless `reset_running_requests` preempts them first.
pub async fn reset_prefix_cache(
    axum::extract::State(st): axum::extract::State<Arc<super::state::AppState>>,
    axum::extract::Query(q): axum::extract::Query<ResetQuery>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let engine = st.engine.clone();
    let preempt = q.reset_running_requests.unwrap_or(false);
    let done = tokio::task::spawn_blocking(move || engine.reset_prefix_cache(preempt)).await;
    match done {
        Ok(Ok(true)) => axum::http::StatusCode::OK.into_response(),
        Ok(Ok(false)) => super::error::ApiError::Conflict {
            message: "the prefix cache is in use by running requests; \
                      pass reset_running_requests=true to preempt them first"
                .into(),
        }
        .into_response(),
        Ok(Err(e)) => super::error::ApiError::Unavailable {
            message: e.to_string(),
        }
        .into_response(),
        Err(e) => super::error::ApiError::Unavailable {
            message: e.to_string(),
        }
        .into_response(),
    }
}

/// The query of [`reset_prefix_cache`].
#[derive(Debug, Deserialize)]
pub struct ResetQuery {
    reset_running_requests: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: u128) -> BlockHash {
        BlockHash(x)
    }

    #[test]
    fn config_defaults_and_publisher_rule() {
        let c = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true}"#).unwrap();
        assert_eq!(c.endpoint, "tcp://*:5557");
        assert_eq!(c.buffer_steps, 10_000);
        assert!(c.publishes());
        let off = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "null"}"#)
            .unwrap();
        assert!(!off.publishes());
        assert!(!KvEventsConfig::parse("{}").unwrap().publishes());
        let e = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "kafka"}"#)
            .unwrap_err();
        assert!(e.contains("kafka"), "{e}");
        let e = KvEventsConfig::parse(r#"{"endpoint": "ipc:///tmp/x"}"#).unwrap_err();
        assert!(e.contains("tcp://"), "{e}");
        let e = KvEventsConfig::parse(r#"{"enable": true}"#).unwrap_err();
        assert!(e.contains("enable"), "{e}");
    }

    #[test]
    fn endpoints_bind_or_connect_as_vllm() {
        assert!(binds("tcp://*:5557"));
        assert!(binds("tcp://[::]:5557"));
        assert!(!binds("tcp://127.0.0.1:5557"));
        assert_eq!(bind_address("tcp://*:5557"), "tcp://0.0.0.0:5557");
    }

    /// The layout, read back field by field as a consumer reads it.
    #[test]
    fn batch_is_positional_events_are_tagged_maps() {
        use rmp::decode::*;
        let events = vec![
            KvCacheEvent::BlockStored {
                block_hashes: vec![h(7), h((1 << 64) | 3)],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
            },
            KvCacheEvent::BlockStored {
                block_hashes: vec![h(9)],
                parent_block_hash: Some(h((1 << 64) | 3)),
                token_ids: vec![70000, 6],
                block_size: 2,
            },
            KvCacheEvent::BlockRemoved {
                block_hashes: vec![h(7)],
            },
            KvCacheEvent::AllBlocksCleared,
        ];
        let b = encode_batch(12.5, &events, 0);
        let mut r = &b[..];
        let mut buf = [0u8; 32];
        let mut s = |r: &mut &[u8]| read_str(r, &mut buf).unwrap().to_string();
        let ints = |r: &mut &[u8]| -> Vec<u64> {
            let n = read_array_len(r).unwrap();
            (0..n).map(|_| read_int::<u64, _>(r).unwrap()).collect()
        };
        assert_eq!(read_array_len(&mut r).unwrap(), 3);
        assert_eq!(read_f64(&mut r).unwrap(), 12.5);
        assert_eq!(read_array_len(&mut r).unwrap(), 4);
        for (parent, hashes, tokens) in [
            (None, vec![7, 1 ^ 3], vec![1, 2, 3, 4]),
            (Some(1 ^ 3), vec![9], vec![70000, 6]),
        ] {
            assert_eq!(read_map_len(&mut r).unwrap(), 8);
            assert_eq!(
                (s(&mut r), s(&mut r)),
                ("type".into(), "BlockStored".into())
            );
            assert_eq!(s(&mut r), "block_hashes");
            assert_eq!(ints(&mut r), hashes);
            assert_eq!(s(&mut r), "parent_block_hash");
            match parent {
                None => read_nil(&mut r).unwrap(),
                Some(p) => assert_eq!(read_int::<u64, _>(&mut r).unwrap(), p),
            }
            assert_eq!(s(&mut r), "token_ids");
            assert_eq!(ints(&mut r), tokens);
            assert_eq!(s(&mut r), "block_size");
            assert_eq!(read_int::<u64, _>(&mut r).unwrap(), 2);
            assert_eq!(s(&mut r), "lora_id");
            read_nil(&mut r).unwrap();
            assert_eq!((s(&mut r), s(&mut r)), ("medium".into(), "GPU".into()));
            assert_eq!(s(&mut r), "lora_name");
            read_nil(&mut r).unwrap();
        }
        assert_eq!(read_map_len(&mut r).unwrap(), 3);
        assert_eq!(
            (s(&mut r), s(&mut r)),
            ("type".into(), "BlockRemoved".into())
        );
        assert_eq!(s(&mut r), "block_hashes");
        assert_eq!(ints(&mut r), vec![7]);
        assert_eq!((s(&mut r), s(&mut r)), ("medium".into(), "GPU".into()));
        assert_eq!(read_map_len(&mut r).unwrap(), 1);
        assert_eq!(
            (s(&mut r), s(&mut r)),
            ("type".into(), "AllBlocksCleared".into())
        );
        assert_eq!(read_int::<u64, _>(&mut r).unwrap(), 0);
        assert!(r.is_empty(), "{} bytes left", r.len());
    }
}
