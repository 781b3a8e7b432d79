//! The paged KV cache: its shape ([`KvCacheSpec`]), its storage ([`KvCache`]) and the
//! write of new K/V rows by slot mapping ([`write_kv`], vLLM's `reshape_and_cache`).
//!
//! Layout (the flash family's NHD): per layer one K pool and one V pool, each
//! `[num_blocks, block_size, num_kv_heads, head_dim]`, row-major f32. A slot is
//! `block_id * block_size + offset`, so a slot addresses one
//! `[num_kv_heads, head_dim]` row of a pool.

use crate::CoreError;

/// Shape of the paged KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheSpec {
    pub num_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvCacheSpec {
    /// f32 elements in one slot (one token's K, or its V, for one layer).
    pub fn slot_elems(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
    /// f32 elements in one pool (K or V) of one layer.
    pub fn pool_elems(&self) -> usize {
        self.num_blocks * self.block_size * self.slot_elems()
    }
    /// Bytes one block takes across all layers, K and V.
    pub fn bytes_per_block(&self) -> usize {
        2 * self.num_layers * self.block_size * self.slot_elems() * std::mem::size_of::<f32>()
    }
    /// How many blocks fit in `bytes`.
    pub fn num_blocks_for_bytes(&self, bytes: usize) -> usize {
        bytes / self.bytes_per_block().max(1)
    }
}

/// K and V pools of one layer.
#[derive(Debug, Clone)]
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// The whole cache, one [`LayerKv`] per layer.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub spec: KvCacheSpec,
    pub layers: Vec<LayerKv>,
}

impl KvCache {
    /// Allocates a zeroed cache.
    pub fn new(spec: KvCacheSpec) -> Self {
        Self::filled(spec, 0.0)
    }

    /// Allocates a cache with every element set to `value` (tests use NaN so that a
    /// stray read of an unwritten slot poisons the result).
    pub fn filled(spec: KvCacheSpec, value: f32) -> Self {
        let n = spec.pool_elems();
        let layers = (0..spec.num_layers)
            .map(|_| LayerKv {
                k: vec![value; n],
                v: vec![value; n],
            })
            .collect();
        KvCache { spec, layers }
    }
}

/// Writes `k`/`v` (`[num_tokens, num_kv_heads, head_dim]`) into the pools at
/// `slot_mapping[t]`; negative slots (padding) are skipped.
pub fn write_kv(
    k_pool: &mut [f32],
    v_pool: &mut [f32],
    k: &[f32],
    v: &[f32],
    slot_mapping: &[i64],
    slot_elems: usize,
) -> Result<(), CoreError> {
    let n = slot_mapping.len();
    if k.len() != n * slot_elems {
        return Err(CoreError::ShapeMismatch {
            name: "k",
            expected: n * slot_elems,
            actual: k.len(),
        });
    }
    if v.len() != n * slot_elems {
        return Err(CoreError::ShapeMismatch {
            name: "v",
            expected: n * slot_elems,
            actual: v.len(),
        });
    }
    let num_slots = k_pool.len() / slot_elems.max(1);
    for (t, &slot) in slot_mapping.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let slot = slot as usize;
        if slot >= num_slots {
            return Err(CoreError::InvalidBatch {
                message: format!("slot {slot} out of range for a cache of {num_slots} slots"),
            });
        }
        let dst = slot * slot_elems..(slot + 1) * slot_elems;
        let src = t * slot_elems..(t + 1) * slot_elems;
        k_pool[dst.clone()].copy_from_slice(&k[src.clone()]);
        v_pool[dst].copy_from_slice(&v[src]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// vLLM's test_reshape_and_cache: random unique slots; cache[slot] equals the written row.
        #[test]
        fn write_kv_places_rows_at_their_slots(
            num_blocks in 1usize..8, block_size in 1usize..5, heads in 1usize..3, dim in 1usize..5,
            seed in any::<u64>(),
        ) {
            let slot_elems = heads * dim;
            let total = num_blocks * block_size;
            // A deterministic shuffle of all slots; use some of them, plus one padding slot.
            let mut slots: Vec<i64> = (0..total as i64).collect();
            let mut s = seed | 1;
            for i in (1..slots.len()).rev() {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                slots.swap(i, (s % (i as u64 + 1)) as usize);
            }
            slots.truncate(total.div_ceil(2));
            slots.push(-1);
            let n = slots.len();
            let k: Vec<f32> = (0..n * slot_elems).map(|i| i as f32).collect();
            let v: Vec<f32> = (0..n * slot_elems).map(|i| -(i as f32)).collect();
            let mut kp = vec![f32::NAN; total * slot_elems];
            let mut vp = vec![f32::NAN; total * slot_elems];
            write_kv(&mut kp, &mut vp, &k, &v, &slots, slot_elems).unwrap();
            for (t, &slot) in slots.iter().enumerate() {
                if slot < 0 { continue; }
                let s = slot as usize;
                prop_assert_eq!(&kp[s * slot_elems..(s + 1) * slot_elems], &k[t * slot_elems..(t + 1) * slot_elems]);
                prop_assert_eq!(&vp[s * slot_elems..(s + 1) * slot_elems], &v[t * slot_elems..(t + 1) * slot_elems]);
            }
            let written = slots.iter().filter(|s| **s >= 0).count();
            prop_assert_eq!(kp.iter().filter(|x| x.is_nan()).count(), (total - written) * slot_elems);
        }
    }

    #[test]
    fn out_of_range_slot_is_an_error() {
        let mut kp = vec![0.0; 4];
        let mut vp = vec![0.0; 4];
        let e = write_kv(&mut kp, &mut vp, &[1.0, 2.0], &[1.0, 2.0], &[2], 2).unwrap_err();
        assert!(matches!(e, CoreError::InvalidBatch { .. }));
    }
}
