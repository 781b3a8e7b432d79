//! The `emu` device: the CUDA kernels compiled for the host through `emu/simt.h`,
//! run on host slices.
//!
//! Every function checks all lengths, ranges and indices (block table entries, slots)
//! before the kernel runs, because the kernels trust their inputs as on the GPU: bad
//! input is an [`Error`], never a panic or an out-of-bounds access. The emulator runs
//! one OS thread per CUDA thread and blocks one after another: it is for tests and small
//! shapes (docs/gpu.md, "Emulator limits").

use crate::attn::AttnKernel;
use crate::params::{AttnParams, MmaProbeParams, SplitPlan, WriteKvParams};
use crate::{ffi, graph, invalid, paged_head_dims, Dtype, Element, Error};
use std::ops::Range;
use std::ptr;

/// The step's batch metadata in vLLM's layout (core's `BatchDescriptor` hands out the
/// same `u32` slices), and which sequences this launch covers.
#[derive(Debug, Clone)]
pub struct Batch<'a> {
    /// `[num_seqs + 1]` token offsets, starting at 0, non-decreasing.
    pub query_start_loc: &'a [u32],
    /// `[num_seqs]` context + new tokens.
    pub seq_lens: &'a [u32],
    /// `[num_seqs, max_blocks_per_seq]` block ids.
    pub block_table: &'a [u32],
    /// Row stride of `block_table`.
    pub max_blocks_per_seq: usize,
    /// The sequences to compute (decode rows first: `paged` takes `0..num_decode`,
    /// `flash` the rest, `naive` any range).
    pub seqs: Range<usize>,
}

/// Heads, dims, the softmax scale and the attention options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Query heads.
    pub num_heads: usize,
    /// KV heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// Head dim.
    pub head_dim: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// Softmax scale.
    pub scale: f32,
    /// A query at position `pos` sees only keys `pos + 1 - w..=pos` (the last `w`; `w >= 1`).
    pub sliding_window: Option<usize>,
    /// Scores (after `scale`) become `cap * tanh(s / cap)` (`cap` finite, `> 0`).
    pub soft_cap: Option<f32>,
}

impl Shape {
    /// A shape without sliding window or soft cap.
    pub fn new(
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        scale: f32,
    ) -> Self {
        Shape {
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            scale,
            sliding_window: None,
            soft_cap: None,
        }
    }

    /// The window as the kernels take it: `0` = none; a window wider than any position
    /// (past `i32::MAX`) is the same as `i32::MAX`.
    fn window_param(&self) -> i32 {
        self.sliding_window
            .map_or(0, |w| i32::try_from(w).unwrap_or(i32::MAX))
    }
}

/// The tensors of one attention launch (host memory).
#[derive(Debug)]
pub struct Io<'a, T> {
    /// `[num_tokens, num_heads, head_dim]`.
    pub q: &'a [T],
    /// `[num_blocks, block_size, num_kv_heads, head_dim]`.
    pub key_cache: &'a [T],
    /// Same layout as `key_cache`.
    pub value_cache: &'a [T],
    /// `[num_tokens, num_heads, head_dim]`; rows of the launched sequences are written.
    pub out: &'a mut [T],
    /// `[num_tokens, num_heads]` natural-log LSE of the scaled scores, if wanted.
    pub lse: Option<&'a mut [f32]>,
}

pub(crate) fn to_i32(what: &'static str, v: usize) -> Result<i32, Error> {
    i32::try_from(v).map_err(|_| invalid(what, format!("{v} does not fit in i32")))
}

pub(crate) fn expect_len(what: &'static str, got: usize, want: usize) -> Result<(), Error> {
    if got == want {
        Ok(())
    } else {
        Err(invalid(what, format!("length {got}, expected {want}")))
    }
}

pub(crate) fn checked_mul(what: &'static str, a: usize, b: usize) -> Result<usize, Error> {
    a.checked_mul(b)
        .ok_or_else(|| invalid(what, "size overflows"))
}

/// Checks the shape and returns the elements of one pool block.
fn check_shape(s: &Shape) -> Result<usize, Error> {
    if s.num_heads == 0 || s.num_kv_heads == 0 || !s.num_heads.is_multiple_of(s.num_kv_heads) {
        return Err(invalid(
            "heads",
            format!(
                "num_heads {} must be a positive multiple of num_kv_heads {}",
                s.num_heads, s.num_kv_heads
            ),
        ));
    }
    if s.head_dim == 0 || s.block_size == 0 {
        return Err(invalid("shape", "head_dim and block_size must be positive"));
    }
    if !s.scale.is_finite() {
        return Err(invalid("scale", format!("{} is not finite", s.scale)));
    }
    if s.sliding_window == Some(0) {
        return Err(invalid(
            "sliding_window",
            "a window must hold at least one key",
        ));
    }
    if let Some(cap) = s.soft_cap {
        if !(cap.is_finite() && cap > 0.0) {
            return Err(invalid(
                "soft_cap",
                format!("{cap} is not a positive finite cap"),
            ));
        }
    }
    to_i32("num_heads", s.num_heads)?;
    to_i32("head_dim", s.head_dim)?;
    to_i32("block_size", s.block_size)?;
    let row = checked_mul("kv row", s.num_kv_heads, s.head_dim)?;
    checked_mul("cache block", row, s.block_size)
}

/// Number of blocks in a pool pair, checked against the block layout.
fn pool_blocks(key: usize, value: usize, block_elems: usize) -> Result<usize, Error> {
    if key != value {
        return Err(invalid(
            "kv cache",
            format!("key pool has {key} elements, value pool {value}"),
        ));
    }
    if !key.is_multiple_of(block_elems) {
        return Err(invalid(
            "kv cache",
            format!("{key} elements is not a whole number of blocks of {block_elems}"),
        ));
    }
    let blocks = key / block_elems;
    to_i32("num_blocks", blocks)?;
    Ok(blocks)
}

/// What the checks learn about the launched sequences.
struct Checked {
    params: AttnParams,
    max_q_len: usize,
    max_seq_len: usize,
    all_decode: bool,
}

fn check_attn<T: Element>(
    io: &mut Io<'_, T>,
    batch: &Batch<'_>,
    s: &Shape,
) -> Result<Checked, Error> {
    let block_elems = check_shape(s)?;
    let qsl = batch.query_start_loc;
    if qsl.is_empty() || qsl[0] != 0 {
        return Err(invalid("query_start_loc", "must start with 0"));
    }
    let num_seqs = qsl.len() - 1;
    if qsl.windows(2).any(|w| w[1] < w[0]) {
        return Err(invalid("query_start_loc", "must not decrease"));
    }
    expect_len("seq_lens", batch.seq_lens.len(), num_seqs)?;
    expect_len(
        "block_table",
        batch.block_table.len(),
        checked_mul("block_table", num_seqs, batch.max_blocks_per_seq)?,
    )?;
    if batch.seqs.start > batch.seqs.end || batch.seqs.end > num_seqs {
        return Err(invalid(
            "seqs",
            format!("{:?} is not a range of 0..{num_seqs}", batch.seqs),
        ));
    }
    let num_tokens = qsl[num_seqs] as usize;
    to_i32("num_tokens", num_tokens)?;
    to_i32("max_blocks_per_seq", batch.max_blocks_per_seq)?;
    let rows = checked_mul("q", num_tokens, s.num_heads)?;
    let elems = checked_mul("q", rows, s.head_dim)?;
    expect_len("q", io.q.len(), elems)?;
    expect_len("out", io.out.len(), elems)?;
    if let Some(lse) = io.lse.as_deref() {
        expect_len("lse", lse.len(), rows)?;
    }
    let num_blocks = pool_blocks(io.key_cache.len(), io.value_cache.len(), block_elems)?;
    let (mut max_q_len, mut max_seq_len, mut all_decode) = (0, 0, true);
    for seq in batch.seqs.clone() {
        let q_len = (qsl[seq + 1] - qsl[seq]) as usize;
        let seq_len = batch.seq_lens[seq] as usize;
        to_i32("seq_lens", seq_len)?;
        if seq_len < q_len {
            return Err(invalid(
                "seq_lens",
                format!("sequence {seq}: {seq_len} < its {q_len} new tokens"),
            ));
        }
        let used = seq_len.div_ceil(s.block_size);
        if used > batch.max_blocks_per_seq {
            return Err(invalid(
                "block_table",
                format!(
                    "sequence {seq} needs {used} blocks, the table row has {}",
                    batch.max_blocks_per_seq
                ),
            ));
        }
        let row = &batch.block_table[seq * batch.max_blocks_per_seq..][..used];
        if let Some(b) = row.iter().find(|&&b| b as usize >= num_blocks) {
            return Err(invalid(
                "block_table",
                format!("sequence {seq}: block {b} >= pool size {num_blocks}"),
            ));
        }
        max_q_len = max_q_len.max(q_len);
        max_seq_len = max_seq_len.max(seq_len);
        all_decode &= q_len == 1;
    }
    let params = AttnParams {
        q: io.q.as_ptr().cast(),
        key_cache: io.key_cache.as_ptr().cast(),
        value_cache: io.value_cache.as_ptr().cast(),
        out: io.out.as_mut_ptr().cast(),
        lse: io
            .lse
            .as_deref_mut()
            .map_or(ptr::null_mut(), <[f32]>::as_mut_ptr),
        // u32 and i32 share their layout; every value was checked to fit in i32 above
        // (offsets <= num_tokens, lengths, block ids < num_blocks).
        query_start_loc: qsl.as_ptr().cast(),
        seq_lens: batch.seq_lens.as_ptr().cast(),
        block_table: batch.block_table.as_ptr().cast(),
        seq_begin: to_i32("seqs", batch.seqs.start)?,
        seq_end: to_i32("seqs", batch.seqs.end)?,
        num_heads: to_i32("num_heads", s.num_heads)?,
        num_kv_heads: to_i32("num_kv_heads", s.num_kv_heads)?,
        head_dim: to_i32("head_dim", s.head_dim)?,
        block_size: to_i32("block_size", s.block_size)?,
        max_blocks_per_seq: to_i32("max_blocks_per_seq", batch.max_blocks_per_seq)?,
        max_q_len: to_i32("max_q_len", max_q_len)?,
        num_rows: to_i32(
            "rows",
            (qsl[batch.seqs.end] - qsl[batch.seqs.start]) as usize,
        )?,
        scale: s.scale,
        sliding_window: s.window_param(),
        soft_cap: s.soft_cap.unwrap_or(0.0),
        ..AttnParams::default()
    };
    Ok(Checked {
        params,
        max_q_len,
        max_seq_len,
        all_decode,
    })
}

pub(crate) fn status(
    kernel: &'static str,
    rc: i32,
    dtype: Dtype,
    head_dim: usize,
) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else if rc == graph::FAULT_MISALIGNED {
        Err(crate::misaligned(kernel))
    } else {
        Err(Error::Unsupported {
            kernel,
            dtype,
            head_dim,
        })
    }
}

/// Runs the attention kernel `k` (any row mix it serves: `cuda-naive`'s reference,
/// `cuda-flash`'s tensor-core prefill, a backend crate's own) over `batch.seqs` after
/// checking every buffer and index against `batch` and `shape`: no split workspace
/// (a split-KV kernel goes through [`paged`] or the device code path).
pub fn attn<T: Element>(
    k: &'static AttnKernel,
    mut io: Io<'_, T>,
    batch: &Batch<'_>,
    shape: &Shape,
) -> Result<(), Error> {
    if !k.supports(T::DTYPE, shape.head_dim) {
        return Err(Error::Unsupported {
            kernel: k.name,
            dtype: T::DTYPE,
            head_dim: shape.head_dim,
        });
    }
    let c = check_attn(&mut io, batch, shape)?;
    if c.max_q_len == 0 {
        return Ok(());
    }
    let (params, t, run) = (c.params, T::DTYPE as i32, k.emu);
    // SAFETY: check_attn verified every buffer length and every index the kernel derives
    // (rows from query_start_loc, blocks < pool size), and `io` borrows them all for
    // the duration of this synchronous call; the grid comes from the same batch.
    let rc = graph::launch(k.name, move || unsafe { run(&params, t) });
    status(k.name, rc, T::DTYPE, shape.head_dim)
}

/// Paged decode (every launched sequence must have exactly one new token), split as
/// `plan` says (covering [`SplitPlan::keys`] of the longest sequence); partials are
/// merged by the second kernel when `plan.num_splits > 1`, in a workspace allocated for
/// the call (see [`paged_in`] for a persistent one).
pub fn paged<T: Element>(
    io: Io<'_, T>,
    batch: &Batch<'_>,
    shape: &Shape,
    plan: SplitPlan,
) -> Result<(), Error> {
    paged_impl(io, batch, shape, plan, None)
}

/// [`paged`] with the split partials in `split_out`/`split_lse` (at least
/// [`SplitPlan::workspace_len`] for the launched sequences): what a captured launch
/// ([`crate::graph`]) needs, as its workspace must outlive the call.
pub fn paged_in<T: Element>(
    io: Io<'_, T>,
    batch: &Batch<'_>,
    shape: &Shape,
    plan: SplitPlan,
    split_out: &mut [f32],
    split_lse: &mut [f32],
) -> Result<(), Error> {
    paged_impl(io, batch, shape, plan, Some((split_out, split_lse)))
}

fn paged_impl<T: Element>(
    mut io: Io<'_, T>,
    batch: &Batch<'_>,
    shape: &Shape,
    plan: SplitPlan,
    workspace: Option<(&mut [f32], &mut [f32])>,
) -> Result<(), Error> {
    if !paged_head_dims(T::DTYPE).contains(&shape.head_dim) {
        return Err(Error::Unsupported {
            kernel: "paged",
            dtype: T::DTYPE,
            head_dim: shape.head_dim,
        });
    }
    let mut c = check_attn(&mut io, batch, shape)?;
    if !c.all_decode {
        return Err(invalid(
            "seqs",
            "paged serves decode rows (one new token) only",
        ));
    }
    if batch.seqs.is_empty() {
        return Ok(());
    }
    if plan.num_splits == 0
        || plan.partition_size == 0
        || !plan.partition_size.is_multiple_of(shape.block_size)
    {
        return Err(invalid(
            "split plan",
            format!("{plan:?}: partition must be a positive multiple of the block size"),
        ));
    }
    // Under a window the partitions start at the window's first key.
    let keys = SplitPlan::keys(c.max_seq_len, shape.sliding_window);
    if checked_mul("split plan", plan.num_splits, plan.partition_size)? < keys {
        return Err(invalid(
            "split plan",
            format!("{plan:?} covers fewer than {keys} keys"),
        ));
    }
    c.params.num_splits = to_i32("num_splits", plan.num_splits)?;
    c.params.partition_size = to_i32("partition_size", plan.partition_size)?;
    let (out_len, lse_len) = plan.workspace_len(batch.seqs.len(), shape.num_heads, shape.head_dim);
    let (mut own_out, mut own_lse) = (Vec::new(), Vec::new());
    let (split_out, split_lse) = match workspace {
        Some((o, l)) => {
            if o.len() < out_len || l.len() < lse_len {
                return Err(invalid(
                    "split workspace",
                    format!(
                        "{} + {} floats, the plan needs {out_len} + {lse_len}",
                        o.len(),
                        l.len()
                    ),
                ));
            }
            (o, l)
        }
        None if plan.num_splits > 1 && graph::is_capturing() => {
            return Err(invalid(
                "split workspace",
                "a captured paged launch needs a persistent workspace (paged_in)",
            ));
        }
        None => {
            own_out.resize(out_len, 0.0f32);
            own_lse.resize(lse_len, 0.0f32);
            (&mut own_out[..], &mut own_lse[..])
        }
    };
    if plan.num_splits > 1 {
        c.params.split_out = split_out.as_mut_ptr();
        c.params.split_lse = split_lse.as_mut_ptr();
    }
    let (params, t) = (c.params, T::DTYPE as i32);
    // SAFETY: as in `attn`, plus: the plan covers every key, and the split buffers hold
    // at least workspace_len floats for these sequences, alive until the call returns
    // (or, captured, until the replays: the caller's promise to `EmuGraph::replay`).
    let rc = graph::launch("paged", move || unsafe { ffi::pg_emu_paged(&params, t) });
    status("paged", rc, T::DTYPE, shape.head_dim)?;
    if plan.num_splits > 1 {
        // SAFETY: as above; the partitions were written by the launch before.
        let rc = graph::launch("merge_states", move || unsafe {
            ffi::pg_emu_merge_states(&params, t)
        });
        status("merge_states", rc, T::DTYPE, shape.head_dim)?;
    }
    Ok(())
}

/// reshape_and_cache: rows `[slot_mapping.len(), num_kv_heads, head_dim]` (f32, bf16 or
/// f16) into the pools at their slots (`-1` skipped), converted to the pools' type. Only
/// `num_kv_heads`, `head_dim` and `block_size` of `shape` matter.
pub fn write_kv<S: Element, T: Element>(
    key: &[S],
    value: &[S],
    key_cache: &mut [T],
    value_cache: &mut [T],
    slot_mapping: &[i64],
    shape: &Shape,
) -> Result<(), Error> {
    let block_elems = check_shape(&Shape::new(
        shape.num_kv_heads,
        shape.num_kv_heads,
        shape.head_dim,
        shape.block_size,
        1.0,
    ))?;
    let row = shape.num_kv_heads * shape.head_dim;
    let n = checked_mul("key", slot_mapping.len(), row)?;
    expect_len("key", key.len(), n)?;
    expect_len("value", value.len(), n)?;
    let slots = pool_blocks(key_cache.len(), value_cache.len(), block_elems)? as i64
        * shape.block_size as i64;
    if let Some(s) = slot_mapping.iter().find(|&&s| s < -1 || s >= slots) {
        return Err(invalid(
            "slot_mapping",
            format!("slot {s} outside -1..{slots}"),
        ));
    }
    if slot_mapping.is_empty() {
        return Ok(());
    }
    let p = WriteKvParams {
        key: key.as_ptr().cast(),
        value: value.as_ptr().cast(),
        key_cache: key_cache.as_mut_ptr().cast(),
        value_cache: value_cache.as_mut_ptr().cast(),
        slot_mapping: slot_mapping.as_ptr(),
        num_tokens: to_i32("num_tokens", slot_mapping.len())?,
        num_kv_heads: to_i32("num_kv_heads", shape.num_kv_heads)?,
        head_dim: to_i32("head_dim", shape.head_dim)?,
        block_size: to_i32("block_size", shape.block_size)?,
        src_dtype: S::DTYPE as i32,
        pad: 0,
    };
    let t = T::DTYPE as i32;
    // SAFETY: lengths checked above; every slot is -1 or inside the pools.
    let rc = graph::launch("write_kv", move || unsafe { ffi::pg_emu_write_kv(&p, t) });
    status("write_kv", rc, T::DTYPE, shape.head_dim)
}

/// One m16n8k16 mma through the emulator's fragment layout: `a` `[16][16]`, `b` `[16][8]`
/// (row k), `c` `[16][8]`; returns D = A B + C `[16][8]`. bf16/f16 only.
pub fn mma_probe<T: Element>(a: &[T], b: &[T], c: &[f32]) -> Result<Vec<f32>, Error> {
    expect_len("a", a.len(), 256)?;
    expect_len("b", b.len(), 128)?;
    expect_len("c", c.len(), 128)?;
    if T::DTYPE == Dtype::F32 {
        return Err(Error::Unsupported {
            kernel: "mma_probe",
            dtype: T::DTYPE,
            head_dim: 0,
        });
    }
    let mut d = vec![0.0f32; 128];
    let p = MmaProbeParams {
        a: a.as_ptr().cast(),
        b: b.as_ptr().cast(),
        c: c.as_ptr(),
        d: d.as_mut_ptr(),
    };
    // SAFETY: the four buffers have the fixed sizes the probe kernel reads and writes.
    let rc = unsafe { ffi::pg_emu_mma_probe(&p, T::DTYPE as i32) };
    status("mma_probe", rc, T::DTYPE, 0)?;
    Ok(d)
}

/// `sizeof` of the C parameter structs: `[WriteKv, Attn, Launch, MmaProbe]` (for the
/// test that the `#[repr(C)]` mirrors match).
#[doc(hidden)]
pub fn c_param_sizes() -> [u64; 4] {
    let mut out = [0u64; 4];
    // SAFETY: the C function writes exactly four u64s.
    unsafe { ffi::pg_params_sizes(out.as_mut_ptr()) };
    out
}
