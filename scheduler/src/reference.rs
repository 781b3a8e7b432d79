//! A slow, obviously correct block pool used as the oracle in property tests.
//!
//! Same contract as [`crate::BlockPool`] (null block 0, LRU free queue, lazy eviction,
//! duplicate hashes allowed) but with a `VecDeque` free list searched linearly and a
//! `Vec` of ids per hash, in insertion order.

use pagoda_core::BlockHash;
use std::collections::{HashMap, VecDeque};

#[derive(Debug, Clone, Default)]
pub struct RefBlockPool {
    pub ref_cnt: Vec<u32>,
    pub hash: Vec<Option<BlockHash>>,
    pub free: VecDeque<u32>,
    pub cached: HashMap<BlockHash, Vec<u32>>,
}

impl RefBlockPool {
    pub fn new(num_blocks: usize) -> Self {
        RefBlockPool {
            ref_cnt: vec![0; num_blocks],
            hash: vec![None; num_blocks],
            free: (1..num_blocks as u32).collect(),
            cached: HashMap::new(),
        }
    }

    /// None when fewer than `n` are free (nothing changes).
    pub fn get_new_blocks(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        let mut out = Vec::new();
        for _ in 0..n {
            let id = self.free.pop_front().unwrap();
            if let Some(h) = self.hash[id as usize].take() {
                let v = self.cached.get_mut(&h).unwrap();
                v.retain(|&x| x != id);
                if v.is_empty() {
                    self.cached.remove(&h);
                }
            }
            self.ref_cnt[id as usize] = 1;
            out.push(id);
        }
        Some(out)
    }

    pub fn get_cached_block(&self, h: BlockHash) -> Option<u32> {
        self.cached.get(&h).and_then(|v| v.first().copied())
    }

    pub fn touch(&mut self, ids: &[u32]) {
        for &id in ids {
            if self.ref_cnt[id as usize] == 0 {
                let pos = self.free.iter().position(|&x| x == id).unwrap();
                self.free.remove(pos);
            }
            self.ref_cnt[id as usize] += 1;
        }
    }

    pub fn free_blocks(&mut self, ids: &[u32]) {
        for &id in ids {
            self.ref_cnt[id as usize] -= 1;
            if self.ref_cnt[id as usize] == 0 {
                self.free.push_back(id);
            }
        }
    }

    pub fn cache_full_blocks(&mut self, ids: &[u32], hashes: &[BlockHash]) {
        for (&id, &h) in ids.iter().zip(hashes) {
            if self.hash[id as usize].is_none() {
                self.hash[id as usize] = Some(h);
                self.cached.entry(h).or_default().push(id);
            }
        }
    }

    /// False (and no change) while any block is held.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.free.len() + 1 != self.ref_cnt.len() {
            return false;
        }
        self.cached.clear();
        self.hash.iter_mut().for_each(|h| *h = None);
        true
    }
}
