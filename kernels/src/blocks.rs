//! Walking a paged KV cache: [`StepBlocks`], the part of a step's batch that a CPU
//! attention kernel keeps after `plan` (the block table and sequence lengths,
//! copied into reused buffers, and the largest block id, so that `run` checks a
//! layer's pool with one comparison), and [`slot`], a position's row in the pool.
//! Shared by the `paged` and `flash` backends. Plain slices, so this crate needs
//! no attention types: a backend passes its `BatchDescriptor`'s fields.

/// The pool row (`block * block_size + offset`) holding position `pos` of a
/// sequence whose physical blocks are `blocks`.
#[inline(always)]
pub fn slot(blocks: &[u32], block_size: usize, pos: usize) -> usize {
    blocks[pos / block_size] as usize * block_size + pos % block_size
}

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
    /// Copies a batch's block table (row-major, `stride` entries per request) and
    /// sequence lengths, reusing this value's allocations. Only the blocks that hold
    /// positions (`seq_lens[r].div_ceil(block_size)` per request) count for
    /// [`StepBlocks::max_block`].
    pub fn copy_from(
        &mut self,
        block_size: usize,
        block_table: &[u32],
        stride: usize,
        seq_lens: &[u32],
    ) {
        self.stride = stride;
        self.block_table.clear();
        self.block_table.extend_from_slice(block_table);
        self.seq_lens.clear();
        self.seq_lens.extend_from_slice(seq_lens);
        self.max_block = (0..seq_lens.len())
            .flat_map(|r| self.blocks(r, block_size).iter().copied())
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
        // Two requests of 5 and 3 positions, block size 4, stride 2 (the second
        // row's padding entry is not a block in use).
        let mut s = StepBlocks::default();
        s.copy_from(4, &[7, 2, 9, 99], 2, &[5, 3]);
        assert_eq!(s.blocks(0, 4), &[7, 2]);
        assert_eq!(s.blocks(1, 4), &[9]);
        assert_eq!(s.max_block, Some(9));
        assert_eq!(s.out_of_range(10), None);
        assert_eq!(s.out_of_range(9), Some(9));
        // A second step reuses the buffers and forgets the first.
        s.copy_from(4, &[0], 1, &[1]);
        assert_eq!((s.blocks(0, 4), s.max_block), (&[0u32][..], Some(0)));
        assert_eq!(slot(&[7, 2], 4, 5), 2 * 4 + 1);
    }
}
