//! KV-cache events against the pool they describe: a consumer that applies them
//! as a router does (add on `BlockStored`, delete on `BlockRemoved`, forget all on
//! `AllBlocksCleared`) must always hold exactly the pool's cached hashes, and
//! every stored event must be self-consistent (its token ids hash, chained from
//! its parent, to its block hashes), over prefix-cache workloads with evictions,
//! preemptions and resets.

mod common;

use pagoda_core::{BlockHash, Request};
use pagoda_scheduler::{hash_block, KvCacheEvent, KvCacheManager};
use proptest::prelude::*;
use std::collections::HashSet;

const BS: usize = 4;

/// A greedy request of 16 output tokens (the shared helper).
fn req(id: &str, tokens: Vec<u32>) -> Request {
    common::greedy_req(id, tokens, 16)
}

/// A router's view of one engine's cache, built only from the events.
#[derive(Default)]
struct Consumer {
    hashes: HashSet<BlockHash>,
}

impl Consumer {
    fn apply(&mut self, events: Vec<KvCacheEvent>) -> Result<(), TestCaseError> {
        for e in events {
            match e {
                KvCacheEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                } => {
                    prop_assert_eq!(block_size, BS);
                    prop_assert_eq!(token_ids.len(), block_hashes.len() * BS);
                    let mut parent = parent_block_hash;
                    for (h, toks) in block_hashes.iter().zip(token_ids.chunks(BS)) {
                        prop_assert_eq!(*h, hash_block(parent, toks, None));
                        parent = Some(*h);
                        prop_assert!(self.hashes.insert(*h), "stored twice: {:?}", h);
                    }
                }
                KvCacheEvent::BlockRemoved { block_hashes } => {
                    for h in block_hashes {
                        prop_assert!(self.hashes.remove(&h), "removed unstored: {:?}", h);
                    }
                }
                KvCacheEvent::AllBlocksCleared => self.hashes.clear(),
            }
        }
        Ok(())
    }

    fn agrees(&self, m: &KvCacheManager) -> Result<(), TestCaseError> {
        let pool = m.block_pool();
        prop_assert_eq!(self.hashes.len(), pool.num_cached_hashes());
        for h in &self.hashes {
            prop_assert!(pool.get_cached_block(*h).is_some(), "{:?} not cached", h);
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Admit a request: tenant prefix `tenant`, then `suffix` own tokens.
    Admit {
        tenant: u8,
        prefix_blocks: u8,
        suffix: u8,
    },
    /// Free the oldest running request.
    Free,
    /// Preempt the newest running request after `computed` tokens.
    Preempt { computed: u8 },
    /// Reset the prefix cache (only succeeds when nothing runs).
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, 0u8..4, 0u8..9).prop_map(|(tenant, prefix_blocks, suffix)| Op::Admit {
            tenant,
            prefix_blocks,
            suffix
        }),
        3 => Just(Op::Free),
        1 => (0u8..20).prop_map(|computed| Op::Preempt { computed }),
        1 => Just(Op::Reset),
    ]
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    // 12 usable blocks of 4 tokens: small enough that tenants evict each other.
    let mut m = KvCacheManager::new(13, BS, true).unwrap();
    m.set_kv_events(true);
    let mut c = Consumer::default();
    let mut running: Vec<String> = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Admit {
                tenant,
                prefix_blocks,
                suffix,
            } => {
                let mut tokens: Vec<u32> = (0..prefix_blocks as u32 * BS as u32)
                    .map(|t| 1000 * tenant as u32 + t)
                    .collect();
                tokens.extend((0..suffix as u32 + 1).map(|t| 100_000 + 100 * i as u32 + t));
                let id = format!("r{i}");
                let mut r = req(&id, tokens);
                let (hit, n) = m.get_computed_blocks(&mut r);
                if {
                    let k = r.num_tokens() - n;
                    m.allocate_slots(&mut r, k, &hit)
                }
                .is_some()
                {
                    r.num_computed_tokens = r.num_tokens();
                    running.push(id);
                }
            }
            Op::Free => {
                if !running.is_empty() {
                    m.free(&running.remove(0));
                }
            }
            Op::Preempt { computed } => {
                if let Some(id) = running.pop() {
                    m.free_preempted(&id, computed as usize);
                }
            }
            Op::Reset => {
                let _ = m.reset_prefix_cache();
            }
        }
        c.apply(m.take_kv_events())?;
        c.agrees(&m)?;
        prop_assert!(m.check_invariants().is_ok());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn events_track_the_pool(ops in prop::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}

/// The named cases: a store, an eviction by a later tenant, and a reset.
#[test]
fn store_evict_and_reset_send_their_events() {
    let mut m = KvCacheManager::new(4, BS, true).unwrap(); // 3 usable blocks
    m.set_kv_events(true);
    let mut a = req("a", (0..9).collect()); // 2 full blocks + 1 token
    let (hit, n) = m.get_computed_blocks(&mut a);
    {
        let k = a.num_tokens() - n;
        m.allocate_slots(&mut a, k, &hit)
    }
    .unwrap();
    let ev = m.take_kv_events();
    assert!(
        matches!(&ev[..], [KvCacheEvent::BlockStored { block_hashes, parent_block_hash: None, .. }]
                 if block_hashes.len() == 2),
        "{ev:?}"
    );
    m.free("a");
    assert!(m.take_kv_events().is_empty(), "freeing keeps hashes cached");
    // Another prompt needs all 3 blocks: the two cached ones are evicted.
    let mut b = req("b", (50..59).collect());
    let (hit, n) = m.get_computed_blocks(&mut b);
    {
        let k = b.num_tokens() - n;
        m.allocate_slots(&mut b, k, &hit)
    }
    .unwrap();
    let ev = m.take_kv_events();
    let removed: usize = ev
        .iter()
        .map(|e| match e {
            KvCacheEvent::BlockRemoved { block_hashes } => block_hashes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(removed, 2, "{ev:?}");
    assert!(
        matches!(ev.last(), Some(KvCacheEvent::BlockStored { .. })),
        "{ev:?}"
    );
    assert!(m.reset_prefix_cache().is_err(), "b still runs");
    m.free("b");
    m.reset_prefix_cache().unwrap();
    assert_eq!(m.take_kv_events(), vec![KvCacheEvent::AllBlocksCleared]);
}
