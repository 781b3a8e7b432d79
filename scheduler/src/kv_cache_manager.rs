//! The KV cache manager: which blocks each request holds, prefix-cache lookups,
//! slot allocation that is all-or-nothing, and freeing in reverse order.
//!
//! vLLM V1 semantics for one full-attention KV cache group:
//! - a prefix hit covers whole cached blocks only, and never the whole prompt: at
//!   least the last token is recomputed, so at most `num_tokens - 1` tokens hit;
//! - `allocate_slots` returns `None` and changes nothing when the free queue cannot
//!   cover the new blocks *plus* the hit blocks it would pull out of the free queue;
//! - blocks become cached as soon as they are full of known (computed or being
//!   computed this step) tokens;
//! - `free` releases a request's blocks tail first, so its tail is evicted first.

use crate::block_pool::BlockPool;
use crate::hashing::{update_block_hashes, FxHashMap};
use crate::kv_events::{KvCacheEvent, StoreContext};
use crate::SchedulerError;
use pagoda_core::{Request, RequestId};
use std::collections::VecDeque;

/// Cumulative prefix-cache counters, in tokens (and lookups).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Lookups (one per admission of a request, resumed ones included).
    pub requests: u64,
    /// Tokens looked up.
    pub queries: u64,
    /// Tokens served from the cache.
    pub hits: u64,
}

impl PrefixCacheStats {
    pub fn hit_rate(&self) -> f64 {
        if self.queries == 0 {
            0.0
        } else {
            self.hits as f64 / self.queries as f64
        }
    }
}

/// Hit rate over the most recent `max_recent_requests` lookups (vLLM's
/// `CachingMetrics`): whole observations are dropped, oldest first, while the
/// window holds more requests than allowed.
#[derive(Debug, Clone)]
pub struct PrefixCacheMetrics {
    max_recent_requests: u64,
    window: VecDeque<PrefixCacheStats>,
    total: PrefixCacheStats,
}

impl PrefixCacheMetrics {
    pub fn new(max_recent_requests: u64) -> Self {
        PrefixCacheMetrics {
            max_recent_requests,
            window: VecDeque::new(),
            total: PrefixCacheStats::default(),
        }
    }
    pub fn observe(&mut self, s: PrefixCacheStats) {
        if s.requests == 0 {
            return;
        }
        self.window.push_back(s);
        self.total.requests += s.requests;
        self.total.queries += s.queries;
        self.total.hits += s.hits;
        while self.total.requests > self.max_recent_requests {
            let Some(old) = self.window.pop_front() else {
                break;
            };
            self.total.requests -= old.requests;
            self.total.queries -= old.queries;
            self.total.hits -= old.hits;
        }
    }
    pub fn hit_rate(&self) -> f64 {
        self.total.hit_rate()
    }
}

#[derive(Debug, Clone, Default)]
struct ReqBlocks {
    blocks: Vec<u32>,
    /// Leading blocks already recorded in the cache map.
    num_cached: usize,
    /// Bumped when the table is released, so stale [`KvHandle`]s stop matching.
    generation: u32,
}

/// A cheap reference to a request's block table (no map lookup), valid until the
/// request is freed; a stale handle is detected and the id is looked up instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvHandle {
    idx: u32,
    generation: u32,
}

/// Owns the block pool and every request's block table.
#[derive(Debug, Clone)]
pub struct KvCacheManager {
    block_pool: BlockPool,
    block_size: usize,
    enable_caching: bool,
    /// Request id -> index into `tables`.
    req_to_blocks: FxHashMap<RequestId, u32>,
    /// Block tables; released ones are reused (keeping their capacity).
    tables: Vec<ReqBlocks>,
    free_tables: Vec<u32>,
    stats: PrefixCacheStats,
}

impl KvCacheManager {
    /// `num_blocks` includes the reserved null block 0.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        enable_caching: bool,
    ) -> Result<Self, SchedulerError> {
        if block_size == 0 {
            return Err(SchedulerError::InvalidConfig {
                field: "block_size",
                message: "must be positive".into(),
            });
        }
        Ok(KvCacheManager {
            block_pool: BlockPool::new(num_blocks, enable_caching)?,
            block_size,
            enable_caching,
            req_to_blocks: FxHashMap::default(),
            tables: Vec::new(),
            free_tables: Vec::new(),
            stats: PrefixCacheStats::default(),
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }
    pub fn block_pool(&self) -> &BlockPool {
        &self.block_pool
    }
    pub fn num_free_blocks(&self) -> usize {
        self.block_pool.num_free_blocks()
    }
    pub fn usage(&self) -> f64 {
        self.block_pool.get_usage()
    }
    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }
    /// Number of requests holding a block table.
    pub fn num_requests(&self) -> usize {
        self.req_to_blocks.len()
    }
    /// The request's blocks in logical order (empty when unknown).
    pub fn block_ids(&self, req_id: &str) -> &[u32] {
        self.req_to_blocks
            .get(req_id)
            .map_or(&[], |&i| &self.tables[i as usize].blocks)
    }
    pub fn num_cached_blocks(&self, req_id: &str) -> usize {
        self.req_to_blocks
            .get(req_id)
            .map_or(0, |&i| self.tables[i as usize].num_cached)
    }
    /// A handle on the request's block table, once it has one.
    pub fn handle(&self, req_id: &str) -> Option<KvHandle> {
        self.req_to_blocks.get(req_id).map(|&idx| KvHandle {
            idx,
            generation: self.tables[idx as usize].generation,
        })
    }
    fn resolve(&self, h: KvHandle) -> Option<u32> {
        let t = self.tables.get(h.idx as usize)?;
        (t.generation == h.generation).then_some(h.idx)
    }

    /// Longest cached prefix of full blocks (capped by the last-token rule), and
    /// the tokens it covers; counted in [`PrefixCacheStats`]. Takes `&mut` only to
    /// bring `req.block_hashes` up to date.
    pub fn get_computed_blocks(&mut self, req: &mut Request) -> (Vec<u32>, usize) {
        let (blocks, n) = self.find_cache_hit(req);
        if self.enable_caching {
            self.record_lookup(req.num_tokens(), n);
        }
        (blocks, n)
    }

    /// [`Self::get_computed_blocks`] without touching the stats (the scheduler counts
    /// a lookup only when the request is actually admitted).
    pub(crate) fn find_cache_hit(&mut self, req: &mut Request) -> (Vec<u32>, usize) {
        // Cached tokens are not recomputed, so they would get no prompt logprobs:
        // such a request computes its whole prompt (as vLLM does).
        if !self.enable_caching
            || req.num_tokens() == 0
            || req.sampling_params.prompt_logprobs.is_some()
        {
            return (Vec::new(), 0);
        }
        update_block_hashes(req, self.block_size);
        let max_blocks = (req.num_tokens() - 1) / self.block_size;
        let mut hit = Vec::new();
        for &h in &req.block_hashes[..max_blocks] {
            match self.block_pool.get_cached_block(h) {
                Some(id) => hit.push(id),
                None => break,
            }
        }
        let n = hit.len() * self.block_size;
        (hit, n)
    }

    pub(crate) fn record_lookup(&mut self, num_tokens: usize, num_hit_tokens: usize) {
        self.stats.requests += 1;
        self.stats.queries += num_tokens as u64;
        self.stats.hits += num_hit_tokens as u64;
    }

    /// Blocks for `num_new_tokens` more tokens after `req.num_computed_tokens` plus
    /// the prefix hit `new_computed_blocks` (which it takes references on). Returns
    /// the newly allocated block ids, or `None` with nothing changed when the free
    /// queue is too short.
    pub fn allocate_slots(
        &mut self,
        req: &mut Request,
        num_new_tokens: usize,
        new_computed_blocks: &[u32],
    ) -> Option<Vec<u32>> {
        let idx = self.req_to_blocks.get(req.request_id.as_str()).copied();
        self.allocate_at(idx, req, num_new_tokens, new_computed_blocks)
    }

    /// [`Self::allocate_slots`] for a request whose table `handle` names (no map
    /// lookup: the scheduler's per-step path). `handle` must come from
    /// [`Self::handle`] for this request; a stale one falls back to the id.
    pub fn allocate_slots_with(
        &mut self,
        handle: KvHandle,
        req: &mut Request,
        num_new_tokens: usize,
        new_computed_blocks: &[u32],
    ) -> Option<Vec<u32>> {
        let idx = match self.resolve(handle) {
            Some(i) => Some(i),
            None => self.req_to_blocks.get(req.request_id.as_str()).copied(),
        };
        self.allocate_at(idx, req, num_new_tokens, new_computed_blocks)
    }

    fn allocate_at(
        &mut self,
        idx: Option<u32>,
        req: &mut Request,
        num_new_tokens: usize,
        new_computed_blocks: &[u32],
    ) -> Option<Vec<u32>> {
        let bs = self.block_size;
        let existing = idx.map(|i| &mut self.tables[i as usize]);
        let (num_held, num_cached) = existing
            .as_ref()
            .map_or((0, 0), |r| (r.blocks.len(), r.num_cached));
        let num_computed = req.num_computed_tokens + new_computed_blocks.len() * bs;
        let need_tokens = num_computed + num_new_tokens;
        let num_required = need_tokens.div_ceil(bs);
        let to_alloc = num_required.saturating_sub(num_held + new_computed_blocks.len());
        // Hit blocks nobody holds sit in the free queue: taking them shrinks it.
        let evictable = new_computed_blocks
            .iter()
            .filter(|&&id| self.block_pool.block(id).is_some_and(|b| b.ref_cnt == 0))
            .count();
        if to_alloc + evictable > self.block_pool.num_free_blocks() {
            return None;
        }
        let num_full = if self.enable_caching {
            need_tokens.min(req.num_tokens()) / bs
        } else {
            0
        };
        if to_alloc == 0 && new_computed_blocks.is_empty() && num_full <= num_cached {
            // Nothing to touch, allocate or cache (most decode steps).
            return Some(Vec::new());
        }
        // Validate hit ids before any change so that a bad id changes nothing.
        self.block_pool.touch(new_computed_blocks).ok()?;
        let entry = match existing {
            Some(e) => e,
            None => {
                let i = match self.free_tables.pop() {
                    Some(i) => i,
                    None => {
                        self.tables.push(ReqBlocks::default());
                        (self.tables.len() - 1) as u32
                    }
                };
                self.req_to_blocks.insert(req.request_id.clone(), i);
                &mut self.tables[i as usize]
            }
        };
        entry.blocks.extend_from_slice(new_computed_blocks);
        // Hit blocks are cached already.
        entry.num_cached = entry
            .num_cached
            .max(entry.blocks.len().min(num_computed / bs));
        let start = entry.blocks.len();
        if to_alloc > 0 {
            self.block_pool
                .get_new_blocks_into(to_alloc, &mut entry.blocks)
                .expect("free count checked above");
        }
        let new_blocks = entry.blocks[start..].to_vec();
        if self.enable_caching {
            update_block_hashes(req, bs);
            if num_full > entry.num_cached {
                let r = entry.num_cached..num_full;
                let ctx = StoreContext {
                    tokens: req.all_token_ids(),
                    all_hashes: &req.block_hashes,
                    first_block: r.start,
                    block_size: bs,
                };
                self.block_pool
                    .cache_full_blocks_with(
                        &entry.blocks[r.clone()],
                        &req.block_hashes[r],
                        Some(ctx),
                    )
                    .expect("ids come from the pool and hashes cover full blocks");
                entry.num_cached = num_full;
            }
        }
        Some(new_blocks)
    }

    /// [`Self::free`] for a request preempted with `num_computed_tokens` in the cache:
    /// full blocks past those were cached when allocated (for this step's rows) but
    /// will not be written now, so their hashes are dropped before the blocks go
    /// back, or a later prefix hit would read garbage.
    pub fn free_preempted(&mut self, req_id: &str, num_computed_tokens: usize) {
        if let Some(&i) = self.req_to_blocks.get(req_id) {
            let t = &self.tables[i as usize];
            let first = (num_computed_tokens / self.block_size).min(t.num_cached);
            if t.num_cached > first {
                let ids = t.blocks[first..t.num_cached].to_vec();
                self.block_pool.uncache(&ids);
            }
        }
        self.free(req_id);
    }

    /// Releases every block of the request, tail first. Unknown ids are ignored.
    pub fn free(&mut self, req_id: &str) {
        if let Some(i) = self.req_to_blocks.remove(req_id) {
            let t = &mut self.tables[i as usize];
            self.block_pool
                .free_blocks(t.blocks.iter().rev().copied())
                .expect("a request's blocks are held by it");
            t.blocks.clear();
            t.num_cached = 0;
            t.generation = t.generation.wrapping_add(1);
            self.free_tables.push(i);
        }
    }

    /// Forgets all cached hashes; fails while any block is held.
    pub fn reset_prefix_cache(&mut self) -> Result<(), SchedulerError> {
        self.block_pool.reset_prefix_cache()
    }

    /// Starts (or stops) collecting KV-cache events (see [`crate::kv_events`]).
    pub fn set_kv_events(&mut self, on: bool) {
        self.block_pool.set_kv_events(on);
    }

    /// The KV-cache events since the last call, in order.
    pub fn take_kv_events(&mut self) -> Vec<KvCacheEvent> {
        self.block_pool.take_kv_events()
    }

    /// Pool invariants plus: every block's ref_cnt equals the number of requests
    /// holding it, and no request holds a block twice.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.block_pool.check_invariants()?;
        let mut refs = vec![0u32; self.block_pool.num_blocks()];
        for (id, &i) in &self.req_to_blocks {
            let r = &self.tables[i as usize];
            let mut seen = r.blocks.clone();
            seen.sort_unstable();
            if seen.windows(2).any(|w| w[0] == w[1]) {
                return Err(format!("request {id} holds a block twice"));
            }
            for &b in &r.blocks {
                refs[b as usize] += 1;
            }
        }
        if self.req_to_blocks.len() + self.free_tables.len() != self.tables.len() {
            return Err("block tables leak".into());
        }
        if self
            .free_tables
            .iter()
            .any(|&i| !self.tables[i as usize].blocks.is_empty())
        {
            return Err("a released block table still holds blocks".into());
        }
        for (i, &n) in refs.iter().enumerate().skip(1) {
            let have = self.block_pool.block(i as u32).map_or(0, |b| b.ref_cnt);
            if have != n {
                return Err(format!("block {i}: ref_cnt {have}, held by {n} requests"));
            }
        }
        Ok(())
    }
}
