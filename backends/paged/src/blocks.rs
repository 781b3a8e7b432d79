//! The part of a step's [`BatchDescriptor`] that a CPU kernel keeps after `plan`:
//! the block table and sequence lengths, copied into reused buffers, and the
//! largest block id, so that `run` checks a layer's pool with one comparison.
//! Shared by `paged` and `flash`.

use pagoda_core::BatchDescriptor;

/// A step's block table, copied by `plan`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StepBlocks {
    /// Row-major `[num_reqs, stride]`, as in the batch.
    pub block_table: Vec<u32>,
    pub stride: usize,
    pub seq_lens: Vec<u32>,
    /// Largest block id any request uses (`None` for a batch with no blocks).
    pub max_block: Option<u32>,
}

impl StepBlocks {
    /// Copies `b`'s table and lengths, reusing this value's allocations.
    pub fn copy_from(&mut self, b: &BatchDescriptor) {
        self.stride = b.block_table_stride;
        self.block_table.clear();
        self.block_table.extend_from_slice(&b.block_table);
        self.seq_lens.clear();
        self.seq_lens.extend_from_slice(&b.seq_lens);
        self.max_block = (0..b.num_reqs())
            .flat_map(|r| b.blocks(r).iter().copied())
            .max();
    }

    /// The physical blocks that hold request `r`'s `seq_lens[r]` positions.
    pub fn blocks(&self, r: usize, block_size: usize) -> &[u32] {
        let n = (self.seq_lens[r] as usize).div_ceil(block_size);
        &self.block_table[r * self.stride..r * self.stride + n]
    }

    /// The largest block id, if it is out of range for a pool of `num_blocks`.
    pub fn out_of_range(&self, num_blocks: usize) -> Option<u32> {
        self.max_block.filter(|&b| b as usize >= num_blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_the_table_and_finds_the_largest_block() {
        let b = BatchDescriptor::new(4, &[1, 3], &[5, 3], &[&[7, 2], &[9]]).unwrap();
        let mut s = StepBlocks::default();
        s.copy_from(&b);
        assert_eq!(s.blocks(0, 4), &[7, 2]);
        assert_eq!(s.blocks(1, 4), &[9]);
        assert_eq!(s.max_block, Some(9));
        assert_eq!(s.out_of_range(10), None);
        assert_eq!(s.out_of_range(9), Some(9));
        // A second step reuses the buffers and forgets the first.
        s.copy_from(&BatchDescriptor::new(4, &[1], &[1], &[&[0]]).unwrap());
        assert_eq!((s.blocks(0, 4), s.max_block), (&[0u32][..], Some(0)));
    }
}
