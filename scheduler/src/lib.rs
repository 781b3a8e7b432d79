//! The vLLM-V1-style scheduler, KV cache manager and block pool with prefix caching.
//!
//! - [`block_pool`]: ref-counted KV blocks, the LRU free queue, the hash -> block map.
//! - [`hashing`]: chained block hashes (xxh3-128) and the crate's fast map hasher.
//! - [`kv_cache_manager`]: per-request block tables, prefix hits, all-or-nothing allocation.
//! - [`kv_events`]: the block pool's BlockStored / BlockRemoved / AllBlocksCleared events,
//!   collected per step for a publisher outside this crate.
//! - [`scheduler`]: continuous batching under a token budget with chunked prefill and
//!   preemption by recompute; produces [`pagoda_core::SchedulerOutput`].
//!
//! Block 0 is reserved as the null block (as in vLLM): a cache of `num_blocks` blocks has
//! `num_blocks - 1` usable ones.

pub mod block_pool;
pub mod error;
pub mod hashing;
pub mod kv_cache_manager;
pub mod kv_events;
pub mod reference;
pub mod scheduler;

pub use block_pool::{BlockPool, FreeBlockQueue, KvBlock, NULL_BLOCK_ID};
pub use error::SchedulerError;
pub use hashing::{block_hashes_of, hash_block, update_block_hashes};
pub use kv_cache_manager::{KvCacheManager, KvHandle, PrefixCacheMetrics, PrefixCacheStats};
pub use kv_events::{KvCacheEvent, KvEventBuffer};
pub use scheduler::{
    Scheduler, SchedulerConfig, SchedulerStats, SchedulingPolicy, SpecDecodingStats,
};
