//! Block hashing for prefix caching, and a small fast hasher for the crate's maps.
//!
//! A full block's hash chains through its parent's hash, so equal hashes mean equal
//! token prefixes (up to 128-bit collisions). The cache salt is an extra key of the
//! first block only: that alone separates whole chains of different tenants.

use pagoda_core::{BlockHash, Request};
use std::hash::{BuildHasherDefault, Hasher};
use xxhash_rust::xxh3::Xxh3;

/// Hash of one full block: xxh3-128 over a tag for the parent (none or its 16 bytes),
/// the token count and ids (little endian) and the optional extra key.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32], extra: Option<&str>) -> BlockHash {
    let mut h = Xxh3::new();
    match parent {
        None => h.update(&[0u8]),
        Some(p) => {
            h.update(&[1u8]);
            h.update(&p.0.to_le_bytes());
        }
    }
    h.update(&(tokens.len() as u64).to_le_bytes());
    // Feed tokens through a stack buffer: one `update` per 64 tokens, not per token.
    let mut buf = [0u8; 256];
    for chunk in tokens.chunks(64) {
        for (dst, t) in buf.chunks_exact_mut(4).zip(chunk) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..chunk.len() * 4]);
    }
    match extra {
        None => h.update(&[0u8]),
        Some(s) => {
            h.update(&[1u8]);
            h.update(&(s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
    }
    BlockHash(h.digest128())
}

/// Extends `req.block_hashes` to cover every full block of its tokens.
pub fn update_block_hashes(req: &mut Request, block_size: usize) {
    if block_size == 0 {
        return;
    }
    let num_full = req.num_tokens() / block_size;
    while req.block_hashes.len() < num_full {
        let i = req.block_hashes.len();
        let parent = i.checked_sub(1).map(|p| req.block_hashes[p]);
        let extra = if i == 0 {
            req.cache_salt.as_deref()
        } else {
            None
        };
        let tokens = &req.all_token_ids()[i * block_size..(i + 1) * block_size];
        let h = hash_block(parent, tokens, extra);
        req.block_hashes.push(h);
    }
}

/// The hashes of every full block of `tokens`, computed from scratch (reference for tests).
pub fn block_hashes_of(tokens: &[u32], block_size: usize, salt: Option<&str>) -> Vec<BlockHash> {
    let mut out: Vec<BlockHash> = Vec::new();
    for (i, block) in tokens.chunks_exact(block_size).enumerate() {
        let extra = if i == 0 { salt } else { None };
        out.push(hash_block(out.last().copied(), block, extra));
    }
    out
}

/// FxHash-style hasher: request ids and block hashes are short, and the maps are
/// never exposed to adversarial keys that could pick collisions (block hashes are
/// already uniform; request ids come from the server, which generates them).
#[derive(Debug, Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.add(i as u64);
        self.add((i >> 64) as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// Build-hasher for `HashMap`s keyed by request ids or block hashes.
pub type FxBuildHasher = BuildHasherDefault<FxHasher>;
/// A `HashMap` with [`FxHasher`].
pub type FxHashMap<K, V> = std::collections::HashMap<K, V, FxBuildHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_core::SamplingParams;

    #[test]
    fn hash_depends_on_parent_tokens_and_extra() {
        let t = [1u32, 2, 3, 4];
        let a = hash_block(None, &t, None);
        assert_eq!(a, hash_block(None, &t, None));
        assert_ne!(a, hash_block(Some(BlockHash(0)), &t, None));
        assert_ne!(a, hash_block(None, &[1, 2, 3, 5], None));
        assert_ne!(a, hash_block(None, &t, Some("salt")));
        assert_ne!(
            hash_block(None, &t, Some("s1")),
            hash_block(None, &t, Some("s2"))
        );
        // A parent of None differs from any explicit parent, including a zero hash.
        assert_ne!(
            hash_block(Some(BlockHash(0)), &t, None),
            hash_block(Some(BlockHash(1)), &t, None)
        );
    }

    // Scenario 33 (test_request_block_hasher): 6 tokens, block 3 -> 2 chained hashes;
    // the salt is an extra key of the first block only.
    #[test]
    fn request_block_hashes_chain_and_salt_first_block_only() {
        let mut r = Request::new(
            "r",
            vec![0, 1, 2, 3, 4, 5, 6],
            SamplingParams::greedy(4).checked(usize::MAX).unwrap(),
            vec![],
        )
        .with_cache_salt(Some("salt1".into()));
        update_block_hashes(&mut r, 3);
        let h0 = hash_block(None, &[0, 1, 2], Some("salt1"));
        let h1 = hash_block(Some(h0), &[3, 4, 5], None);
        assert_eq!(r.block_hashes, vec![h0, h1]);
        r.append_output_token(9);
        r.append_output_token(10);
        update_block_hashes(&mut r, 3);
        assert_eq!(r.block_hashes.len(), 3);
        assert_eq!(r.block_hashes[2], hash_block(Some(h1), &[6, 9, 10], None));
        assert_eq!(
            r.block_hashes,
            block_hashes_of(r.all_token_ids(), 3, Some("salt1"))
        );
    }

    #[test]
    fn long_blocks_hash_every_token() {
        let t: Vec<u32> = (0..300).collect();
        let mut u = t.clone();
        u[299] = 7;
        assert_ne!(hash_block(None, &t, None), hash_block(None, &u, None));
    }
}
