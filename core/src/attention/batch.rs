//! [`BatchDescriptor`]: one engine step's batch, valid by construction.

use crate::CoreError;
use std::ops::Range;

/// One engine step's batch, as the model runner hands it to attention backends.
///
/// Rows are requests; decode rows (query length 1) come first. Token-indexed
/// buffers (`q`, `out`, `slot_mapping`) are laid out by `query_start_loc`.
///
/// **Valid by construction.** The fields are private and every constructor
/// ([`BatchDescriptor::new`], [`BatchDescriptor::rebuild`],
/// [`BatchDescriptor::from_parts`]) checks the whole descriptor, so a backend can
/// trust it without re-checking:
/// * `query_start_loc` has `num_reqs + 1` entries, starts at 0 and strictly
///   increases (every row has at least one token);
/// * `seq_lens[r] >= query_len(r)` (the new tokens are part of the sequence);
/// * the block table is `[num_reqs, block_table_stride]` and each row covers its
///   sequence: `ceil(seq_lens[r] / block_size) <= block_table_stride`;
/// * `slot_mapping` has one entry per token, each `-1` (padding) or exactly the
///   slot its position maps to through the block table;
/// * decode rows (query length 1) come before prefill rows (query length > 1);
/// * each *verify run* ([`BatchDescriptor::verify_runs`]) is two or more consecutive
///   decode rows of one request: the same block row and sequence lengths `s, s + 1,
///   ...` (a speculative verify row's last known token and its drafts, one causal
///   decode row per query token).
///
/// What it cannot know is checked where it is known: the configured block size in
/// [`Capabilities::check_batch`](super::Capabilities::check_batch) (at `plan`), the
/// pool size in [`LayerIo::validate_batch`](super::LayerIo::validate_batch) (at `run`).
///
/// The [`Default`] is the empty batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchDescriptor {
    block_size: usize,
    /// `num_reqs + 1` offsets into the token dimension.
    query_start_loc: Vec<u32>,
    /// Context plus new tokens, per request.
    seq_lens: Vec<u32>,
    /// Row-major `[num_reqs, block_table_stride]`; entries past a request's last block are unused.
    block_table: Vec<u32>,
    block_table_stride: usize,
    /// Cache slot of each token (`-1` = padding, skipped by `write_kv`).
    slot_mapping: Vec<i64>,
    num_decode_reqs: usize,
    max_query_len: usize,
    max_seq_len: usize,
    /// The highest block id any request uses (`None` for the empty batch).
    max_block: Option<u32>,
    /// Verify runs as `(first row, rows)`, in row order, disjoint.
    verify_runs: Vec<(u32, u32)>,
}

fn invalid(message: String) -> CoreError {
    CoreError::InvalidBatch { message }
}

impl BatchDescriptor {
    /// The block table entry of a column past a request's last block (short rows,
    /// graph padding): no block. Device backends map it to their kernels' own "no
    /// block" value (`pagoda-cuda`: `-1`); nothing reads it, as no sequence reaches it.
    pub const PAD_BLOCK: u32 = u32::MAX;

    /// Builds a descriptor from per-request query lengths, sequence lengths and block
    /// rows (decode rows must come first). Derives everything else, the slot
    /// mapping included.
    pub fn new(
        block_size: usize,
        query_lens: &[usize],
        seq_lens: &[usize],
        block_rows: &[&[u32]],
    ) -> Result<Self, CoreError> {
        let mut b = BatchDescriptor::default();
        b.rebuild(block_size, query_lens, seq_lens, block_rows)?;
        Ok(b)
    }

    /// Like [`BatchDescriptor::new`] but reusing this descriptor's buffers. On error
    /// the descriptor is left empty (still valid).
    pub fn rebuild(
        &mut self,
        block_size: usize,
        query_lens: &[usize],
        seq_lens: &[usize],
        block_rows: &[&[u32]],
    ) -> Result<(), CoreError> {
        let result = self.fill(block_size, query_lens, seq_lens, block_rows);
        self.checked(result)
    }

    /// Builds a descriptor from raw parts (the layout vLLM's attention metadata
    /// uses) and checks every invariant listed on [`BatchDescriptor`].
    pub fn from_parts(
        block_size: usize,
        query_start_loc: Vec<u32>,
        seq_lens: Vec<u32>,
        block_table: Vec<u32>,
        block_table_stride: usize,
        slot_mapping: Vec<i64>,
    ) -> Result<Self, CoreError> {
        let mut b = BatchDescriptor {
            block_size,
            query_start_loc,
            seq_lens,
            block_table,
            block_table_stride,
            slot_mapping,
            ..BatchDescriptor::default()
        };
        b.checked(Ok(()))?;
        Ok(b)
    }

    /// Lays out the parts (lengths checked as far as the layout needs them); the
    /// invariants are checked by [`Self::validate`] afterwards.
    fn fill(
        &mut self,
        block_size: usize,
        query_lens: &[usize],
        seq_lens: &[usize],
        block_rows: &[&[u32]],
    ) -> Result<(), CoreError> {
        let n = query_lens.len();
        if seq_lens.len() != n || block_rows.len() != n {
            return Err(invalid(format!(
                "{n} query lengths, {} seq lens, {} block rows",
                seq_lens.len(),
                block_rows.len()
            )));
        }
        if block_size == 0 {
            return Err(invalid("block size 0".into()));
        }
        self.block_size = block_size;
        self.query_start_loc.clear();
        self.seq_lens.clear();
        self.block_table.clear();
        self.slot_mapping.clear();
        self.verify_runs.clear();
        self.block_table_stride = block_rows.iter().map(|r| r.len()).max().unwrap_or(0).max(1);
        self.query_start_loc.push(0);
        for r in 0..n {
            let (q, s) = (query_lens[r], seq_lens[r]);
            if q == 0 || q > s {
                return Err(invalid(format!(
                    "request {r}: query length {q} with sequence length {s}"
                )));
            }
            let need = s.div_ceil(block_size);
            if need > block_rows[r].len() {
                return Err(invalid(format!(
                    "request {r}: {s} tokens need {need} blocks, has {}",
                    block_rows[r].len()
                )));
            }
            let start = *self.query_start_loc.last().expect("starts with 0");
            let end = u32::try_from(q)
                .ok()
                .and_then(|q| start.checked_add(q))
                .ok_or_else(|| invalid(format!("request {r}: token count overflows u32")))?;
            self.query_start_loc.push(end);
            self.seq_lens.push(
                u32::try_from(s)
                    .map_err(|_| invalid(format!("request {r}: sequence length {s}")))?,
            );
            let row = block_rows[r];
            self.block_table.extend_from_slice(row);
            self.block_table
                .resize((r + 1) * self.block_table_stride, Self::PAD_BLOCK);
            self.slot_mapping
                .extend((s - q..s).map(|pos| slot(row, block_size, pos)));
        }
        Ok(())
    }

    /// Pads a decode-only batch to `num_reqs` requests and a block table of `stride`
    /// columns: the shape a captured CUDA graph was recorded for. Each padding request
    /// has one token at position 0 of block 0 and slot `-1` (so no K/V is written; its
    /// attention reads block 0 and its output is never used). On error the descriptor
    /// is left empty (still valid).
    pub fn pad_decode(&mut self, num_reqs: usize, stride: usize) -> Result<(), CoreError> {
        let n = self.num_reqs();
        let filled = if self.num_decode_reqs != n {
            Err(invalid(format!(
                "only decode-only batches are padded ({} of {n} requests are decode rows)",
                self.num_decode_reqs
            )))
        } else if num_reqs < n || stride < self.block_table_stride {
            Err(invalid(format!(
                "cannot pad {n} requests x {} blocks to {num_reqs} x {stride}",
                self.block_table_stride
            )))
        } else {
            let old = std::mem::replace(&mut self.block_table_stride, stride);
            let mut table = Vec::with_capacity(num_reqs * stride);
            for row in self.block_table.chunks(old.max(1)).take(n) {
                table.extend_from_slice(row);
                table.resize(table.len() + stride - row.len(), Self::PAD_BLOCK);
            }
            for r in n..num_reqs {
                table.push(0);
                table.resize((r + 1) * stride, Self::PAD_BLOCK);
                let end = *self.query_start_loc.last().expect("starts with 0") + 1;
                self.query_start_loc.push(end);
                self.seq_lens.push(1);
                self.slot_mapping.push(-1);
            }
            self.block_table = table;
            Ok(())
        };
        self.checked(filled)
    }

    /// Validates after a fill; on any error leaves the empty batch behind.
    fn checked(&mut self, filled: Result<(), CoreError>) -> Result<(), CoreError> {
        match filled.and_then(|()| self.validate()) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.query_start_loc.clear();
                self.seq_lens.clear();
                self.block_table.clear();
                self.slot_mapping.clear();
                self.verify_runs.clear();
                *self = BatchDescriptor {
                    query_start_loc: std::mem::take(&mut self.query_start_loc),
                    seq_lens: std::mem::take(&mut self.seq_lens),
                    block_table: std::mem::take(&mut self.block_table),
                    slot_mapping: std::mem::take(&mut self.slot_mapping),
                    verify_runs: std::mem::take(&mut self.verify_runs),
                    ..BatchDescriptor::default()
                };
                Err(e)
            }
        }
    }

    /// Checks every invariant and derives the summary fields. The one place the
    /// descriptor's consistency (decode rows first included) is decided.
    fn validate(&mut self) -> Result<(), CoreError> {
        let n = self.seq_lens.len();
        let bs = self.block_size;
        if bs == 0 {
            return Err(invalid("block size 0".into()));
        }
        if self.query_start_loc.len() != n + 1 || self.query_start_loc[0] != 0 {
            return Err(invalid(format!(
                "query_start_loc has {} entries (first {:?}) for {n} requests; needs {} starting at 0",
                self.query_start_loc.len(),
                self.query_start_loc.first(),
                n + 1
            )));
        }
        let stride = self.block_table_stride;
        if stride == 0 || Some(self.block_table.len()) != n.checked_mul(stride) {
            return Err(invalid(format!(
                "block table has {} entries, needs {n} x {stride} (stride >= 1)",
                self.block_table.len()
            )));
        }
        if let Some(r) = (0..n).find(|&r| self.query_start_loc[r + 1] <= self.query_start_loc[r]) {
            return Err(invalid(format!(
                "query_start_loc does not increase at request {r} ({} then {})",
                self.query_start_loc[r],
                self.query_start_loc[r + 1]
            )));
        }
        let num_tokens = self.query_start_loc[n] as usize;
        if self.slot_mapping.len() != num_tokens {
            return Err(invalid(format!(
                "slot mapping has {} entries for {num_tokens} tokens",
                self.slot_mapping.len()
            )));
        }
        let (mut decodes, mut seen_prefill) = (0, false);
        let (mut max_q, mut max_s, mut max_block) = (0, 0, None::<u32>);
        for r in 0..n {
            let (q0, q1) = (self.query_start_loc[r], self.query_start_loc[r + 1]);
            let (q, s) = ((q1 - q0) as usize, self.seq_lens[r] as usize);
            if q > s {
                return Err(invalid(format!(
                    "request {r}: query length {q} exceeds sequence length {s}"
                )));
            }
            let need = s.div_ceil(bs);
            if need > stride {
                return Err(invalid(format!(
                    "request {r}: {s} tokens need {need} blocks, the block table has {stride} per row"
                )));
            }
            if q == 1 {
                if seen_prefill {
                    return Err(invalid(format!(
                        "decode rows must come before prefill rows (request {r} is a decode row after a prefill row)"
                    )));
                }
                decodes += 1;
            } else {
                seen_prefill = true;
            }
            let row = &self.block_table[r * stride..r * stride + need];
            for (i, pos) in (s - q..s).enumerate() {
                let got = self.slot_mapping[q0 as usize + i];
                let want = slot(row, bs, pos);
                if got != -1 && got != want {
                    return Err(invalid(format!(
                        "request {r}: slot {got} for position {pos}, the block table maps it to {want}"
                    )));
                }
            }
            max_q = max_q.max(q);
            max_s = max_s.max(s);
            max_block = row.iter().copied().max().max(max_block);
        }
        self.num_decode_reqs = decodes;
        self.max_query_len = max_q;
        self.max_seq_len = max_s;
        self.max_block = max_block;
        Ok(())
    }

    /// The block size the batch was laid out for.
    pub fn block_size(&self) -> usize {
        self.block_size
    }
    /// `num_reqs + 1` token offsets: request `r`'s tokens are
    /// `query_start_loc[r]..query_start_loc[r + 1]`.
    pub fn query_start_loc(&self) -> &[u32] {
        &self.query_start_loc
    }
    /// Context plus new tokens, per request.
    pub fn seq_lens(&self) -> &[u32] {
        &self.seq_lens
    }
    /// Context plus new tokens of request `r`.
    pub fn seq_len(&self, r: usize) -> usize {
        self.seq_lens[r] as usize
    }
    /// Row-major `[num_reqs, block_table_stride]`; entries past a request's last
    /// block are unused (read a request's blocks through [`Self::blocks`]).
    pub fn block_table(&self) -> &[u32] {
        &self.block_table
    }
    pub fn block_table_stride(&self) -> usize {
        self.block_table_stride
    }
    /// Cache slot of each token (`-1` = padding, skipped by `write_kv`).
    pub fn slot_mapping(&self) -> &[i64] {
        &self.slot_mapping
    }
    /// The highest block id the batch uses (`None` when empty).
    pub fn max_block(&self) -> Option<u32> {
        self.max_block
    }
    pub fn num_reqs(&self) -> usize {
        self.seq_lens.len()
    }
    pub fn num_tokens(&self) -> usize {
        self.query_start_loc.last().copied().unwrap_or(0) as usize
    }
    /// Rows `0..num_decode_reqs` are the decode rows.
    pub fn num_decode_reqs(&self) -> usize {
        self.num_decode_reqs
    }
    /// Tokens of the decode rows (one each, so equal to [`Self::num_decode_reqs`]).
    pub fn num_decode_tokens(&self) -> usize {
        self.num_decode_reqs
    }
    pub fn num_prefill_reqs(&self) -> usize {
        self.num_reqs() - self.num_decode_reqs
    }
    pub fn num_prefill_tokens(&self) -> usize {
        self.num_tokens() - self.num_decode_tokens()
    }
    pub fn max_query_len(&self) -> usize {
        self.max_query_len
    }
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }
    pub fn query_len(&self, r: usize) -> usize {
        (self.query_start_loc[r + 1] - self.query_start_loc[r]) as usize
    }
    /// The token indices of request `r`.
    pub fn tokens(&self, r: usize) -> Range<usize> {
        self.query_start_loc[r] as usize..self.query_start_loc[r + 1] as usize
    }
    /// Tokens already in the cache before this step's tokens of request `r`.
    pub fn context_len(&self, r: usize) -> usize {
        self.seq_lens[r] as usize - self.query_len(r)
    }
    /// The physical blocks of request `r` that hold its `seq_lens[r]` tokens.
    pub fn blocks(&self, r: usize) -> &[u32] {
        let n = (self.seq_lens[r] as usize).div_ceil(self.block_size);
        &self.block_table[r * self.block_table_stride..r * self.block_table_stride + n]
    }

    /// The sub-batch of rows `rows` (token buffers are then indexed from the first
    /// of those rows' tokens). A sub-batch of a valid batch is valid.
    pub fn slice_rows(&self, rows: Range<usize>) -> BatchDescriptor {
        let t0 = self.query_start_loc[rows.start];
        let t1 = self.query_start_loc[rows.end];
        let query_start_loc: Vec<u32> = self.query_start_loc[rows.start..=rows.end]
            .iter()
            .map(|x| x - t0)
            .collect();
        let seq_lens = self.seq_lens[rows.clone()].to_vec();
        let stride = self.block_table_stride;
        let block_table = self.block_table[rows.start * stride..rows.end * stride].to_vec();
        let num_decode_reqs = self
            .num_decode_reqs
            .saturating_sub(rows.start)
            .min(rows.len());
        let max_query_len = query_start_loc
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0);
        let max_block = rows
            .clone()
            .filter_map(|r| self.blocks(r).iter().copied().max())
            .max();
        // Runs wholly inside the slice, renumbered (a run cut by the slice is plain
        // decode rows there, which is what a run means to a backend that ignores it).
        let verify_runs = self
            .verify_runs
            .iter()
            .filter(|&&(f, n)| f as usize >= rows.start && (f + n) as usize <= rows.end)
            .map(|&(f, n)| (f - rows.start as u32, n))
            .collect();
        BatchDescriptor {
            verify_runs,
            block_size: self.block_size,
            max_seq_len: seq_lens.iter().copied().max().unwrap_or(0) as usize,
            query_start_loc,
            seq_lens,
            block_table,
            block_table_stride: stride,
            slot_mapping: self.slot_mapping[t0 as usize..t1 as usize].to_vec(),
            num_decode_reqs,
            max_query_len,
            max_block,
        }
    }

    /// Splits into (decode rows, prefill rows).
    pub fn split_decode_prefill(&self) -> (BatchDescriptor, BatchDescriptor) {
        (
            self.slice_rows(0..self.num_decode_reqs),
            self.slice_rows(self.num_decode_reqs..self.num_reqs()),
        )
    }

    /// Marks decode rows `rows` as one verify run: a speculative verify row of
    /// `rows.len() - 1` drafts, carried as one causal decode row per query token.
    /// The rows must be at least two decode rows after every run marked so far, with
    /// the same block row (over the blocks the last one uses) and sequence lengths
    /// increasing by one. A backend that declares
    /// [`AttentionBackend::serves_verify_runs`](super::AttentionBackend::serves_verify_runs)
    /// may serve a run in one pass over its keys; any other serves its rows as the
    /// plain decode rows they are, so marking never changes what a row means. On
    /// error nothing is marked.
    pub fn mark_verify_run(&mut self, rows: Range<usize>) -> Result<(), CoreError> {
        let after = self
            .verify_runs
            .last()
            .map_or(0, |&(f, n)| (f + n) as usize);
        if rows.len() < 2 || rows.start < after || rows.end > self.num_decode_reqs {
            return Err(invalid(format!(
                "verify run {rows:?}: needs two or more decode rows (of {}) after row {after}",
                self.num_decode_reqs
            )));
        }
        let last = self.blocks(rows.end - 1);
        for r in rows.start..rows.end - 1 {
            let (s, next) = (self.seq_lens[r], self.seq_lens[r + 1]);
            let blocks = self.blocks(r);
            if next != s + 1 || last[..blocks.len()] != *blocks {
                return Err(invalid(format!(
                    "verify run {rows:?}: row {r} (sequence length {s}) is not the row before row {} (sequence length {next}) of one request",
                    r + 1
                )));
            }
        }
        self.verify_runs
            .push((rows.start as u32, (rows.end - rows.start) as u32));
        Ok(())
    }

    /// The verify runs, in row order (see [`Self::mark_verify_run`]).
    pub fn verify_runs(&self) -> impl ExactSizeIterator<Item = Range<usize>> + '_ {
        self.verify_runs
            .iter()
            .map(|&(f, n)| f as usize..(f + n) as usize)
    }
}

/// The cache slot of position `pos` through a request's block row.
fn slot(row: &[u32], block_size: usize, pos: usize) -> i64 {
    row[pos / block_size] as i64 * block_size as i64 + (pos % block_size) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_a_decode_batch_for_a_graph() {
        let mut b = BatchDescriptor::new(4, &[1, 1], &[5, 2], &[&[7, 2], &[3]]).unwrap();
        b.pad_decode(4, 3).unwrap();
        assert_eq!(b.num_reqs(), 4);
        assert_eq!(b.num_decode_reqs(), 4);
        assert_eq!(b.block_table_stride(), 3);
        let m = u32::MAX;
        assert_eq!(b.block_table(), &[7, 2, m, 3, m, m, 0, m, m, 0, m, m]);
        assert_eq!(b.seq_lens(), &[5, 2, 1, 1]);
        assert_eq!(b.query_start_loc(), &[0, 1, 2, 3, 4]);
        // The real rows keep their slots; padding writes nothing.
        assert_eq!(b.slot_mapping(), &[8, 13, -1, -1]);
        assert_eq!(b.blocks(0), &[7, 2]);
        // Prefill rows, fewer requests or a narrower table are refused.
        let mut p = BatchDescriptor::new(4, &[1, 2], &[5, 2], &[&[7, 2], &[3]]).unwrap();
        assert!(p.pad_decode(4, 3).is_err());
        assert_eq!(p.num_reqs(), 0, "left empty on error");
        let mut b = BatchDescriptor::new(4, &[1, 1], &[5, 2], &[&[7, 2], &[3]]).unwrap();
        assert!(b.clone().pad_decode(1, 3).is_err());
        assert!(b.pad_decode(2, 1).is_err());
    }

    #[test]
    fn verify_runs_are_checked_and_sliced() {
        // Row 0: another request; rows 1-3: one request at 5, 6, 7 tokens (a verify
        // row of 2 drafts); row 4: a prefill row.
        let b = BatchDescriptor::new(
            4,
            &[1, 1, 1, 1, 3],
            &[3, 5, 6, 7, 3],
            &[&[9], &[7, 2], &[7, 2], &[7, 2], &[4]],
        )
        .unwrap();
        let mut m = b.clone();
        m.mark_verify_run(1..4).unwrap();
        assert_eq!(m.verify_runs().collect::<Vec<_>>(), vec![1..4]);
        let (decode, prefill) = m.split_decode_prefill();
        assert_eq!(decode.verify_runs().collect::<Vec<_>>(), vec![1..4]);
        assert_eq!(prefill.verify_runs().len(), 0);
        assert_eq!(
            m.slice_rows(2..5).verify_runs().len(),
            0,
            "a cut run is dropped"
        );
        assert_eq!(
            m.slice_rows(1..4).verify_runs().collect::<Vec<_>>(),
            vec![0..3]
        );
        // Overlapping, too short, reaching a prefill row, other requests' rows, or
        // not consecutive lengths: refused, nothing marked.
        for bad in [1..4, 2..3, 3..5] {
            assert!(m.clone().mark_verify_run(bad).is_err());
        }
        let mut c = b.clone();
        assert!(
            c.mark_verify_run(0..2).is_err(),
            "different blocks and lengths"
        );
        assert_eq!(c.verify_runs().len(), 0);
        let gap = BatchDescriptor::new(4, &[1, 1], &[5, 7], &[&[7, 2], &[7, 2]]).unwrap();
        assert!(gap.clone().mark_verify_run(0..2).is_err());
        // Rebuilding clears the runs.
        let mut r = m.clone();
        r.rebuild(4, &[1], &[3], &[&[9]]).unwrap();
        assert_eq!(r.verify_runs().len(), 0);
    }

    #[test]
    fn slot_mapping_and_split() {
        // Two decodes then one prefill of 3 tokens with 2 cached.
        let b = BatchDescriptor::new(4, &[1, 1, 3], &[5, 1, 5], &[&[7, 2], &[3], &[9, 1]]).unwrap();
        assert_eq!(b.query_start_loc(), &[0, 1, 2, 5]);
        assert_eq!(b.num_decode_reqs(), 2);
        assert_eq!(b.num_prefill_tokens(), 3);
        assert_eq!(b.max_block(), Some(9));
        // pos 4 of req 0 -> block 2 offset 0 -> slot 8
        assert_eq!(b.slot_mapping(), &[8, 12, 38, 39, 4]);
        let (d, p) = b.split_decode_prefill();
        assert_eq!(d.num_reqs(), 2);
        assert_eq!(d.max_block(), Some(7));
        assert_eq!(p.query_start_loc(), &[0, 3]);
        assert_eq!(p.slot_mapping(), &[38, 39, 4]);
        assert_eq!(p.context_len(0), 2);
        assert_eq!(p.blocks(0), &[9, 1]);
        assert_eq!(p.max_block(), Some(9));
        // The raw parts of a valid batch rebuild the same batch.
        let again = BatchDescriptor::from_parts(
            4,
            b.query_start_loc().to_vec(),
            b.seq_lens().to_vec(),
            b.block_table().to_vec(),
            b.block_table_stride(),
            b.slot_mapping().to_vec(),
        )
        .unwrap();
        assert_eq!(again, b);
    }

    /// The arguments of `from_parts`, in order.
    type Parts = (usize, Vec<u32>, Vec<u32>, Vec<u32>, usize, Vec<i64>);

    #[test]
    fn every_malformed_batch_is_an_error() {
        let err = |r: Result<BatchDescriptor, CoreError>| match r {
            Err(CoreError::InvalidBatch { message }) => message,
            other => panic!("expected InvalidBatch, got {other:?}"),
        };
        // `new`: decode after prefill, zero-length query, query longer than the
        // sequence, too few blocks, block size 0, mismatched lengths.
        assert!(err(BatchDescriptor::new(4, &[3, 1], &[3, 1], &[&[0], &[1]])).contains("before"));
        assert!(err(BatchDescriptor::new(4, &[0], &[1], &[&[0]])).contains("query length 0"));
        assert!(err(BatchDescriptor::new(4, &[3], &[2], &[&[0]])).contains("query length 3"));
        assert!(err(BatchDescriptor::new(4, &[1], &[5], &[&[0]])).contains("need 2 blocks"));
        assert!(err(BatchDescriptor::new(0, &[1], &[1], &[&[0]])).contains("block size 0"));
        assert!(err(BatchDescriptor::new(4, &[1, 1], &[1], &[&[0]])).contains("seq lens"));
        // `from_parts`: one good batch, then each invariant broken alone.
        let good = || {
            (
                4,
                vec![0u32, 1, 3],
                vec![2u32, 6],
                vec![0u32, 9, 1, 2],
                2,
                vec![1i64, 8, 9],
            )
        };
        let (bs, qsl, seq, bt, st, sm) = good();
        BatchDescriptor::from_parts(bs, qsl, seq, bt, st, sm).unwrap();
        let parts = |f: &dyn Fn(&mut Parts)| {
            let mut p = good();
            f(&mut p);
            err(BatchDescriptor::from_parts(p.0, p.1, p.2, p.3, p.4, p.5))
        };
        assert!(parts(&|p| p.1 = vec![1, 2, 4]).contains("starting at 0"));
        assert!(parts(&|p| p.1 = vec![0, 1]).contains("entries"));
        assert!(parts(&|p| p.1 = vec![0, 1, 1]).contains("does not increase"));
        assert!(parts(&|p| {
            p.1 = vec![0, 2, 3];
            p.5 = vec![-1; 3];
        })
        .contains("before prefill"));
        assert!(parts(&|p| p.2 = vec![2, 1]).contains("exceeds sequence length"));
        assert!(parts(&|p| p.2 = vec![2, 9]).contains("blocks"));
        assert!(parts(&|p| {
            p.3.pop();
        })
        .contains("block table"));
        assert!(parts(&|p| p.4 = 0).contains("stride"));
        assert!(parts(&|p| p.5 = vec![1, 8]).contains("slot mapping has 2"));
        assert!(parts(&|p| p.5[2] = 7).contains("slot 7"));
        assert!(parts(&|p| p.0 = 0).contains("block size 0"));
        // Padding slots are allowed.
        let (bs, qsl, seq, bt, st, _) = good();
        BatchDescriptor::from_parts(bs, qsl, seq, bt, st, vec![-1, 8, -1]).unwrap();
    }

    #[test]
    fn a_failed_rebuild_leaves_the_empty_batch() {
        let mut b = BatchDescriptor::new(4, &[1], &[3], &[&[5]]).unwrap();
        assert!(b.rebuild(4, &[2, 1], &[2, 1], &[&[0], &[1]]).is_err());
        assert_eq!(b.num_reqs(), 0);
        assert_eq!(b.num_tokens(), 0);
        assert_eq!(b, BatchDescriptor::default());
    }
}
