//! Launches of the attention kernels on a `cuda:N` device (feature `cuda`).
//!
//! The protocol the CPU backends follow, on the GPU: [`Gpu::plan`] uploads the step's
//! metadata (query offsets, sequence lengths, block table, slot mapping; `u32` → the
//! kernels' `i32`) into device buffers that grow to the largest step seen and are never
//! shrunk, and sizes `paged`'s split workspace; [`Gpu::run`] and [`Gpu::write_kv`] then
//! only fill a parameter struct and launch on the device's engine stream: no
//! allocation, no host synchronization (CUDA-graph friendly). Uploads and launches share
//! that stream with the device runtime's copies, so they are ordered without events.
//! [`Gpu::lock`] sizes the buffers for the engine's limits and freezes them for graphs.
//!
//! The buffers' lengths and indices were checked before a launch: the batch by its
//! constructor and [`pagoda_core::LayerIo::validate_batch`], the element counts of the
//! views by core's device views (`TensorRef::device`), the dtypes by the backend.

use crate::attn::Kernel;
use cudarc::driver::{
    sys, CudaContext, CudaSlice, CudaStream, DevicePtr as _, DeviceRepr, ValidAsZeroBits,
};
use pagoda_core::{
    AttentionConfig, BatchDescriptor, DevicePtr, GraphLimits, LayerIo, TensorMut, TensorRef,
};
use pagoda_cuda_kernels::cuda::CudaKernels;
use pagoda_cuda_kernels::{AttnParams, Dtype, SplitPlan, WriteKvParams};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// A device's shared state: the kernels (context + loaded modules) and the one stream
/// all of Pagoda's work on the device goes to.
type Shared = (usize, Arc<CudaKernels>, Arc<CudaStream>);

fn shared(ordinal: usize) -> Result<Shared, String> {
    static ALL: Mutex<Vec<Shared>> = Mutex::new(Vec::new());
    let mut all = ALL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = all.iter().find(|(o, ..)| *o == ordinal) {
        return Ok(s.clone());
    }
    let k = Arc::new(CudaKernels::new(ordinal).map_err(|e| e.to_string())?);
    // Load every module now: a missing kernel image is a construction error, not a
    // failure in the middle of a step.
    k.preload().map_err(|e| e.to_string())?;
    let stream = k
        .context()
        .new_stream()
        .map_err(|e| format!("creating a stream: {e}"))?;
    // SAFETY: every use of this context's buffers by Pagoda is enqueued on `stream`
    // (the runtime's copies, the kernels, cuBLAS, CUTLASS), so stream order alone
    // orders them; cudarc's per-buffer events exist for several streams, and events
    // recorded outside a capture cannot be waited on inside one (CUDA graphs).
    unsafe { k.context().disable_event_tracking() };
    all.push((ordinal, k, stream));
    Ok(all.last().expect("pushed").clone())
}

/// One [`CudaKernels`] (context + loaded modules) per device ordinal, shared by every
/// backend of the process: modules load once, and all launches use the context the
/// device runtime allocates in (the device's primary context).
pub(crate) fn kernels(ordinal: usize) -> Result<Arc<CudaKernels>, String> {
    shared(ordinal).map(|s| s.1)
}

/// The stream every copy, kernel and GEMM of Pagoda on `cuda:ordinal` is enqueued on:
/// not the legacy default stream, which cannot be captured into a CUDA graph, and one
/// stream, so that its order is the only order needed.
pub(crate) fn engine_stream(ordinal: usize) -> Result<Arc<CudaStream>, String> {
    shared(ordinal).map(|s| s.2)
}

/// The streaming multiprocessors of the context's device (`paged`'s split plan).
fn num_sms(ctx: &CudaContext) -> Result<usize, String> {
    let n = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| e.to_string())?;
    Ok(usize::try_from(n).unwrap_or(1).max(1))
}

/// A device buffer that grows (to a power of two) and is never shrunk; once locked
/// (CUDA graphs read it at its captured address) it does not move: a step that needs
/// more is an error.
struct Grow<T> {
    buf: Option<CudaSlice<T>>,
    locked: bool,
}

impl<T: DeviceRepr + ValidAsZeroBits> Grow<T> {
    fn new() -> Self {
        Grow {
            buf: None,
            locked: false,
        }
    }

    /// At least `len` elements; their device address (0 when `len` is 0).
    fn reserve(&mut self, stream: &Arc<CudaStream>, len: usize) -> Result<u64, String> {
        if len == 0 {
            return Ok(0);
        }
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            if self.locked {
                return Err(format!(
                    "{len} elements exceed the {} reserved for CUDA graphs",
                    self.buf.as_ref().map_or(0, |b| b.len())
                ));
            }
            self.buf = None; // free first: the old contents are not needed
            let b = stream
                .alloc_zeros::<T>(len.next_power_of_two())
                .map_err(|e| format!("allocating {len} elements: {e}"))?;
            self.buf = Some(b);
        }
        let b = self.buf.as_ref().expect("allocated above");
        let (addr, _sync) = b.device_ptr(stream);
        Ok(addr)
    }

    /// Copies `data` to the start of the buffer (growing it first); its device address.
    fn upload(&mut self, stream: &Arc<CudaStream>, data: &[T]) -> Result<u64, String> {
        let addr = self.reserve(stream, data.len())?;
        if let Some(b) = self.buf.as_mut().filter(|_| !data.is_empty()) {
            let mut head = b.slice_mut(0..data.len());
            stream
                .memcpy_htod(data, &mut head)
                .map_err(|e| format!("uploading {} elements: {e}", data.len()))?;
        }
        Ok(addr)
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

/// A backend's device state: the kernels, the stream, and the step's buffers.
pub(crate) struct Gpu {
    kernels: Arc<CudaKernels>,
    stream: Arc<CudaStream>,
    num_sms: usize,
    query_start_loc: Grow<i32>,
    seq_lens: Grow<i32>,
    block_table: Grow<i32>,
    slot_mapping: Grow<i64>,
    other_slots: Grow<i64>,
    split_out: Grow<f32>,
    split_lse: Grow<f32>,
    step: Option<Step>,
    /// The uploaded slot mapping: `write_kv` reuses the upload when handed the same
    /// values, as the model runner does for every layer of the step.
    planned_slots: Vec<i64>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("kernels", &self.kernels)
            .field("num_sms", &self.num_sms)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

/// `u32` metadata as the kernels' `i32` (the batch constructor bounds every value by
/// the token count, the context length or the pool size, all far below `i32::MAX`).
fn as_i32(what: &str, v: &[u32]) -> Result<Vec<i32>, String> {
    v.iter()
        .map(|&x| i32::try_from(x).map_err(|_| format!("{what}: {x} does not fit in i32")))
        .collect()
}

fn to_i32(what: &str, v: usize) -> Result<i32, String> {
    i32::try_from(v).map_err(|_| format!("{what}: {v} does not fit in i32"))
}

fn addr_ref(t: &TensorRef<'_>, name: &str) -> Result<DevicePtr, String> {
    t.device_ptr()
        .ok_or_else(|| format!("{name} is host memory, not on the CUDA device"))
}

fn addr_mut(t: &TensorMut<'_>, name: &str) -> Result<DevicePtr, String> {
    t.device_ptr()
        .ok_or_else(|| format!("{name} is host memory, not on the CUDA device"))
}

/// A device address as the pointer type a parameter struct holds.
fn ptr<T>(addr: u64) -> *mut T {
    addr as usize as *mut T
}

impl Gpu {
    /// The state for `cuda:ordinal`, or why the device cannot launch.
    pub(crate) fn new(ordinal: usize) -> Result<Self, String> {
        let kernels = kernels(ordinal)?;
        let stream = engine_stream(ordinal)?;
        let num_sms = num_sms(kernels.context())?;
        Ok(Gpu {
            kernels,
            stream,
            num_sms,
            query_start_loc: Grow::new(),
            seq_lens: Grow::new(),
            block_table: Grow::new(),
            slot_mapping: Grow::new(),
            other_slots: Grow::new(),
            split_out: Grow::new(),
            split_lse: Grow::new(),
            step: None,
            planned_slots: Vec::new(),
        })
    }

    /// The SMs `paged`'s split plan spreads over.
    pub(crate) fn num_sms(&self) -> usize {
        self.num_sms
    }

    /// Uploads `batch`'s metadata and sizes the split workspace for `split`.
    pub(crate) fn plan(
        &mut self,
        cfg: &AttentionConfig,
        batch: &BatchDescriptor,
        split: SplitPlan,
    ) -> Result<(), String> {
        self.step = None;
        self.kernels
            .context()
            .bind_to_thread()
            .map_err(|e| e.to_string())?;
        let s = &self.stream;
        let qsl = as_i32("query_start_loc", batch.query_start_loc())?;
        let lens = as_i32("seq_lens", batch.seq_lens())?;
        let table = as_i32("block_table", batch.block_table())?;
        let slots = batch.slot_mapping();
        let (out_len, lse_len) = split.workspace_len(batch.num_reqs(), cfg.num_heads, cfg.head_dim);
        self.step = Some(Step {
            query_start_loc: self.query_start_loc.upload(s, &qsl)?,
            seq_lens: self.seq_lens.upload(s, &lens)?,
            block_table: self.block_table.upload(s, &table)?,
            slot_mapping: self.slot_mapping.upload(s, slots)?,
            split,
            split_out: self.split_out.reserve(s, out_len)?,
            split_lse: self.split_lse.reserve(s, lse_len)?,
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
        self.kernels
            .context()
            .bind_to_thread()
            .map_err(|e| e.to_string())?;
        let s = &self.stream;
        let reqs = limits.max_num_reqs.max(1);
        self.query_start_loc.reserve(s, reqs + 1)?;
        self.seq_lens.reserve(s, reqs)?;
        self.block_table
            .reserve(s, reqs * limits.max_blocks_per_seq.max(1))?;
        self.slot_mapping.reserve(s, limits.max_num_tokens.max(1))?;
        self.split_out.reserve(s, split_len.0.max(1))?;
        self.split_lse.reserve(s, split_len.1.max(1))?;
        self.query_start_loc.locked = true;
        self.seq_lens.locked = true;
        self.block_table.locked = true;
        self.slot_mapping.locked = true;
        self.split_out.locked = true;
        self.split_lse.locked = true;
        Ok(())
    }

    /// Launches `kernel` over the planned batch (validated by the caller) in `dtype`.
    pub(crate) fn run(
        &self,
        kernel: Kernel,
        cfg: &AttentionConfig,
        batch: &BatchDescriptor,
        dtype: Dtype,
        io: LayerIo<'_>,
    ) -> Result<(), String> {
        let step = self.step.ok_or("the step's metadata was not uploaded")?;
        let lse = match &io.lse {
            Some(l) => ptr(addr_mut(l, "lse")?.addr),
            None => std::ptr::null_mut(),
        };
        let one_split = step.split.num_splits <= 1;
        let p = AttnParams {
            q: ptr::<c_void>(addr_ref(&io.q, "q")?.addr),
            key_cache: ptr::<c_void>(addr_ref(&io.k_cache, "k_cache")?.addr),
            value_cache: ptr::<c_void>(addr_ref(&io.v_cache, "v_cache")?.addr),
            out: ptr(addr_mut(&io.out, "out")?.addr),
            lse,
            query_start_loc: ptr(step.query_start_loc),
            seq_lens: ptr(step.seq_lens),
            block_table: ptr(step.block_table),
            split_out: if one_split {
                std::ptr::null_mut()
            } else {
                ptr(step.split_out)
            },
            split_lse: if one_split {
                std::ptr::null_mut()
            } else {
                ptr(step.split_lse)
            },
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
        };
        let (k, s) = (&self.kernels, &*self.stream);
        // SAFETY: every pointer is device memory of this context: the views were checked
        // against the batch and the config (lengths, dtypes, device) by `validate_batch`,
        // the metadata was uploaded by `plan` for this very batch (offsets within the
        // token count by the batch's constructor, block ids within the pools by
        // `validate_batch`), and the
        // split workspace holds `workspace_len` floats for its plan.
        unsafe {
            match kernel {
                Kernel::Naive => k.naive(s, &p, dtype),
                Kernel::Paged => k.paged(s, &p, dtype),
                Kernel::Flash => k.flash(s, &p, dtype),
            }
        }
        .map_err(|e| e.to_string())
    }

    /// `write_kv` of `k`/`v` (`src` dtype) into the pools (`dst` dtype) at
    /// `slot_mapping`: the planned step's upload when it is the same mapping, else
    /// uploaded now.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_kv(
        &mut self,
        cfg: &AttentionConfig,
        k_pool: TensorMut<'_>,
        v_pool: TensorMut<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
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
        let slots = match planned {
            Some(s) => s.slot_mapping,
            None => {
                self.kernels
                    .context()
                    .bind_to_thread()
                    .map_err(|e| e.to_string())?;
                // Its own buffer: the planned mapping stays valid for the step.
                self.other_slots.upload(&self.stream, slot_mapping)?
            }
        };
        let p = WriteKvParams {
            key: ptr::<c_void>(addr_ref(&k, "k")?.addr),
            value: ptr::<c_void>(addr_ref(&v, "v")?.addr),
            key_cache: ptr(addr_mut(&k_pool, "k_pool")?.addr),
            value_cache: ptr(addr_mut(&v_pool, "v_pool")?.addr),
            slot_mapping: ptr(slots),
            num_tokens: to_i32("tokens", slot_mapping.len())?,
            num_kv_heads: to_i32("num_kv_heads", cfg.num_kv_heads)?,
            head_dim: to_i32("head_dim", cfg.head_dim)?,
            block_size: to_i32("block_size", cfg.block_size)?,
            src_dtype: src as i32,
            pad: 0,
        };
        // SAFETY: the views are device memory of this context (core's device views);
        // their lengths and every slot were checked above.
        unsafe { self.kernels.write_kv(&self.stream, &p, dst) }.map_err(|e| e.to_string())
    }
}
