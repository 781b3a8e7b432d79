//! KV-cache events: what the block pool tells the outside world about its cache.
//!
//! Routers with precise prefix-aware policies (vllm-router's `kv_aware`, llm-d's
//! precise prefix scorer) keep an index of which engine holds which block. They learn
//! it from vLLM's three events, which this module mirrors as plain data:
//! - [`KvCacheEvent::BlockStored`]: full blocks got their hashes (are now prefix hits),
//! - [`KvCacheEvent::BlockRemoved`]: hashed blocks were evicted (no longer hits),
//! - [`KvCacheEvent::AllBlocksCleared`]: the prefix cache was reset.
//!
//! The scheduler crate only *collects* them into a [`KvEventBuffer`] that the engine
//! drains once per step; it knows nothing of ZMQ or msgpack (the server publishes).
//!
//! Events are per hash, not per block: a hash is "stored" when it enters the pool's
//! hash map and "removed" when its last block leaves it. Two blocks cached under one
//! hash (two requests computed the same block at once) are one entry for a router,
//! so a consumer that adds on store and deletes on remove always agrees with the
//! pool's map.

use pagoda_core::BlockHash;

/// One KV-cache event, as vLLM's `vllm/distributed/kv_events.py` defines them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvCacheEvent {
    /// A run of consecutive full blocks of one request became cached.
    BlockStored {
        /// The blocks' hashes, in chain order.
        block_hashes: Vec<BlockHash>,
        /// The hash of the block before the first one (None for a prompt's first).
        parent_block_hash: Option<BlockHash>,
        /// The tokens of all the blocks, `block_hashes.len() * block_size` of them.
        token_ids: Vec<u32>,
        block_size: usize,
    },
    /// Hashes that are no longer cached.
    BlockRemoved { block_hashes: Vec<BlockHash> },
    /// Every cached hash was forgotten.
    AllBlocksCleared,
}

/// The request context of a store: which blocks of which token sequence.
#[derive(Debug, Clone, Copy)]
pub struct StoreContext<'a> {
    /// The request's tokens (at least up to the last stored block's end).
    pub tokens: &'a [u32],
    /// The request's chained hashes (every full block's).
    pub all_hashes: &'a [BlockHash],
    /// The index, in the request, of the first block handed to the pool.
    pub first_block: usize,
    pub block_size: usize,
}

/// Collects events between drains; off (collecting nothing) unless enabled.
#[derive(Debug, Clone, Default)]
pub struct KvEventBuffer {
    enabled: bool,
    events: Vec<KvCacheEvent>,
    /// Hashes removed since the last event was pushed, merged into one event.
    pending_removed: Vec<BlockHash>,
}

impl KvEventBuffer {
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Starts (or stops) collecting; stopping drops what was collected.
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
        if !on {
            self.events.clear();
            self.pending_removed.clear();
        }
    }

    /// Records the stored blocks `indices` (positions in the request, ascending)
    /// as one event per consecutive run.
    pub fn stored(&mut self, ctx: StoreContext<'_>, indices: &[usize]) {
        if !self.enabled || indices.is_empty() {
            return;
        }
        self.flush_removed();
        let bs = ctx.block_size;
        let mut run_start = 0;
        for k in 1..=indices.len() {
            if k < indices.len() && indices[k] == indices[k - 1] + 1 {
                continue;
            }
            let (first, last) = (indices[run_start], indices[k - 1]);
            self.events.push(KvCacheEvent::BlockStored {
                block_hashes: ctx.all_hashes[first..=last].to_vec(),
                parent_block_hash: first.checked_sub(1).map(|p| ctx.all_hashes[p]),
                token_ids: ctx.tokens[first * bs..(last + 1) * bs].to_vec(),
                block_size: bs,
            });
            run_start = k;
        }
    }

    /// Records that `hash` left the cache.
    pub fn removed(&mut self, hash: BlockHash) {
        if self.enabled {
            self.pending_removed.push(hash);
        }
    }

    /// Records a reset: whatever was pending is superseded by it.
    pub fn cleared(&mut self) {
        if self.enabled {
            self.flush_removed();
            self.events.push(KvCacheEvent::AllBlocksCleared);
        }
    }

    fn flush_removed(&mut self) {
        if !self.pending_removed.is_empty() {
            let block_hashes = std::mem::take(&mut self.pending_removed);
            self.events
                .push(KvCacheEvent::BlockRemoved { block_hashes });
        }
    }

    /// Everything collected since the last call, in order.
    pub fn take(&mut self) -> Vec<KvCacheEvent> {
        self.flush_removed();
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_runs_split_at_gaps_and_carry_parents() {
        let mut b = KvEventBuffer::default();
        let hashes: Vec<BlockHash> = (0..4).map(|i| BlockHash(100 + i)).collect();
        let tokens: Vec<u32> = (0..8).collect();
        let ctx = StoreContext {
            tokens: &tokens,
            all_hashes: &hashes,
            first_block: 0,
            block_size: 2,
        };
        b.stored(ctx, &[0, 1]);
        assert!(b.take().is_empty(), "disabled buffers collect nothing");
        b.set_enabled(true);
        b.stored(ctx, &[0, 2, 3]);
        b.removed(BlockHash(7));
        b.removed(BlockHash(8));
        b.cleared();
        let ev = b.take();
        assert_eq!(
            ev,
            vec![
                KvCacheEvent::BlockStored {
                    block_hashes: vec![BlockHash(100)],
                    parent_block_hash: None,
                    token_ids: vec![0, 1],
                    block_size: 2,
                },
                KvCacheEvent::BlockStored {
                    block_hashes: vec![BlockHash(102), BlockHash(103)],
                    parent_block_hash: Some(BlockHash(101)),
                    token_ids: vec![4, 5, 6, 7],
                    block_size: 2,
                },
                KvCacheEvent::BlockRemoved {
                    block_hashes: vec![BlockHash(7), BlockHash(8)]
                },
                KvCacheEvent::AllBlocksCleared,
            ]
        );
        assert!(b.take().is_empty());
    }
}
