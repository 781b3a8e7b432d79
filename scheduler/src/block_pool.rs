//! The KV block pool: ref-counted blocks, an LRU free queue and the prefix-cache map.
//!
//! Conventions (as in vLLM V1):
//! - Block 0 is the reserved *null block*: it is taken out of the free queue at
//!   construction and never handed out, so a pool of `num_blocks` has
//!   `num_blocks - 1` usable blocks (ids `1..num_blocks`). Runners may point padding
//!   entries of a block table at it.
//! - Free blocks form an LRU queue, an intrusive doubly-linked list over block ids:
//!   allocation pops the head, freeing appends to the tail, and touching a cached
//!   free block removes it from the middle, all O(1).
//! - A freed block keeps its hash and stays in the cache map until it is popped for
//!   reuse (lazy eviction), so it can still be hit meanwhile.

use crate::hashing::FxHashMap;
use crate::kv_events::{KvCacheEvent, KvEventBuffer, StoreContext};
use crate::SchedulerError;
use pagoda_core::BlockHash;

/// The id of the reserved null block.
pub const NULL_BLOCK_ID: u32 = 0;
const NIL: u32 = u32::MAX;

/// One KV block's bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvBlock {
    pub block_id: u32,
    /// Number of requests holding the block; 0 means it sits in the free queue.
    pub ref_cnt: u32,
    /// Set once the block is full and cached; cleared when it is evicted.
    pub block_hash: Option<BlockHash>,
}

/// Intrusive doubly-linked LRU queue of free block ids.
#[derive(Debug, Clone)]
pub struct FreeBlockQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    in_queue: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeBlockQueue {
    /// A queue holding every id of `0..num_blocks`, in order.
    pub fn new(num_blocks: usize) -> Self {
        let n = num_blocks as u32;
        let prev = (0..n).map(|i| if i == 0 { NIL } else { i - 1 }).collect();
        let next = (0..n)
            .map(|i| if i + 1 == n { NIL } else { i + 1 })
            .collect();
        FreeBlockQueue {
            prev,
            next,
            in_queue: vec![true; num_blocks],
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            len: num_blocks,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn contains(&self, id: u32) -> bool {
        self.in_queue.get(id as usize).copied().unwrap_or(false)
    }
    pub fn front(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    fn check(&self, id: u32) -> Result<(), SchedulerError> {
        if (id as usize) < self.in_queue.len() {
            Ok(())
        } else {
            Err(SchedulerError::InvalidBlockId {
                block_id: id,
                num_blocks: self.in_queue.len(),
            })
        }
    }

    /// Pops the least recently freed block.
    pub fn popleft(&mut self) -> Result<u32, SchedulerError> {
        let id = self.front().ok_or(SchedulerError::NoFreeBlocks)?;
        self.unlink(id);
        Ok(id)
    }

    /// Removes a block from anywhere in the queue.
    pub fn remove(&mut self, id: u32) -> Result<(), SchedulerError> {
        self.check(id)?;
        if !self.in_queue[id as usize] {
            return Err(SchedulerError::NotInFreeQueue { block_id: id });
        }
        self.unlink(id);
        Ok(())
    }

    /// Appends a block at the tail (most recently freed).
    pub fn append(&mut self, id: u32) -> Result<(), SchedulerError> {
        self.check(id)?;
        if self.in_queue[id as usize] {
            return Err(SchedulerError::AlreadyInFreeQueue { block_id: id });
        }
        let i = id as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = id;
        } else {
            self.next[self.tail as usize] = id;
        }
        self.tail = id;
        self.in_queue[i] = true;
        self.len += 1;
        Ok(())
    }

    fn unlink(&mut self, id: u32) {
        let i = id as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.in_queue[i] = false;
        self.len -= 1;
    }

    /// Ids from head (next to allocate) to tail.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let id = cur;
                cur = self.next[id as usize];
                id
            })
        })
    }

    /// Links agree both ways, the length matches, membership flags match the list.
    pub fn check_invariants(&self) -> Result<(), String> {
        let fwd: Vec<u32> = self.iter().take(self.in_queue.len() + 1).collect();
        if fwd.len() != self.len {
            return Err(format!(
                "queue walks {} ids, len says {}",
                fwd.len(),
                self.len
            ));
        }
        let mut back = Vec::with_capacity(self.len);
        let mut cur = self.tail;
        while cur != NIL && back.len() <= self.len {
            back.push(cur);
            cur = self.prev[cur as usize];
        }
        back.reverse();
        if back != fwd {
            return Err("forward and backward walks differ".into());
        }
        let members = self.in_queue.iter().filter(|&&b| b).count();
        if members != self.len || fwd.iter().any(|&id| !self.in_queue[id as usize]) {
            return Err("membership flags disagree with the list".into());
        }
        Ok(())
    }
}

/// Ids cached under one hash: almost always one, so avoid a Vec for that case.
#[derive(Debug, Clone)]
enum CachedIds {
    One(u32),
    Many(Vec<u32>),
}

/// The pool of KV blocks with prefix caching.
#[derive(Debug, Clone)]
pub struct BlockPool {
    blocks: Vec<KvBlock>,
    free_queue: FreeBlockQueue,
    cached: FxHashMap<BlockHash, CachedIds>,
    enable_caching: bool,
    /// Hashes entering and leaving `cached`, for KV-event publishers.
    events: KvEventBuffer,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks, block 0 reserved as the null block.
    pub fn new(num_blocks: usize, enable_caching: bool) -> Result<Self, SchedulerError> {
        if num_blocks < 2 || num_blocks > (u32::MAX - 1) as usize {
            return Err(SchedulerError::InvalidConfig {
                field: "num_blocks",
                message: format!(
                    "need at least 2 blocks (one is the null block), got {num_blocks}"
                ),
            });
        }
        let blocks = (0..num_blocks as u32)
            .map(|block_id| KvBlock {
                block_id,
                ref_cnt: 0,
                block_hash: None,
            })
            .collect();
        let mut free_queue = FreeBlockQueue::new(num_blocks);
        let null = free_queue.popleft()?;
        debug_assert_eq!(null, NULL_BLOCK_ID);
        Ok(BlockPool {
            blocks,
            free_queue,
            cached: FxHashMap::default(),
            enable_caching,
            events: KvEventBuffer::default(),
        })
    }

    /// Total blocks including the null block.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }
    /// Blocks that can ever be handed out.
    pub fn num_usable_blocks(&self) -> usize {
        self.blocks.len() - 1
    }
    pub fn num_free_blocks(&self) -> usize {
        self.free_queue.len()
    }
    /// Fraction of usable blocks in use, in [0, 1].
    pub fn get_usage(&self) -> f64 {
        1.0 - self.num_free_blocks() as f64 / self.num_usable_blocks() as f64
    }
    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }
    pub fn block(&self, id: u32) -> Option<&KvBlock> {
        self.blocks.get(id as usize)
    }
    /// Free block ids, next to be allocated first.
    pub fn free_block_ids(&self) -> Vec<u32> {
        self.free_queue.iter().collect()
    }
    pub fn free_queue(&self) -> &FreeBlockQueue {
        &self.free_queue
    }
    /// Number of distinct hashes in the cache map.
    pub fn num_cached_hashes(&self) -> usize {
        self.cached.len()
    }
    /// Every block cached under `hash` (duplicates happen when two requests computed
    /// the same block at the same time).
    pub fn cached_block_ids(&self, hash: BlockHash) -> Vec<u32> {
        match self.cached.get(&hash) {
            None => Vec::new(),
            Some(CachedIds::One(id)) => vec![*id],
            Some(CachedIds::Many(v)) => v.clone(),
        }
    }
    /// A cached block for `hash`, if any.
    pub fn get_cached_block(&self, hash: BlockHash) -> Option<u32> {
        match self.cached.get(&hash)? {
            CachedIds::One(id) => Some(*id),
            CachedIds::Many(v) => v.first().copied(),
        }
    }

    fn check_id(&self, id: u32) -> Result<(), SchedulerError> {
        if id == NULL_BLOCK_ID {
            return Err(SchedulerError::NullBlock { block_id: id });
        }
        if (id as usize) >= self.blocks.len() {
            return Err(SchedulerError::InvalidBlockId {
                block_id: id,
                num_blocks: self.blocks.len(),
            });
        }
        Ok(())
    }

    /// Pops `n` blocks from the head of the free queue, evicting cached ones, with
    /// ref_cnt 1. Fails without side effects when fewer than `n` are free.
    pub fn get_new_blocks(&mut self, n: usize) -> Result<Vec<u32>, SchedulerError> {
        let mut out = Vec::with_capacity(n);
        self.get_new_blocks_into(n, &mut out)?;
        Ok(out)
    }

    /// Like [`Self::get_new_blocks`], appending to `out`.
    pub fn get_new_blocks_into(
        &mut self,
        n: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), SchedulerError> {
        if n > self.num_free_blocks() {
            return Err(SchedulerError::NotEnoughFreeBlocks {
                requested: n,
                free: self.num_free_blocks(),
            });
        }
        for _ in 0..n {
            let id = self.free_queue.popleft()?;
            self.maybe_evict(id);
            let b = &mut self.blocks[id as usize];
            debug_assert_eq!(b.ref_cnt, 0);
            b.ref_cnt = 1;
            out.push(id);
        }
        Ok(())
    }

    /// Drops a block's hash from the cache map (it is about to be overwritten).
    fn maybe_evict(&mut self, id: u32) -> bool {
        let Some(h) = self.blocks[id as usize].block_hash.take() else {
            return false;
        };
        let empty = match self.cached.get_mut(&h) {
            None => false,
            Some(CachedIds::One(x)) => *x == id,
            Some(CachedIds::Many(v)) => {
                v.retain(|&x| x != id);
                if v.len() == 1 {
                    let only = v[0];
                    self.cached.insert(h, CachedIds::One(only));
                }
                false
            }
        };
        if empty {
            self.cached.remove(&h);
            self.events.removed(h);
        }
        true
    }

    /// Starts (or stops) collecting [`KvCacheEvent`]s.
    pub fn set_kv_events(&mut self, on: bool) {
        self.events.set_enabled(on);
    }

    /// The events collected since the last call, in order.
    pub fn take_kv_events(&mut self) -> Vec<KvCacheEvent> {
        self.events.take()
    }

    /// Forgets the hashes of blocks whose content will never be written (their
    /// request was preempted before the step that fills them ran).
    pub fn uncache(&mut self, ids: &[u32]) {
        for &id in ids {
            if (id as usize) < self.blocks.len() {
                self.maybe_evict(id);
            }
        }
    }

    /// Takes a reference on each block (prefix hits); a free one leaves the free queue.
    pub fn touch(&mut self, ids: &[u32]) -> Result<(), SchedulerError> {
        for &id in ids {
            self.check_id(id)?;
        }
        for &id in ids {
            if self.blocks[id as usize].ref_cnt == 0 {
                self.free_queue.remove(id)?;
            }
            self.blocks[id as usize].ref_cnt += 1;
        }
        Ok(())
    }

    /// Drops one reference on each block, in order; blocks reaching 0 go to the
    /// tail of the free queue in that order. Stops at the first invalid id.
    pub fn free_blocks(
        &mut self,
        ids: impl IntoIterator<Item = u32>,
    ) -> Result<(), SchedulerError> {
        for id in ids {
            self.check_id(id)?;
            let b = &mut self.blocks[id as usize];
            if b.ref_cnt == 0 {
                return Err(SchedulerError::BlockNotInUse { block_id: id });
            }
            b.ref_cnt -= 1;
            if b.ref_cnt == 0 {
                self.free_queue.append(id)?;
            }
        }
        Ok(())
    }

    /// Records full blocks under their hashes. Blocks already hashed (prefix hits)
    /// are left as they are. No-op when caching is off.
    pub fn cache_full_blocks(
        &mut self,
        ids: &[u32],
        hashes: &[BlockHash],
    ) -> Result<(), SchedulerError> {
        self.cache_full_blocks_with(ids, hashes, None)
    }

    /// [`Self::cache_full_blocks`] that also reports the hashes new to the cache
    /// as `BlockStored` events, with the request's tokens from `ctx` (events are
    /// collected only when `ctx` is given and events are on).
    pub fn cache_full_blocks_with(
        &mut self,
        ids: &[u32],
        hashes: &[BlockHash],
        ctx: Option<StoreContext<'_>>,
    ) -> Result<(), SchedulerError> {
        if ids.len() != hashes.len() {
            return Err(SchedulerError::HashCountMismatch {
                num_blocks: ids.len(),
                num_hashes: hashes.len(),
            });
        }
        if !self.enable_caching {
            return Ok(());
        }
        for &id in ids {
            self.check_id(id)?;
        }
        // Only a publisher wants the new hashes' positions: without one the hot
        // path neither records nor allocates.
        let ctx = ctx.filter(|_| self.events.is_enabled());
        let mut fresh = Vec::new();
        for (k, (&id, &h)) in ids.iter().zip(hashes).enumerate() {
            let b = &mut self.blocks[id as usize];
            if b.block_hash.is_some() {
                continue;
            }
            b.block_hash = Some(h);
            match self.cached.get_mut(&h) {
                None => {
                    self.cached.insert(h, CachedIds::One(id));
                    if let Some(c) = &ctx {
                        fresh.push(c.first_block + k);
                    }
                }
                Some(CachedIds::One(x)) => {
                    let first = *x;
                    self.cached.insert(h, CachedIds::Many(vec![first, id]));
                }
                Some(CachedIds::Many(v)) => v.push(id),
            }
        }
        if let Some(ctx) = ctx {
            self.events.stored(ctx, &fresh);
        }
        Ok(())
    }

    /// Forgets every cached hash; fails while any block is in use.
    pub fn reset_prefix_cache(&mut self) -> Result<(), SchedulerError> {
        let used = self.num_usable_blocks() - self.num_free_blocks();
        if used > 0 {
            return Err(SchedulerError::PrefixCacheInUse {
                num_used_blocks: used,
            });
        }
        self.cached.clear();
        for b in &mut self.blocks {
            b.block_hash = None;
        }
        self.events.cleared();
        Ok(())
    }

    /// Full consistency check, for tests: free queue links, free queue == blocks with
    /// ref_cnt 0 (minus the null block), cache map == blocks with a hash.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.free_queue.check_invariants()?;
        for b in &self.blocks[1..] {
            if (b.ref_cnt == 0) != self.free_queue.contains(b.block_id) {
                return Err(format!(
                    "block {} ref_cnt {} vs free queue",
                    b.block_id, b.ref_cnt
                ));
            }
            if let Some(h) = b.block_hash {
                if !self.cached_block_ids(h).contains(&b.block_id) {
                    return Err(format!("block {} hashed but not in the map", b.block_id));
                }
            }
        }
        if self.free_queue.contains(NULL_BLOCK_ID) || self.blocks[0].block_hash.is_some() {
            return Err("null block in the free queue or hashed".into());
        }
        for (h, ids) in &self.cached {
            let ids: Vec<u32> = match ids {
                CachedIds::One(id) => vec![*id],
                CachedIds::Many(v) => v.clone(),
            };
            if ids.is_empty() {
                return Err("empty cache entry".into());
            }
            for id in ids {
                if self.blocks[id as usize].block_hash != Some(*h) {
                    return Err(format!(
                        "map holds block {id} under a hash it does not have"
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Scenario 32 (test_free_kv_cache_block_queue_operations).
    #[test]
    fn free_queue_operations_relink_neighbours() {
        let mut q = FreeBlockQueue::new(5);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert_eq!(q.popleft().unwrap(), 0);
        assert_eq!(q.front(), Some(1));
        q.remove(3).unwrap();
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![1, 2, 4]);
        q.append(3).unwrap();
        q.append(0).unwrap();
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![1, 2, 4, 3, 0]);
        q.remove(0).unwrap();
        q.remove(1).unwrap();
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![2, 4, 3]);
        q.check_invariants().unwrap();
        assert_eq!(
            q.remove(1),
            Err(SchedulerError::NotInFreeQueue { block_id: 1 })
        );
        assert_eq!(
            q.append(2),
            Err(SchedulerError::AlreadyInFreeQueue { block_id: 2 })
        );
        for _ in 0..3 {
            q.popleft().unwrap();
        }
        assert_eq!(q.popleft(), Err(SchedulerError::NoFreeBlocks));
        assert_eq!(
            q.popleft().unwrap_err().to_string(),
            "no free blocks available"
        );
        q.check_invariants().unwrap();
    }

    #[test]
    fn null_block_is_reserved() {
        let mut p = BlockPool::new(4, true).unwrap();
        assert_eq!(p.num_free_blocks(), 3);
        assert_eq!(p.get_new_blocks(3).unwrap(), vec![1, 2, 3]);
        assert!(p.get_new_blocks(1).is_err());
        assert_eq!(
            p.free_blocks([0]),
            Err(SchedulerError::NullBlock { block_id: 0 })
        );
        assert!(BlockPool::new(1, true).is_err());
    }

    // Scenario 29 (test_maybe_evict_cached_block): duplicate-hash blocks are kept
    // together; evicting one leaves the other under the same key.
    #[test]
    fn duplicate_hashes_survive_single_eviction() {
        let mut p = BlockPool::new(4, true).unwrap();
        let ids = p.get_new_blocks(3).unwrap();
        let (h0, h1) = (BlockHash(10), BlockHash(11));
        p.cache_full_blocks(&ids, &[h0, h0, h1]).unwrap();
        assert_eq!(p.cached_block_ids(h0), vec![1, 2]);
        p.free_blocks([1, 2, 3]).unwrap();
        // Popping block 1 evicts it; block 2 stays cached under h0.
        assert_eq!(p.get_new_blocks(1).unwrap(), vec![1]);
        assert_eq!(p.block(1).unwrap().block_hash, None);
        assert_eq!(p.cached_block_ids(h0), vec![2]);
        assert_eq!(p.get_cached_block(h0), Some(2));
        assert_eq!(p.get_new_blocks(2).unwrap(), vec![2, 3]);
        assert_eq!(p.num_cached_hashes(), 0);
        p.check_invariants().unwrap();
    }
}
