//! The attention backends' device code path, one for both drivers.
//!
//! `DeviceAttn` is what a CUDA attention backend does on a device: `DeviceAttn::plan`
//! converts the step's metadata to the kernels' types ([`pack_offsets`],
//! [`pack_block_table`]) and uploads it into buffers that grow to the largest step
//! seen and are never shrunk, and sizes `paged`'s split workspace;
//! `DeviceAttn::lock` sizes them for the engine's graph limits and freezes them (a
//! captured graph reads them at these addresses); `DeviceAttn::run` and
//! `DeviceAttn::write_kv` check the buffers' alignment, pack the kernel's parameter
//! struct and launch: no allocation, no host synchronisation inside a step.
//!
//! Only the lowest layer differs by device, the `Driver` (`driver.rs`): cudarc on
//! `cuda:N` (`gpu.rs`), host memory and the SIMT emulator on `emu`. The launches are
//! [`Call`]s, the same packed struct on both. So every conversion, size, address and
//! scalar a GPU would get wrong is got wrong on `emu` too, in plain `cargo test`; and
//! the emulator refuses what a GPU refuses (see `driver.rs`).
//!
//! The buffers' lengths and indices were checked before a launch: the batch by its
//! constructor and [`pagoda_core::LayerIo::validate_batch`] (block ids of the blocks
//! the sequences use within the pools), the element counts of the views by core.

use crate::driver::{Driver, Grow};
use crate::kernel::Kernel;
use pagoda_core::{AttentionConfig, BatchDescriptor, GraphLimits, LayerIo, TensorMut, TensorRef};
use pagoda_cuda_kernels::{AttnParams, Call, Dtype, SplitPlan, WriteKvParams};
use std::ffi::c_void;

/// The kernels' block table entry for "no block" (core's [`BatchDescriptor::PAD_BLOCK`]).
pub const NO_BLOCK: i32 = -1;

/// Offsets or lengths (`u32`) as the kernels' `i32` into `out` (cleared first); a value
/// past `i32::MAX` is an error naming `what`.
pub fn pack_offsets(what: &str, v: &[u32], out: &mut Vec<i32>) -> Result<(), String> {
    out.clear();
    for &x in v {
        out.push(i32::try_from(x).map_err(|_| format!("{what}: {x} does not fit in i32"))?);
    }
    Ok(())
}

/// The block table (`u32`, short rows and graph padding rows filled with
/// [`BatchDescriptor::PAD_BLOCK`]) as the kernels' `i32` into `out`: padding becomes
/// [`NO_BLOCK`]; any other value past `i32::MAX` is an error (no pool has that many
/// blocks). The one conversion of every device path (a GPU's and the emulator's).
pub fn pack_block_table(table: &[u32], out: &mut Vec<i32>) -> Result<(), String> {
    out.clear();
    for &b in table {
        out.push(if b == BatchDescriptor::PAD_BLOCK {
            NO_BLOCK
        } else {
            i32::try_from(b).map_err(|_| format!("block_table: block {b} does not fit in i32"))?
        });
    }
    Ok(())
}

/// A `usize` scalar of a parameter struct.
fn to_i32(what: &str, v: usize) -> Result<i32, String> {
    i32::try_from(v).map_err(|_| format!("{what}: {v} does not fit in i32"))
}

/// Kernels with [`Kernel::vector_io`] (`paged`, `flash`) read q, K, V (and write out)
/// in 16-byte vectors: their base addresses must be multiples of 16 (rows of 64, 128 or 256 elements keep it).
pub fn check_aligned(kernel: &Kernel, addrs: &[(&str, u64)]) -> Result<(), String> {
    if !kernel.vector_io {
        return Ok(());
    }
    match addrs.iter().find(|(_, a)| a % 16 != 0) {
        Some((name, a)) => Err(format!(
            "{name} at {a:#x} is not 16-byte aligned ({} reads 16-byte vectors)",
            kernel.name
        )),
        None => Ok(()),
    }
}

/// Device addresses of the planned step's metadata.
#[derive(Debug, Clone, Copy)]
struct Step {
    query_start_loc: u64,
    seq_lens: u64,
    block_table: u64,
    slot_mapping: u64,
    split: SplitPlan,
    split_out: u64,
    split_lse: u64,
}

/// Host staging of the conversions (reused: no allocation once warm).
#[derive(Debug, Default)]
struct Packed {
    query_start_loc: Vec<i32>,
    seq_lens: Vec<i32>,
    block_table: Vec<i32>,
}

/// A backend's device state: the driver and the step's buffers (see the module docs).
pub(crate) struct DeviceAttn<D: Driver> {
    driver: D,
    query_start_loc: Grow<D::Buf>,
    seq_lens: Grow<D::Buf>,
    block_table: Grow<D::Buf>,
    slot_mapping: Grow<D::Buf>,
    other_slots: Grow<D::Buf>,
    split_out: Grow<D::Buf>,
    split_lse: Grow<D::Buf>,
    step: Option<Step>,
    packed: Packed,
    /// The uploaded slot mapping: `write_kv` reuses the upload when handed the same
    /// values, as the model runner does for every layer of the step.
    planned_slots: Vec<i64>,
}

impl<D: Driver> std::fmt::Debug for DeviceAttn<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceAttn")
            .field("num_sms", &self.driver.num_sms())
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

/// A device address as the pointer type a parameter struct holds.
fn ptr<T>(addr: u64) -> *mut T {
    addr as usize as *mut T
}

impl<D: Driver> DeviceAttn<D> {
    pub(crate) fn new(driver: D) -> Self {
        DeviceAttn {
            driver,
            query_start_loc: Grow::new(),
            seq_lens: Grow::new(),
            block_table: Grow::new(),
            slot_mapping: Grow::new(),
            other_slots: Grow::new(),
            split_out: Grow::new(),
            split_lse: Grow::new(),
            step: None,
            packed: Packed::default(),
            planned_slots: Vec::new(),
        }
    }

    /// The SMs `paged`'s split plan spreads over.
    pub(crate) fn num_sms(&self) -> usize {
        self.driver.num_sms()
    }

    /// Converts and uploads `batch`'s metadata and sizes the split workspace for `split`.
    pub(crate) fn plan(
        &mut self,
        cfg: &AttentionConfig,
        batch: &BatchDescriptor,
        split: SplitPlan,
    ) -> Result<(), String> {
        self.step = None;
        let p = &mut self.packed;
        pack_offsets(
            "query_start_loc",
            batch.query_start_loc(),
            &mut p.query_start_loc,
        )?;
        pack_offsets("seq_lens", batch.seq_lens(), &mut p.seq_lens)?;
        pack_block_table(batch.block_table(), &mut p.block_table)?;
        let d = &self.driver;
        d.bind()?;
        let slots = batch.slot_mapping();
        let (out_len, lse_len) = split.workspace_len(batch.num_reqs(), cfg.num_heads, cfg.head_dim);
        self.step = Some(Step {
            query_start_loc: self.query_start_loc.upload(d, &p.query_start_loc)?,
            seq_lens: self.seq_lens.upload(d, &p.seq_lens)?,
            block_table: self.block_table.upload(d, &p.block_table)?,
            slot_mapping: self.slot_mapping.upload(d, slots)?,
            split,
            split_out: self.split_out.reserve(d, out_len, 4)?,
            split_lse: self.split_lse.reserve(d, lse_len, 4)?,
        });
        self.planned_slots.clear();
        self.planned_slots.extend_from_slice(slots);
        Ok(())
    }

    /// Sizes every metadata buffer and the split workspace (`split_len` floats of
    /// partial outputs and LSEs) for `limits`, then freezes them: captured graphs read
    /// them at these addresses.
    pub(crate) fn lock(
        &mut self,
        limits: &GraphLimits,
        split_len: (usize, usize),
    ) -> Result<(), String> {
        if self.query_start_loc.locked {
            return Ok(());
        }
        let d = &self.driver;
        d.bind()?;
        let reqs = limits.max_num_reqs.max(1);
        self.query_start_loc.reserve(d, reqs + 1, 4)?;
        self.seq_lens.reserve(d, reqs, 4)?;
        self.block_table
            .reserve(d, reqs * limits.max_blocks_per_seq.max(1), 4)?;
        self.slot_mapping
            .reserve(d, limits.max_num_tokens.max(1), 8)?;
        self.split_out.reserve(d, split_len.0.max(1), 4)?;
        self.split_lse.reserve(d, split_len.1.max(1), 4)?;
        for g in [
            &mut self.query_start_loc,
            &mut self.seq_lens,
            &mut self.block_table,
            &mut self.slot_mapping,
            &mut self.split_out,
            &mut self.split_lse,
        ] {
            g.locked = true;
        }
        Ok(())
    }

    /// The planned split plan (tests: what a graph bucket was planned with).
    pub(crate) fn planned_split(&self) -> Option<SplitPlan> {
        self.step.map(|s| s.split)
    }

    /// Launches `kernel` over the planned batch (validated by the caller) in `dtype`.
    pub(crate) fn run(
        &self,
        kernel: &Kernel,
        cfg: &AttentionConfig,
        batch: &BatchDescriptor,
        dtype: Dtype,
        io: LayerIo<'_>,
    ) -> Result<(), String> {
        let step = self.step.ok_or("the step's metadata was not uploaded")?;
        let d = &self.driver;
        let q = d.ref_addr(&io.q, "q")?;
        let k = d.ref_addr(&io.k_cache, "k_cache")?;
        let v = d.ref_addr(&io.v_cache, "v_cache")?;
        let out = d.mut_addr(io.out, "out")?;
        let lse = match io.lse {
            Some(l) => d.mut_addr(l, "lse")?,
            None => 0,
        };
        check_aligned(
            kernel,
            &[("q", q), ("k_cache", k), ("v_cache", v), ("out", out)],
        )?;
        let p = attn_params(cfg, batch, &step, [q, k, v, out, lse])?;
        // SAFETY: every pointer is memory of this device: the views were checked
        // against the batch and the config (lengths, dtypes, device) by
        // `validate_batch`, the metadata was uploaded by `plan` for this very batch
        // (offsets within the token count by the batch's constructor, block ids the
        // sequences use within the pools by `validate_batch`, padding `NO_BLOCK` never
        // read), and the split workspace holds `workspace_len` floats for its plan.
        unsafe { d.launch(&Call::Attn(kernel.compiled, p, dtype))? };
        if kernel.split_kv && p.num_splits > 1 {
            // SAFETY: as above; the partitions were written by the launch before it, in
            // stream order.
            unsafe { d.launch(&Call::MergeStates(p, dtype))? };
        }
        Ok(())
    }

    /// `write_kv` of `k`/`v` (`src` dtype) into the pools (`dst` dtype) at
    /// `slot_mapping`: the planned step's upload when it is the same mapping, else
    /// uploaded now.
    pub(crate) fn write_kv(
        &mut self,
        cfg: &AttentionConfig,
        (k_pool, v_pool): (TensorMut<'_>, TensorMut<'_>),
        (k, v): (TensorRef<'_>, TensorRef<'_>),
        slot_mapping: &[i64],
        (src, dst): (Dtype, Dtype),
    ) -> Result<(), String> {
        let pool_blocks = k_pool.len() / (cfg.block_size * cfg.num_kv_heads * cfg.head_dim);
        let num_slots = (pool_blocks * cfg.block_size) as i64;
        if let Some(bad) = slot_mapping.iter().find(|&&s| s < -1 || s >= num_slots) {
            return Err(format!("slot {bad} outside the pools' {num_slots} slots"));
        }
        let row = cfg.num_kv_heads * cfg.head_dim;
        for (name, len) in [("k", k.len()), ("v", v.len())] {
            if len != slot_mapping.len() * row {
                return Err(format!(
                    "{name} holds {len} elements, {} slots of {row} expected",
                    slot_mapping.len()
                ));
            }
        }
        if v_pool.len() != k_pool.len() || v_pool.dtype() != k_pool.dtype() {
            return Err("the key and value pools differ in size or dtype".into());
        }
        if v.dtype() != k.dtype() {
            return Err(format!("k is {}, v is {}", k.dtype(), v.dtype()));
        }
        let planned = self.step.filter(|_| self.planned_slots == slot_mapping);
        let d = &self.driver;
        let slots = match planned {
            Some(s) => s.slot_mapping,
            None => {
                d.bind()?;
                // Its own buffer: the planned mapping stays valid for the step.
                self.other_slots.upload(d, slot_mapping)?
            }
        };
        let p = WriteKvParams {
            key: ptr::<c_void>(d.ref_addr(&k, "k")?),
            value: ptr::<c_void>(d.ref_addr(&v, "v")?),
            key_cache: ptr(d.mut_addr(k_pool, "k_pool")?),
            value_cache: ptr(d.mut_addr(v_pool, "v_pool")?),
            slot_mapping: ptr(slots),
            num_tokens: to_i32("tokens", slot_mapping.len())?,
            num_kv_heads: to_i32("num_kv_heads", cfg.num_kv_heads)?,
            head_dim: to_i32("head_dim", cfg.head_dim)?,
            block_size: to_i32("block_size", cfg.block_size)?,
            src_dtype: src as i32,
            pad: 0,
        };
        // SAFETY: the views are memory of this device (core's views, the driver's
        // addresses); their lengths and every slot were checked above.
        unsafe { d.launch(&Call::WriteKv(p, dst)) }
    }
}

/// The attention kernels' parameter struct for `batch` planned as `step`, over the
/// addresses `[q, k_cache, v_cache, out, lse]` (`lse` 0: none).
fn attn_params(
    cfg: &AttentionConfig,
    batch: &BatchDescriptor,
    step: &Step,
    [q, k, v, out, lse]: [u64; 5],
) -> Result<AttnParams, String> {
    let one_split = step.split.num_splits <= 1;
    let split_ptr = |a: u64| {
        if one_split {
            std::ptr::null_mut()
        } else {
            ptr(a)
        }
    };
    Ok(AttnParams {
        q: ptr::<c_void>(q),
        key_cache: ptr::<c_void>(k),
        value_cache: ptr::<c_void>(v),
        out: ptr(out),
        lse: ptr(lse),
        query_start_loc: ptr(step.query_start_loc),
        seq_lens: ptr(step.seq_lens),
        block_table: ptr(step.block_table),
        split_out: split_ptr(step.split_out),
        split_lse: split_ptr(step.split_lse),
        seq_begin: 0,
        seq_end: to_i32("num_reqs", batch.num_reqs())?,
        num_heads: to_i32("num_heads", cfg.num_heads)?,
        num_kv_heads: to_i32("num_kv_heads", cfg.num_kv_heads)?,
        head_dim: to_i32("head_dim", cfg.head_dim)?,
        block_size: to_i32("block_size", cfg.block_size)?,
        max_blocks_per_seq: to_i32("block_table_stride", batch.block_table_stride())?,
        max_q_len: to_i32("max_query_len", batch.max_query_len())?,
        num_splits: to_i32("num_splits", step.split.num_splits)?,
        partition_size: to_i32("partition_size", step.split.partition_size)?,
        scale: cfg.scale,
        num_rows: to_i32("num_tokens", batch.num_tokens())?,
        // 0 = none; `runtime_reasons` refused a zero window and a cap that is not
        // positive and finite. A window past i32::MAX keys is no window at all.
        sliding_window: cfg
            .sliding_window
            .map_or(0, |w| i32::try_from(w).unwrap_or(i32::MAX)),
        soft_cap: cfg.logits_soft_cap.unwrap_or(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_becomes_no_block_and_nothing_else_is_truncated() {
        let mut out = Vec::new();
        let pad = BatchDescriptor::PAD_BLOCK;
        pack_block_table(&[0, 7, pad, pad, 3, 0x7fff_ffff], &mut out).unwrap();
        assert_eq!(out, [0, 7, NO_BLOCK, NO_BLOCK, 3, i32::MAX]);
        assert!(pack_block_table(&[1, 0x8000_0000], &mut out).is_err());
        assert!(pack_offsets("x", &[0, u32::MAX], &mut out).is_err());
        pack_offsets("x", &[0, 5, 9], &mut out).unwrap();
        assert_eq!(out, [0, 5, 9]);
    }

    #[test]
    fn vector_kernels_need_16_byte_aligned_buffers() {
        static SCALAR: Kernel = Kernel {
            name: "scalar",
            role: pagoda_core::Role::Both,
            dtypes: &crate::kernel::ALL_DTYPES,
            head_dims: None,
            split_kv: false,
            graph_support: pagoda_core::GraphSupport::Never,
            batch_invariant: None,
            vector_io: false,
            compiled: &pagoda_cuda_kernels::PAGED,
            invariant_rows: None,
        };
        let ok = [("q", 0x1000), ("out", 0x2010)];
        check_aligned(&crate::kernel::PAGED, &ok).unwrap();
        let bad = [("q", 0x1000), ("v_cache", 0x2008)];
        let e = check_aligned(&crate::kernel::PAGED, &bad).unwrap_err();
        assert!(e.contains("v_cache"), "{e}");
        check_aligned(&SCALAR, &bad).unwrap();
    }
}
