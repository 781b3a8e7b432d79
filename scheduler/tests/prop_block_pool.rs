//! Property tests: the block pool against the slow reference pool, and the KV cache
//! manager under random request workloads against a model of who holds what.

use pagoda_core::{BlockHash, Request, SamplingParams};
use pagoda_scheduler::reference::RefBlockPool;
use pagoda_scheduler::{BlockPool, KvCacheManager};
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Debug, Clone)]
enum PoolOp {
    Alloc(usize),
    Touch(usize),
    Free(usize, usize),
    Cache(usize, u8),
    Reset,
}

fn pool_op() -> impl Strategy<Value = PoolOp> {
    prop_oneof![
        3 => (0usize..6).prop_map(PoolOp::Alloc),
        2 => any::<usize>().prop_map(PoolOp::Touch),
        3 => (any::<usize>(), 1usize..5).prop_map(|(a, b)| PoolOp::Free(a, b)),
        3 => (any::<usize>(), 0u8..6).prop_map(|(a, b)| PoolOp::Cache(a, b)),
        1 => Just(PoolOp::Reset),
    ]
}

fn same(p: &BlockPool, r: &RefBlockPool) -> Result<(), TestCaseError> {
    p.check_invariants().map_err(TestCaseError::fail)?;
    prop_assert_eq!(
        p.free_block_ids(),
        r.free.iter().copied().collect::<Vec<_>>()
    );
    for id in 1..p.num_blocks() as u32 {
        let b = p.block(id).unwrap();
        prop_assert_eq!(b.ref_cnt, r.ref_cnt[id as usize], "ref_cnt of {}", id);
        prop_assert_eq!(b.block_hash, r.hash[id as usize], "hash of {}", id);
    }
    prop_assert_eq!(p.num_cached_hashes(), r.cached.len());
    for (h, ids) in &r.cached {
        prop_assert_eq!(&p.cached_block_ids(*h), ids);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn block_pool_matches_reference(num_blocks in 2usize..12, ops in prop::collection::vec(pool_op(), 1..80)) {
        let mut p = BlockPool::new(num_blocks, true).unwrap();
        let mut r = RefBlockPool::new(num_blocks);
        // References we hold, one entry per ref_cnt unit.
        let mut held: Vec<u32> = Vec::new();
        for op in ops {
            match op {
                PoolOp::Alloc(n) => {
                    let got = p.get_new_blocks(n).ok();
                    prop_assert_eq!(&got, &r.get_new_blocks(n));
                    held.extend(got.unwrap_or_default());
                }
                PoolOp::Touch(k) => {
                    let mut keys: Vec<BlockHash> = r.cached.keys().copied().collect();
                    keys.sort();
                    if !keys.is_empty() {
                        let h = keys[k % keys.len()];
                        let id = p.get_cached_block(h);
                        prop_assert_eq!(id, r.get_cached_block(h));
                        let id = id.unwrap();
                        p.touch(&[id]).unwrap();
                        r.touch(&[id]);
                        held.push(id);
                    }
                }
                PoolOp::Free(k, n) => {
                    if !held.is_empty() {
                        let start = k % held.len();
                        let end = (start + n).min(held.len());
                        let ids: Vec<u32> = held.drain(start..end).collect();
                        p.free_blocks(ids.iter().copied()).unwrap();
                        r.free_blocks(&ids);
                    }
                }
                PoolOp::Cache(k, h) => {
                    if !held.is_empty() {
                        let id = held[k % held.len()];
                        p.cache_full_blocks(&[id], &[BlockHash(h as u128)]).unwrap();
                        r.cache_full_blocks(&[id], &[BlockHash(h as u128)]);
                    }
                }
                PoolOp::Reset => {
                    prop_assert_eq!(p.reset_prefix_cache().is_ok(), r.reset_prefix_cache());
                }
            }
            same(&p, &r)?;
        }
        p.free_blocks(held.iter().copied()).unwrap();
        prop_assert_eq!(p.num_free_blocks(), num_blocks - 1);
        p.check_invariants().map_err(TestCaseError::fail)?;
    }
}

#[derive(Debug, Clone)]
enum KvOp {
    /// Admit a request: shared prefix choice, prompt length, salt, first chunk fraction.
    New(usize, usize, bool, u8),
    /// Advance request k: next chunk, or append a token and allocate it.
    Step(usize, u8),
    Free(usize),
    Reset,
}

fn kv_op() -> impl Strategy<Value = KvOp> {
    prop_oneof![
        3 => (0usize..3, 1usize..70, any::<bool>(), any::<u8>()).prop_map(|(a, b, c, d)| KvOp::New(a, b, c, d)),
        6 => (any::<usize>(), any::<u8>()).prop_map(|(a, b)| KvOp::Step(a, b)),
        2 => any::<usize>().prop_map(KvOp::Free),
        1 => Just(KvOp::Reset),
    ]
}

struct ModelReq {
    req: Request,
    blocks: Vec<u32>,
}

/// Pool state that a failed allocation must leave untouched.
fn snapshot(m: &KvCacheManager) -> (Vec<u32>, Vec<(u32, Option<BlockHash>)>) {
    let p = m.block_pool();
    let blocks = (0..p.num_blocks() as u32).map(|i| {
        let b = p.block(i).unwrap();
        (b.ref_cnt, b.block_hash)
    });
    (p.free_block_ids(), blocks.collect())
}

/// Tokens of prefix family `f`: long shared runs so that requests hit each other.
fn family(f: usize, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 1000 * f as u32 + i).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn kv_manager_conserves_blocks(
        num_blocks in 3usize..24,
        bs in prop_oneof![Just(2usize), Just(4), Just(16)],
        caching in any::<bool>(),
        ops in prop::collection::vec(kv_op(), 1..80),
    ) {
        let mut m = KvCacheManager::new(num_blocks, bs, caching).unwrap();
        let mut reqs: Vec<ModelReq> = Vec::new();
        // Token written at each (block, offset) by the request that computed it.
        let mut content: HashMap<(u32, usize), u32> = HashMap::new();
        let mut next_id = 0;
        let mut next_tok = 50_000u32;
        for op in ops {
            match op {
                KvOp::New(f, len, salt, frac) => {
                    let mut toks = family(f, len);
                    if len % 3 == 0 {
                        // Diverge after a shared prefix.
                        toks.push(next_tok);
                        next_tok += 1;
                    }
                    let salt = salt.then(|| "s".to_string());
                    let mut req = Request::new(next_id.to_string(), toks, SamplingParams::greedy(4).checked(usize::MAX).unwrap(), vec![])
                        .with_cache_salt(salt);
                    next_id += 1;
                    let (hit, n) = m.get_computed_blocks(&mut req);
                    prop_assert_eq!(n, hit.len() * bs);
                    prop_assert!(n < req.num_tokens());
                    if !caching {
                        prop_assert_eq!(n, 0);
                    }
                    for (bi, &b) in hit.iter().enumerate() {
                        for off in 0..bs {
                            let want = req.all_token_ids()[bi * bs + off];
                            prop_assert_eq!(content.get(&(b, off)), Some(&want), "hit block {} holds other tokens", b);
                        }
                    }
                    let remaining = req.num_tokens() - n;
                    let chunk = 1 + (frac as usize * remaining) / 256;
                    let before = snapshot(&m);
                    match m.allocate_slots(&mut req, chunk, &hit) {
                        None => {
                            prop_assert_eq!(snapshot(&m), before);
                            prop_assert!(m.block_ids(&req.request_id).is_empty());
                        }
                        Some(new) => {
                            let mut blocks = hit.clone();
                            blocks.extend(&new);
                            prop_assert_eq!(m.block_ids(&req.request_id), &blocks[..]);
                            for p in n..n + chunk {
                                content.insert((blocks[p / bs], p % bs), req.all_token_ids()[p]);
                            }
                            req.num_computed_tokens = n + chunk;
                            reqs.push(ModelReq { req, blocks });
                        }
                    }
                }
                KvOp::Step(k, frac) => {
                    if reqs.is_empty() {
                        continue;
                    }
                    let k = k % reqs.len();
                    let r = &mut reqs[k];
                    if r.req.num_computed_tokens == r.req.num_tokens() {
                        r.req.append_output_token(next_tok % 7);
                        next_tok += 1;
                    }
                    let start = r.req.num_computed_tokens;
                    let remaining = r.req.num_tokens() - start;
                    let chunk = 1 + (frac as usize * remaining) / 256;
                    let before = snapshot(&m);
                    match m.allocate_slots(&mut r.req, chunk, &[]) {
                        None => prop_assert_eq!(snapshot(&m), before),
                        Some(new) => {
                            r.blocks.extend(&new);
                            prop_assert_eq!(m.block_ids(&r.req.request_id), &r.blocks[..]);
                            for p in start..start + chunk {
                                content.insert((r.blocks[p / bs], p % bs), r.req.all_token_ids()[p]);
                            }
                            r.req.num_computed_tokens += chunk;
                        }
                    }
                }
                KvOp::Free(k) => {
                    if !reqs.is_empty() {
                        let r = reqs.swap_remove(k % reqs.len());
                        m.free(&r.req.request_id);
                        prop_assert!(m.block_ids(&r.req.request_id).is_empty());
                    }
                }
                KvOp::Reset => {
                    prop_assert_eq!(m.reset_prefix_cache().is_ok(), reqs.is_empty());
                }
            }
            m.check_invariants().map_err(TestCaseError::fail)?;
            // Ref counts equal the number of model requests holding each block.
            let mut holders = vec![0u32; num_blocks];
            for r in &reqs {
                for &b in &r.blocks {
                    holders[b as usize] += 1;
                }
            }
            for b in 1..num_blocks as u32 {
                prop_assert_eq!(m.block_pool().block(b).unwrap().ref_cnt, holders[b as usize]);
            }
        }
        for r in reqs.drain(..) {
            m.free(&r.req.request_id);
        }
        prop_assert_eq!(m.num_free_blocks(), num_blocks - 1);
        prop_assert_eq!(m.num_requests(), 0);
        m.check_invariants().map_err(TestCaseError::fail)?;
    }
}
