//! vLLM V1 prefix-caching scenarios (tests/v1/core/test_prefix_caching.py), re-expressed.
//!
//! Block ids match vLLM's exactly because Pagoda also reserves block 0 as the null
//! block: `KvCacheManager::new(11, 16, ..)` has the 10 usable blocks 1..=10.

mod common;

use pagoda_core::Request;
use pagoda_scheduler::{
    hash_block, KvCacheManager, PrefixCacheMetrics, PrefixCacheStats, SchedulerError,
};

/// A greedy request of 16 output tokens (the shared helper).
fn req(id: &str, tokens: Vec<u32>) -> Request {
    common::greedy_req(id, tokens, 16)
}

/// Mimics the scheduler's admission: lookup, allocate the rest, mark computed.
fn admit(m: &mut KvCacheManager, r: &mut Request) -> (Vec<u32>, usize, Vec<u32>) {
    let (hit, n) = m.get_computed_blocks(r);
    let new = m.allocate_slots(r, r.num_tokens() - n, &hit).expect("fits");
    r.num_computed_tokens = r.num_tokens();
    (hit, n, new)
}

fn ref_cnts(m: &KvCacheManager, ids: &[u32]) -> Vec<u32> {
    ids.iter()
        .map(|&i| m.block_pool().block(i).unwrap().ref_cnt)
        .collect()
}

// Scenario 20 (test_prefill).
#[test]
fn prefill_hits_and_lru_free_order() {
    let mut m = KvCacheManager::new(11, 16, true).unwrap();
    let common: Vec<u32> = (0..48).collect();
    let mut t0 = common.clone();
    t0.extend([100, 101, 102, 103, 104, 105, 106]); // 55 tokens
    let mut r0 = req("0", t0);
    let (hit, n, new) = admit(&mut m, &mut r0);
    assert_eq!((hit, n), (vec![], 0));
    assert_eq!(new, vec![1, 2, 3, 4]);
    // Blocks 1-3 are hashed with the chain; block 4 (7 tokens) is not.
    let h1 = hash_block(None, &common[..16], None);
    let h2 = hash_block(Some(h1), &common[16..32], None);
    let h3 = hash_block(Some(h2), &common[32..48], None);
    let hashes: Vec<_> = (1..=4)
        .map(|i| m.block_pool().block(i).unwrap().block_hash)
        .collect();
    assert_eq!(hashes, vec![Some(h1), Some(h2), Some(h3), None]);

    let mut t1 = common.clone();
    t1.extend([200, 201, 202, 203, 204]); // 53 tokens
    let mut r1 = req("1", t1);
    let (hit, n, new) = admit(&mut m, &mut r1);
    assert_eq!((hit.clone(), n, new), (vec![1, 2, 3], 48, vec![5]));
    assert_eq!(ref_cnts(&m, &hit), vec![2, 2, 2]);
    assert_eq!(
        m.stats(),
        PrefixCacheStats {
            requests: 2,
            queries: 108,
            hits: 48
        }
    );

    m.free("0");
    m.free("1");
    assert_eq!(
        m.block_pool().free_block_ids(),
        vec![6, 7, 8, 9, 10, 4, 5, 3, 2, 1]
    );

    let mut t2 = common.clone();
    t2.extend([300, 301, 302]);
    let mut r2 = req("2", t2);
    let (hit, _, new) = admit(&mut m, &mut r2);
    assert_eq!((hit, new), (vec![1, 2, 3], vec![6]));
    m.free("2");

    let mut r3 = req("3", (1000..1160).collect());
    let (hit, _, new) = admit(&mut m, &mut r3);
    assert!(hit.is_empty());
    assert_eq!(new, vec![7, 8, 9, 10, 4, 5, 6, 3, 2, 1]);
    assert_eq!(m.num_free_blocks(), 0);
    m.check_invariants().unwrap();
}

// Scenario 21 (test_decode).
#[test]
fn decode_allocates_only_when_a_block_fills() {
    let mut m = KvCacheManager::new(11, 16, true).unwrap();
    let mut r = req("0", (0..55).collect());
    let (_, _, new) = admit(&mut m, &mut r);
    assert_eq!(new, vec![1, 2, 3, 4]);
    for t in 0..4 {
        r.append_output_token(500 + t);
        let new = m.allocate_slots(&mut r, 1, &[]).unwrap();
        r.num_computed_tokens += 1;
        assert!(new.is_empty());
    }
    assert_eq!(m.block_pool().block(4).unwrap().block_hash, None);
    for t in 0..19 {
        r.append_output_token(600 + t);
        let new = m.allocate_slots(&mut r, 1, &[]).unwrap();
        r.num_computed_tokens += 1;
        if r.num_computed_tokens == 65 {
            assert_eq!(new, vec![5]);
        } else {
            assert!(new.is_empty(), "at {}", r.num_computed_tokens);
        }
    }
    assert_eq!(m.block_ids("0"), &[1, 2, 3, 4, 5]);
    assert!(m.block_pool().block(4).unwrap().block_hash.is_some());
    assert_eq!(m.block_pool().block(5).unwrap().block_hash, None);
    m.check_invariants().unwrap();
}

// Scenario 22 (test_evict).
#[test]
fn evict_order_follows_reverse_frees() {
    let mut m = KvCacheManager::new(11, 16, true).unwrap();
    let mut r0 = req("0", (0..87).collect());
    assert_eq!(admit(&mut m, &mut r0).2, vec![1, 2, 3, 4, 5, 6]);
    let mut r1 = req("1", (87..135).collect());
    assert_eq!(admit(&mut m, &mut r1).2, vec![7, 8, 9]);
    m.free("0");
    m.free("1");
    assert_eq!(
        m.block_pool().free_block_ids(),
        vec![10, 6, 5, 4, 3, 2, 1, 9, 8, 7]
    );
    let mut t: Vec<u32> = (0..32).collect();
    t.extend(200..203);
    let mut r2 = req("2", t);
    let (hit, n, new) = admit(&mut m, &mut r2);
    assert_eq!((hit, n, new), (vec![1, 2], 32, vec![10]));
    assert_eq!(m.num_free_blocks(), 7);
    m.check_invariants().unwrap();
}

// Scenario 23 (test_hash_block_correct_reuse).
#[test]
fn reused_cached_block_loses_its_hash() {
    let mut m = KvCacheManager::new(2, 16, true).unwrap();
    let mut r0 = req("0", (0..16).collect());
    let (_, _, new) = admit(&mut m, &mut r0);
    assert_eq!(new, vec![1]);
    r0.append_output_token(7); // needs no block until the next allocate
    assert!(m.block_pool().block(1).unwrap().block_hash.is_some());
    m.free("0");
    let mut r1 = req("1", (100..115).collect());
    let (_, _, new) = admit(&mut m, &mut r1);
    assert_eq!(new, vec![1]);
    assert_eq!(m.block_pool().block(1).unwrap().block_hash, None);
    assert_eq!(m.block_pool().num_cached_hashes(), 0);
}

// Scenario 24 (test_computed_blocks_not_evicted).
#[test]
fn touched_hits_are_not_evicted() {
    let mut m = KvCacheManager::new(3, 16, true).unwrap();
    let mut r0 = req("0", (0..16).collect());
    assert_eq!(admit(&mut m, &mut r0).2, vec![1]);
    let mut r1 = req("1", (16..32).collect());
    assert_eq!(admit(&mut m, &mut r1).2, vec![2]);
    m.free("0");
    m.free("1");
    let mut t: Vec<u32> = (0..16).collect();
    t.extend(100..116);
    let mut r2 = req("2", t);
    let (hit, n, new) = admit(&mut m, &mut r2);
    assert_eq!((hit, n, new), (vec![1], 16, vec![2]));
    assert_eq!(
        m.block_pool().block(2).unwrap().block_hash,
        Some(r2.block_hashes[1])
    );
    m.check_invariants().unwrap();
}

// Scenario 25 (test_prefill_not_enough_free_blocks_with_computed_blocks).
#[test]
fn failed_allocation_changes_nothing() {
    let mut m = KvCacheManager::new(11, 16, true).unwrap();
    let common: Vec<u32> = (0..48).collect();
    let mut r0 = req("0", common.clone());
    admit(&mut m, &mut r0);
    m.free("0"); // blocks 1..3 cached, ref 0
    let mut r1 = req("1", (500..596).collect()); // 6 blocks
    admit(&mut m, &mut r1);
    // 4 free blocks: 3 of them cached hits. A 48-token hit + 32 new tokens needs the
    // 3 hits (taken from the free queue) plus 2 new: 5 > 4.
    let mut t = common.clone();
    t.extend(700..733);
    let mut r2 = req("2", t);
    let (hit, n) = m.get_computed_blocks(&mut r2);
    assert_eq!(
        (hit.clone(), n),
        (vec![3, 2, 1].into_iter().rev().collect::<Vec<_>>(), 48)
    );
    let before = ref_cnts(&m, &[1, 2, 3]);
    let free_before = m.block_pool().free_block_ids();
    assert!(m.allocate_slots(&mut r2, 33, &hit).is_none());
    assert_eq!(ref_cnts(&m, &[1, 2, 3]), before);
    assert_eq!(m.block_pool().free_block_ids(), free_before);
    assert!(m.block_ids("2").is_empty());
    // One token fewer fits exactly (3 hits + 1 new == 4 free).
    assert_eq!(m.allocate_slots(&mut r2, 16, &hit), Some(vec![10]));
    m.check_invariants().unwrap();
}

// Scenario 26 (test_basic_prefix_caching_disabled).
#[test]
fn caching_disabled_never_hits() {
    let mut m = KvCacheManager::new(5, 16, false).unwrap();
    let mut r0 = req("0", (0..20).collect());
    assert_eq!(admit(&mut m, &mut r0), (vec![], 0, vec![1, 2]));
    m.free("0");
    let mut r1 = req("1", (0..20).collect());
    assert_eq!(admit(&mut m, &mut r1), (vec![], 0, vec![3, 4]));
    // Blocks 1 and 2 are free again but hold nothing reusable; 40 tokens need 3.
    let mut r2 = req("2", (0..40).collect());
    let (hit, n) = m.get_computed_blocks(&mut r2);
    assert_eq!((hit.len(), n), (0, 0));
    assert!(m.allocate_slots(&mut r2, 40, &[]).is_none());
    // Freed tail first: block 2 then block 1.
    assert_eq!(m.allocate_slots(&mut r2, 32, &[]), Some(vec![2, 1]));
    assert_eq!(m.stats(), PrefixCacheStats::default());
}

// Scenario 27 (test_cache_key_salting).
#[test]
fn cache_salt_separates_tenants() {
    let mut m = KvCacheManager::new(11, 16, true).unwrap();
    let t: Vec<u32> = (0..55).collect();
    let mut r0 = req("0", t.clone()).with_cache_salt(Some("salt1".into()));
    admit(&mut m, &mut r0);
    assert_eq!(
        r0.block_hashes[0],
        hash_block(None, &t[..16], Some("salt1"))
    );
    assert_eq!(
        r0.block_hashes[1],
        hash_block(Some(r0.block_hashes[0]), &t[16..32], None)
    );
    let mut same = req("1", t.clone()).with_cache_salt(Some("salt1".into()));
    assert_eq!(m.get_computed_blocks(&mut same).0, vec![1, 2, 3]);
    let mut other = req("2", t.clone()).with_cache_salt(Some("salt2".into()));
    assert_eq!(m.get_computed_blocks(&mut other).1, 0);
    let mut none = req("3", t);
    assert_eq!(m.get_computed_blocks(&mut none).1, 0);
}

// Scenario 28 (test_reset_prefix_cache).
#[test]
fn reset_prefix_cache_needs_all_blocks_free() {
    let mut m = KvCacheManager::new(11, 16, true).unwrap();
    let mut r0 = req("0", (0..40).collect());
    admit(&mut m, &mut r0);
    assert_eq!(
        m.reset_prefix_cache(),
        Err(SchedulerError::PrefixCacheInUse { num_used_blocks: 3 })
    );
    m.free("0");
    m.reset_prefix_cache().unwrap();
    assert_eq!(m.block_pool().num_cached_hashes(), 0);
    assert!((1..11).all(|i| m.block_pool().block(i).unwrap().block_hash.is_none()));
    let mut r1 = req("1", (0..40).collect());
    assert_eq!(m.get_computed_blocks(&mut r1).1, 0);
}

// Scenario 34 (test_metrics): a window of 5 requests.
#[test]
fn hit_rate_window_drops_oldest_observations() {
    let mut w = PrefixCacheMetrics::new(5);
    w.observe(PrefixCacheStats {
        requests: 1,
        queries: 20,
        hits: 9,
    });
    assert!((w.hit_rate() - 0.45).abs() < 1e-12);
    w.observe(PrefixCacheStats {
        requests: 4,
        queries: 80,
        hits: 16,
    });
    assert!((w.hit_rate() - 0.25).abs() < 1e-12);
    w.observe(PrefixCacheStats {
        requests: 1,
        queries: 10,
        hits: 2,
    });
    assert!((w.hit_rate() - 0.2).abs() < 1e-12);
}

// The last-token rule: a fully cached prompt still recomputes its last block.
#[test]
fn prompt_never_fully_hits() {
    let mut m = KvCacheManager::new(11, 16, true).unwrap();
    let mut r0 = req("0", (0..48).collect());
    admit(&mut m, &mut r0);
    let mut r1 = req("1", (0..48).collect());
    let (hit, n) = m.get_computed_blocks(&mut r1);
    assert_eq!((hit, n), (vec![1, 2], 32));
    let mut r2 = req("2", (0..49).collect());
    assert_eq!(m.get_computed_blocks(&mut r2).1, 48);
}

// A handle goes stale when its request is freed, even if the table is reused.
#[test]
fn stale_handles_fall_back_to_the_id() {
    let mut m = KvCacheManager::new(11, 16, true).unwrap();
    let mut a = req("a", (0..20).collect());
    admit(&mut m, &mut a);
    let ha = m.handle("a").unwrap();
    m.free("a");
    let mut b = req("b", (100..120).collect());
    admit(&mut m, &mut b);
    let hb = m.handle("b").unwrap();
    assert_ne!(ha, hb);
    // "a" comes back with the stale handle: it must not touch "b"'s table.
    let mut a2 = req("a", (200..230).collect());
    assert_eq!(
        m.allocate_slots_with(ha, &mut a2, 30, &[]).map(|v| v.len()),
        Some(2)
    );
    assert_eq!(m.block_ids("b").len(), 2);
    assert_eq!(m.block_ids("a").len(), 2);
    b.append_output_token(1);
    b.num_computed_tokens = 20;
    assert_eq!(m.allocate_slots_with(hb, &mut b, 1, &[]), Some(vec![]));
    m.check_invariants().unwrap();
}
