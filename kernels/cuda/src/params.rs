//! `#[repr(C)]` mirrors of `cu/params.h`: what every launch takes by value, on the
//! emulator (host pointers) and on the GPU (device pointers). A test compares their
//! sizes with the C side's `sizeof`.

use std::ffi::c_void;
use std::ptr;

/// `PgWriteKvParams`: rows `[num_tokens, num_kv_heads, head_dim]` of `src_dtype` into the
/// pools `[num_blocks, block_size, num_kv_heads, head_dim]` at `slot_mapping` (-1 skipped).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct WriteKvParams {
    /// New keys (`src_dtype`).
    pub key: *const c_void,
    /// New values (`src_dtype`).
    pub value: *const c_void,
    /// Key pool (the dtype given at launch).
    pub key_cache: *mut c_void,
    /// Value pool.
    pub value_cache: *mut c_void,
    /// Slot per token, `-1` = skip.
    pub slot_mapping: *const i64,
    /// Rows in `key`/`value`.
    pub num_tokens: i32,
    /// KV heads.
    pub num_kv_heads: i32,
    /// Head dim.
    pub head_dim: i32,
    /// Tokens per cache block.
    pub block_size: i32,
    /// Element type of `key`/`value`: a [`crate::Dtype`] as i32.
    pub src_dtype: i32,
    /// Padding (write 0).
    pub pad: i32,
}

/// `PgAttnParams`: one struct for naive, paged and flash attention (each reads what it
/// needs). A launch covers sequences `seq_begin..seq_end`; see `cu/params.h` for layouts.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AttnParams {
    /// `[num_tokens, num_heads, head_dim]`.
    pub q: *const c_void,
    /// `[num_blocks, block_size, num_kv_heads, head_dim]`.
    pub key_cache: *const c_void,
    /// Same layout as `key_cache`.
    pub value_cache: *const c_void,
    /// `[num_tokens, num_heads, head_dim]`, the dtype of `q`.
    pub out: *mut c_void,
    /// `[num_tokens, num_heads]` f32 or null.
    pub lse: *mut f32,
    /// `[num_seqs + 1]` i32.
    pub query_start_loc: *const i32,
    /// `[num_seqs]` i32.
    pub seq_lens: *const i32,
    /// `[num_seqs, max_blocks_per_seq]` i32.
    pub block_table: *const i32,
    /// Paged partials `[seqs, num_heads, num_splits, head_dim]` f32 (null if one split).
    pub split_out: *mut f32,
    /// Paged partial LSEs `[seqs, num_heads, num_splits]` f32 (null if one split).
    pub split_lse: *mut f32,
    /// First sequence of the launch.
    pub seq_begin: i32,
    /// One past the last sequence.
    pub seq_end: i32,
    /// Query heads.
    pub num_heads: i32,
    /// KV heads (divides `num_heads`).
    pub num_kv_heads: i32,
    /// Head dim.
    pub head_dim: i32,
    /// Tokens per cache block.
    pub block_size: i32,
    /// Row stride of `block_table`.
    pub max_blocks_per_seq: i32,
    /// flash: the longest query among the launched sequences (sets the grid).
    pub max_q_len: i32,
    /// paged: key partitions per sequence.
    pub num_splits: i32,
    /// paged: keys per partition (a multiple of `block_size`).
    pub partition_size: i32,
    /// Softmax scale (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// naive: token rows of the launched sequences (its grid).
    pub num_rows: i32,
    /// `> 0`: a query at position `pos` sees keys `pos - sliding_window + 1..=pos` only
    /// (the last `sliding_window` positions); `0`: every key up to `pos`.
    pub sliding_window: i32,
    /// `> 0`: scores (after `scale`) become `soft_cap * tanh(s / soft_cap)`; `0`: none.
    pub soft_cap: f32,
}

impl Default for AttnParams {
    fn default() -> Self {
        AttnParams {
            q: ptr::null(),
            key_cache: ptr::null(),
            value_cache: ptr::null(),
            out: ptr::null_mut(),
            lse: ptr::null_mut(),
            query_start_loc: ptr::null(),
            seq_lens: ptr::null(),
            block_table: ptr::null(),
            split_out: ptr::null_mut(),
            split_lse: ptr::null_mut(),
            seq_begin: 0,
            seq_end: 0,
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            block_size: 0,
            max_blocks_per_seq: 0,
            max_q_len: 0,
            num_splits: 1,
            partition_size: 0,
            scale: 1.0,
            num_rows: 0,
            sliding_window: 0,
            soft_cap: 0.0,
        }
    }
}

/// `PgLaunch`: grid, block and dynamic shared memory of one kernel launch.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Launch {
    /// Grid dims (x, y, z).
    pub grid: [u32; 3],
    /// Block dims (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
}

impl Launch {
    /// True when the grid has no block (nothing to launch).
    pub fn is_empty(&self) -> bool {
        self.grid.contains(&0)
    }
}

/// `PgMmaProbeParams`: one m16n8k16 mma from global memory (see `cu/mma_probe.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MmaProbeParams {
    /// A `[16][16]`, bf16/f16.
    pub a: *const c_void,
    /// B `[16][8]` (row k, column n), bf16/f16.
    pub b: *const c_void,
    /// C `[16][8]` f32.
    pub c: *const f32,
    /// D `[16][8]` f32 (written).
    pub d: *mut f32,
}

/// How `paged` splits each sequence's keys (flash-decoding): `num_splits` partitions of
/// `partition_size` keys; with more than one, partials are merged by a second kernel.
/// With a sliding window the partitions start at the window's first key, so a plan
/// needs to cover only `min(seq_len, window)` keys ([`SplitPlan::keys`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPlan {
    /// Partitions per sequence (>= 1).
    pub num_splits: usize,
    /// Keys per partition, a multiple of the block size.
    pub partition_size: usize,
}

impl SplitPlan {
    /// Shortest partition worth a CTA: below this the merge costs more than it saves.
    pub const MIN_PARTITION: usize = 256;

    /// Keys per partition of the batch-invariant plan ([`SplitPlan::fixed`]).
    pub const FIXED_PARTITION: usize = 256;

    /// The batch-invariant plan: partitions of [`Self::FIXED_PARTITION`] keys (rounded
    /// up to the block size), as many as `max_seq_len` needs. The partition size
    /// depends on the configuration only, so a decode row's partitions (from its
    /// window's first key, every `partition_size` keys) are a function of its own
    /// position: whatever the batch, its CTAs run the same keys in the same order,
    /// and the merge folds the same partials in partition order (the partitions past
    /// its end, there for a longer row of the batch, are empty: lse -inf, weight
    /// exactly 0, an exact `+ 0.0` in the weight sum). One partition is written by
    /// the CTA directly and equals what the merge would make of it (weight
    /// `exp(0) = 1`, `o / 1`, `lse + log(1)`).
    pub fn fixed(max_seq_len: usize, block_size: usize) -> Self {
        let bs = block_size.max(1);
        let partition = Self::FIXED_PARTITION.div_ceil(bs) * bs;
        SplitPlan {
            num_splits: max_seq_len.max(1).div_ceil(partition),
            partition_size: partition,
        }
    }

    /// One partition covering `max_seq_len` keys (no merge pass).
    pub fn single(max_seq_len: usize, block_size: usize) -> Self {
        let bs = block_size.max(1);
        SplitPlan {
            num_splits: 1,
            partition_size: max_seq_len.max(1).div_ceil(bs) * bs,
        }
    }

    /// Splits enough to give `num_sms` SMs about two CTAs each, given `ctas_per_split`
    /// CTAs per partition (sequences x KV-head groups), never below `MIN_PARTITION` keys.
    pub fn choose(
        max_seq_len: usize,
        block_size: usize,
        ctas_per_split: usize,
        num_sms: usize,
    ) -> Self {
        let bs = block_size.max(1);
        let max_seq_len = max_seq_len.max(1);
        let want = (2 * num_sms).div_ceil(ctas_per_split.max(1)).max(1);
        let cap = max_seq_len.div_ceil(Self::MIN_PARTITION).max(1);
        let splits = want.min(cap);
        let partition = max_seq_len.div_ceil(splits).div_ceil(bs) * bs;
        SplitPlan {
            num_splits: max_seq_len.div_ceil(partition),
            partition_size: partition,
        }
    }

    /// CTAs per SM a captured plan's grid may hold ([`SplitPlan::for_graph`]): most of
    /// them meet an empty partition and exit after a few instructions.
    pub const GRAPH_CTAS_PER_SM: usize = 32;

    /// The plan a CUDA graph of a decode bucket is captured with: it must cover the
    /// longest context allowed (`limit_keys`), since a replay cannot change it, yet
    /// keep a short context about as busy as [`SplitPlan::choose`] would. So it takes as many
    /// partitions (of at least [`Self::MIN_PARTITION`] keys) as a grid of
    /// [`Self::GRAPH_CTAS_PER_SM`] CTAs per SM holds for this bucket's `ctas_per_split`
    /// (never fewer than `choose` at the limit): partitions past a sequence's end are
    /// empty (lse -inf, weight 0 in the merge). `choose` at the limit instead gives a
    /// bucket of one Llama-3-8B decode at 131072 keys 33 partitions of ~4k keys: a
    /// 4k-token context then runs on 16 CTAs of 132 SMs.
    pub fn for_graph(
        limit_keys: usize,
        block_size: usize,
        ctas_per_split: usize,
        num_sms: usize,
    ) -> Self {
        let bs = block_size.max(1);
        let limit = limit_keys.max(1);
        let at_limit = Self::choose(limit, bs, ctas_per_split, num_sms);
        let budget = (Self::GRAPH_CTAS_PER_SM * num_sms.max(1) / ctas_per_split.max(1)).max(1);
        let cap = limit.div_ceil(Self::MIN_PARTITION).max(1);
        let splits = budget.min(cap).max(at_limit.num_splits);
        let partition = limit.div_ceil(splits).div_ceil(bs) * bs;
        SplitPlan {
            num_splits: limit.div_ceil(partition),
            partition_size: partition,
        }
    }

    /// Partitions that hold keys for a sequence of `keys` keys (the busy CTAs of one
    /// KV-head group).
    pub fn busy_splits(&self, keys: usize) -> usize {
        keys.div_ceil(self.partition_size.max(1))
            .min(self.num_splits)
    }

    /// The keys a decode row of a `seq_len`-token sequence attends to: all of them, or the
    /// last `window` (what a plan must cover, and what [`SplitPlan::choose`] should be
    /// given as `max_seq_len` under a window).
    pub fn keys(seq_len: usize, window: Option<usize>) -> usize {
        window.map_or(seq_len, |w| seq_len.min(w))
    }

    /// f32 elements of the partial outputs and LSEs for `seqs` sequences (0, 0 with one split).
    pub fn workspace_len(&self, seqs: usize, num_heads: usize, head_dim: usize) -> (usize, usize) {
        if self.num_splits <= 1 {
            return (0, 0);
        }
        let parts = seqs * num_heads * self.num_splits;
        (parts * head_dim, parts)
    }
}

// ---- model.cu -------------------------------------------------------------------------

/// `PgEmbedParams`: `out[t, :] = scale * table[ids[t], :]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EmbedParams {
    /// `[num_tokens]` i32 token ids (each `< vocab`).
    pub ids: *const i32,
    /// `[vocab, hidden]` (the table dtype).
    pub table: *const c_void,
    /// `[num_tokens, hidden]` (the output dtype).
    pub out: *mut c_void,
    /// Rows of `ids` / `out`.
    pub num_tokens: i32,
    /// Row length.
    pub hidden: i32,
    /// Multiplier (1 for Llama; Gemma: `sqrt(hidden)`).
    pub scale: f32,
    /// Padding (write 0).
    pub pad: i32,
}

/// `PgNormParams`: RMSNorm of rows of `dim`, `out = v / sqrt(mean(v²) + eps) * (weight +
/// w_offset)`; with `residual` (add_rms_norm) `residual += x` first and `v` is the sum.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NormParams {
    /// `[rows, dim]` (the input dtype).
    pub x: *const c_void,
    /// `[rows, dim]` f32, updated in place (add_rms_norm); null for rms_norm.
    pub residual: *mut f32,
    /// `[dim]` f32.
    pub weight: *const f32,
    /// `[rows, dim]` (the output dtype).
    pub out: *mut c_void,
    /// Rows.
    pub rows: i32,
    /// Row length (> 0).
    pub dim: i32,
    /// Added to the mean square.
    pub eps: f32,
    /// Added to every weight (0 for Llama, 1 for Gemma).
    pub w_offset: f32,
}

/// `PgRopeKvParams`: RoPE (rotate-half) on the q and k heads of the fused QKV output,
/// q into `q_out`, k and v into the paged pools at `slot_mapping` (`< 0`: not written).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RopeKvParams {
    /// `[num_tokens, (num_heads + 2 num_kv_heads) head_dim]`: `[q | k | v]` heads (dtype T).
    pub qkv: *const c_void,
    /// `[(num_heads + 2 num_kv_heads) head_dim]` f32, added before the rotation; or null.
    pub bias: *const f32,
    /// `[num_tokens]` i32 positions (each `< max_pos`).
    pub positions: *const i32,
    /// `[max_pos, head_dim / 2]` f32 (`pagoda_kernels::RopeCache`'s table).
    pub cos: *const f32,
    /// `[max_pos, head_dim / 2]` f32.
    pub sin: *const f32,
    /// `[num_tokens]` i32 slots (`block * block_size + offset`), `< 0` = padding.
    pub slot_mapping: *const i32,
    /// `[num_tokens, num_heads, head_dim]` (dtype T).
    pub q_out: *mut c_void,
    /// `[num_blocks, block_size, num_kv_heads, head_dim]` (the KV dtype).
    pub k_pool: *mut c_void,
    /// Same layout as `k_pool`.
    pub v_pool: *mut c_void,
    /// Rows.
    pub num_tokens: i32,
    /// Query heads.
    pub num_heads: i32,
    /// KV heads.
    pub num_kv_heads: i32,
    /// Head dim (even).
    pub head_dim: i32,
}

/// `PgGluParams`: `out = act(gate) * up` on `[rows, 2 inter]` rows `[gate | up]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GluParams {
    /// `[rows, 2 inter]`.
    pub gate_up: *const c_void,
    /// `[rows, inter]`.
    pub out: *mut c_void,
    /// Rows.
    pub rows: i32,
    /// Intermediate size.
    pub inter: i32,
}

/// `PgGatherParams`: `out[i, :] = x[rows[i], :]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GatherParams {
    /// `[*, dim]`.
    pub x: *const c_void,
    /// `[num_rows]` i32 row indices into `x`.
    pub rows: *const i32,
    /// `[num_rows, dim]`, the dtype of `x`.
    pub out: *mut c_void,
    /// Rows gathered.
    pub num_rows: i32,
    /// Row length.
    pub dim: i32,
}

/// `PgArgmaxParams`: per row, the first index of the largest non-NaN value and the value
/// (index 0 and `-inf` for a row without one).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArgmaxParams {
    /// `[rows, vocab]`.
    pub logits: *const c_void,
    /// `[rows]` i32 (written).
    pub ids: *mut i32,
    /// `[rows]` f32 (written).
    pub values: *mut f32,
    /// Rows.
    pub rows: i32,
    /// Row length.
    pub vocab: i32,
}

/// `PgCastParams`: `dst[i] = src[i]` converted (round to nearest even).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CastParams {
    /// `[n]` (the source dtype).
    pub src: *const c_void,
    /// `[n]` (the destination dtype).
    pub dst: *mut c_void,
    /// Elements.
    pub n: i64,
}

/// `PgQkNormParams`: per-head RMSNorm in place on the q and k heads of fused QKV rows
/// (Qwen3's Q/K norms, before RoPE); v untouched.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QkNormParams {
    /// `[num_tokens, (num_heads + 2 num_kv_heads) head_dim]` (dtype T), updated in place.
    pub qkv: *mut c_void,
    /// `[head_dim]` f32: every q head's weight.
    pub q_weight: *const f32,
    /// `[head_dim]` f32: every k head's weight.
    pub k_weight: *const f32,
    /// Rows.
    pub num_tokens: i32,
    /// Query heads.
    pub num_heads: i32,
    /// KV heads.
    pub num_kv_heads: i32,
    /// Head dim (the norm's row length, > 0).
    pub head_dim: i32,
    /// Added to the mean square.
    pub eps: f32,
    /// Padding (write 0).
    pub pad: i32,
}

/// `PgSoftCapParams`: `x = cap * tanh(x / cap)` in place on `n` f32s (Gemma 2's final
/// logits).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SoftCapParams {
    /// `[n]` f32, updated in place.
    pub x: *mut f32,
    /// Elements.
    pub n: i64,
    /// The cap (positive, finite).
    pub cap: f32,
    /// Padding (write 0).
    pub pad: i32,
}

/// `PgMoeRouteParams`: per token, softmax of the router logits, the `top_k` best experts'
/// probabilities renormalised to sum to 1 into a dense `[num_tokens, num_experts]` weight
/// matrix (exactly 0 for the experts not picked).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MoeRouteParams {
    /// `[num_tokens, num_experts]` f32.
    pub logits: *const f32,
    /// `[num_tokens, num_experts]` f32 (written).
    pub weights: *mut f32,
    /// Rows.
    pub num_tokens: i32,
    /// Experts (> 0).
    pub num_experts: i32,
    /// Experts kept per token (`1..=min(num_experts, 32)`).
    pub top_k: i32,
    /// Padding (write 0).
    pub pad: i32,
}

/// The largest `top_k` [`MoeRouteParams`] takes (the kernel's per-thread pick list).
pub const MOE_MAX_TOP_K: usize = 32;

/// `PgMoeAccParams`: one expert's output added into the f32 accumulator, weighted by the
/// routing weights (skipped where the weight is 0); with `out`, the sum also written in
/// the output dtype.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MoeAccParams {
    /// `[num_tokens, hidden]` (dtype T): the expert's output.
    pub y: *const c_void,
    /// `[num_tokens, num_experts]` f32 (from `moe_route`).
    pub weights: *const f32,
    /// `[num_tokens, hidden]` f32, updated.
    pub acc: *mut f32,
    /// `[num_tokens, hidden]` (dtype T), or null.
    pub out: *mut c_void,
    /// Rows.
    pub num_tokens: i32,
    /// Row length.
    pub hidden: i32,
    /// Columns of `weights`.
    pub num_experts: i32,
    /// This expert's column (`< num_experts`).
    pub expert: i32,
    /// Nonzero: `acc` starts at 0 (the first expert), its old contents unread.
    pub first: i32,
    /// Padding (write 0).
    pub pad: i32,
}

#[cfg(test)]
mod tests {
    use super::SplitPlan;

    /// Llama-3-8B (8 KV heads, one group each) on an H100/H200 (132 SMs), 131072-token
    /// limit, blocks of 16: every capture bucket keeps a short decode about as busy as
    /// the eager plan of that length, covers the limit, and stays within its CTA
    /// budget; the plan chosen for the limit (the old graph plan) runs a 4k-token
    /// decode on 16 CTAs.
    #[test]
    fn a_graph_plan_keeps_short_contexts_busy() {
        let (limit, bs, sms, groups) = (131_072, 16, 132, 8);
        for bucket in [1usize, 2, 4, 8, 16, 32, 64, 128, 256] {
            let ctas = bucket * groups;
            let g = SplitPlan::for_graph(limit, bs, ctas, sms);
            assert!(g.num_splits * g.partition_size >= limit, "{bucket}: {g:?}");
            assert_eq!(g.partition_size % bs, 0);
            assert!(g.partition_size >= SplitPlan::MIN_PARTITION);
            let grid = g.num_splits * ctas;
            assert!(
                grid <= (SplitPlan::GRAPH_CTAS_PER_SM * sms).max(ctas),
                "{bucket}: {grid} CTAs"
            );
            for keys in [1, 300, 4096, 32_768, limit] {
                // At least half the CTAs the eager plan of this length keeps busy (up
                // to its two per SM): the partitions cannot match every length exactly.
                let eager = SplitPlan::choose(keys, bs, ctas, sms);
                let want = (eager.busy_splits(keys) * ctas).min(2 * sms).div_ceil(2);
                assert!(
                    g.busy_splits(keys) * ctas >= want,
                    "bucket {bucket}, {keys} keys: graph {g:?} vs eager {eager:?}"
                );
            }
        }
        let old = SplitPlan::choose(limit, bs, groups, sms);
        assert_eq!(old.busy_splits(4096) * groups, 16, "{old:?}");
        let new = SplitPlan::for_graph(limit, bs, groups, sms);
        assert_eq!(new.busy_splits(4096) * groups, 128, "{new:?}");
    }

    #[test]
    fn a_graph_plan_of_a_short_limit_is_the_eager_plan_or_finer() {
        for (limit, ctas, sms) in [(256, 1, 2), (2048, 2, 2), (100, 3, 132), (1, 1, 1)] {
            let g = SplitPlan::for_graph(limit, 16, ctas, sms);
            let e = SplitPlan::choose(limit, 16, ctas, sms);
            assert!(g.num_splits >= e.num_splits, "{limit}: {g:?} vs {e:?}");
            assert!(g.num_splits * g.partition_size >= limit);
        }
    }
}
