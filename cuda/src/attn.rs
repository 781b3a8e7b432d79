//! The backend type of every CUDA attention backend: one [`CudaAttention`]
//! parameterised by its [`Kernel`], a description that the library's split-KV decode
//! kernel ([`PAGED`]) and a backend crate's own (`.cu` in its folder: `cuda-naive`,
//! `cuda-flash`, any other) give alike, each launched as
//! [`Call::Attn`](pagoda_cuda_kernels::Call::Attn) (the description: `kernel.rs`).
//!
//! * [`AttentionBackend::plan`] checks the batch against the kernel's role, copies its
//!   metadata (offsets, lengths, block table) and picks `paged`'s split plan: once
//!   per step, shared by every layer's `run`. The plan is fixed 256-key partitions
//!   ([`SplitPlan::fixed`]: `cuda-paged` is batch-invariant), or, opted into with
//!   [`CudaAttention::with_adaptive_splits`], sized to the batch and the SMs.
//! * [`AttentionBackend::run`] validates the layer's buffers
//!   ([`LayerIo::validate_batch`]) and launches. One device code path for both devices
//!   (`device.rs`): `plan` converts and uploads the metadata once, `run` packs the
//!   parameter struct and launches (no allocation, no host synchronization); only the
//!   driver differs: on `emu` host memory and the SIMT emulator of
//!   `pagoda-cuda-kernels`, on `cuda:N` (feature `cuda`) cudarc (`gpu.rs`).
//! * [`AttentionBackend::write_kv`] runs the `write_kv` kernel (any source dtype into
//!   the pools' dtype).
//!
//! Every kernel takes one element type for q, out and the cache, so the q and KV dtypes
//! must be equal ([`runtime_reasons`]). The kernels serve sliding windows and logit
//! soft-capping with `naive`'s semantics: a query at position `pos` sees keys
//! `pos + 1 - w..=pos` under a window `w`, and a scaled score `s` becomes
//! `cap * tanh(s / cap)` before the softmax.

pub use crate::batch_invariant::{batch_invariant_env, BATCH_INVARIANT_ENV};
use crate::device::DeviceAttn;
use crate::driver::EmuDriver;
use crate::kernel::kernel_dtype;
pub use crate::kernel::{runtime_reasons, Kernel, ALL_DTYPES, EMU_SMS, PAGED, PAGED_FIXED_SPLITS};
use pagoda_core::{
    AttentionBackend, AttentionConfig, BatchDescriptor, CoreError, Device, GraphLimits,
    GraphSupport, InvalidReason, LayerIo, TensorMut, TensorRef,
};
use pagoda_cuda_kernels::SplitPlan;

/// The step's metadata, built by `plan`.
#[derive(Debug)]
struct Planned {
    batch: BatchDescriptor,
}

/// The device code path (`device.rs`) with its driver.
#[derive(Debug)]
enum Dev {
    // Both boxed: the states are large and of different sizes.
    Emu(Box<DeviceAttn<EmuDriver>>),
    #[cfg(feature = "cuda")]
    Cuda(Box<DeviceAttn<crate::gpu::CudaDriver>>),
}

/// `$d` is the backend's [`DeviceAttn`], whichever its driver.
macro_rules! on_dev {
    ($dev:expr, $d:ident => $e:expr) => {
        match $dev {
            Dev::Emu($d) => $e,
            #[cfg(feature = "cuda")]
            Dev::Cuda($d) => $e,
        }
    };
}

/// A CUDA attention backend (see the module docs).
#[derive(Debug)]
pub struct CudaAttention {
    name: &'static str,
    kernel: &'static Kernel,
    cfg: AttentionConfig,
    plan: Option<Planned>,
    /// The limits the buffers were sized and locked for by the first `plan_graph`.
    graph_limits: Option<GraphLimits>,
    /// The device state: the step's buffers and the driver that launches.
    dev: Dev,
    /// `paged` splits keys at fixed positions ([`SplitPlan::fixed`], batch-invariant,
    /// the default) rather than by the batch and the SM count.
    fixed_splits: bool,
    /// `flash` runs each prefill token as a decode row of `paged.cu` with fixed
    /// splits, so that a query row has one arithmetic whether it comes in a
    /// prompt chunk, after a prefix hit, or as a decode row
    /// ([`CudaAttention::with_paged_rows`], `VLLM_BATCH_INVARIANT=1`).
    paged_rows: bool,
}

/// The decode rows of `batch`'s query tokens: token `t` of a request with `q`
/// query tokens over `s` keys is a row over its first `s - q + t + 1` keys, with
/// the request's block table (causal attention, one row per token, in order).
pub fn as_decode_rows(batch: &BatchDescriptor) -> Result<BatchDescriptor, CoreError> {
    let (qsl, seq, stride) = (
        batch.query_start_loc(),
        batch.seq_lens(),
        batch.block_table_stride(),
    );
    let bs = batch.block_size();
    let (mut lens, mut rows): (Vec<usize>, Vec<&[u32]>) = (Vec::new(), Vec::new());
    for r in 0..batch.num_reqs() {
        let q = (qsl[r + 1] - qsl[r]) as usize;
        let s = seq[r] as usize;
        let table = &batch.block_table()[r * stride..(r + 1) * stride];
        for t in 0..q {
            let keys = s - q + t + 1;
            lens.push(keys);
            rows.push(&table[..keys.div_ceil(bs)]);
        }
    }
    BatchDescriptor::new(bs, &vec![1; lens.len()], &lens, &rows)
}

fn failed(backend: &str, e: impl std::fmt::Display) -> CoreError {
    CoreError::BackendFailed {
        backend: backend.into(),
        message: e.to_string(),
    }
}

impl CudaAttention {
    /// A backend named `name` launching `kernel` for `cfg`, or why it cannot.
    pub fn new(
        name: &'static str,
        kernel: &'static Kernel,
        cfg: &AttentionConfig,
    ) -> Result<Self, CoreError> {
        let mut reasons = runtime_reasons(kernel, cfg);
        reasons.extend(kernel.capabilities().reasons(cfg, kernel.role));
        if !reasons.is_empty() {
            return Err(CoreError::BackendInvalid {
                backend: name.into(),
                reasons,
            });
        }
        let dev = match cfg.device {
            Device::Emu => Dev::Emu(Box::new(DeviceAttn::new(EmuDriver::new(EMU_SMS)))),
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => {
                let invalid = |message| CoreError::BackendInvalid {
                    backend: name.into(),
                    reasons: vec![InvalidReason::Other { message }],
                };
                let driver = crate::gpu::CudaDriver::new(ordinal).map_err(invalid)?;
                for k in std::iter::once(kernel).chain(kernel.invariant_rows) {
                    driver.load_attn(k.compiled).map_err(invalid)?;
                }
                Dev::Cuda(Box::new(DeviceAttn::new(driver)))
            }
            d => {
                return Err(CoreError::BackendInvalid {
                    backend: name.into(),
                    reasons: vec![InvalidReason::Other {
                        message: format!("no CUDA kernel launcher for device {d}"),
                    }],
                })
            }
        };
        Ok(CudaAttention {
            name,
            kernel,
            cfg: cfg.clone(),
            plan: None,
            graph_limits: None,
            dev,
            fixed_splits: true,
            paged_rows: kernel.invariant_rows.is_some() && batch_invariant_env(),
        })
    }

    /// `flash` that runs each prefill token as a fixed-split `paged.cu` decode row
    /// (what `VLLM_BATCH_INVARIANT=1` selects; generally: a kernel with
    /// [`Kernel::invariant_rows`] serves its rows with that kernel): the same bits as
    /// `cuda-paged` for the same query row, so it declares `cuda-paged`'s arithmetic.
    /// Slower for long prompts (every token reads its keys again instead of sharing a
    /// tile's).
    pub fn with_paged_rows(mut self) -> Self {
        self.paged_rows = self.kernel.invariant_rows.is_some();
        self
    }

    /// The kernel `run` launches: its invariant rows' (`paged` for `flash`) with paged
    /// rows.
    fn launched(&self) -> &'static Kernel {
        match self.kernel.invariant_rows {
            Some(rows) if self.paged_rows => rows,
            _ => self.kernel,
        }
    }

    /// `paged` with the split plan sized to the batch and the SMs
    /// ([`SplitPlan::choose`], [`SplitPlan::for_graph`]: partitions of at least 256
    /// keys, as many as fill the device) instead of the fixed 256-key partitions: the
    /// plan before batch invariance, kept for A/B measurements. A row's bits then
    /// depend on the batch (its partitions do), and the backend declares no
    /// invariance.
    pub fn with_adaptive_splits(mut self) -> Self {
        self.fixed_splits = false;
        self
    }

    /// The SMs `paged`'s split plan spreads over: the device's, or [`EMU_SMS`].
    fn num_sms(&self) -> usize {
        on_dev!(&self.dev, d => d.num_sms())
    }

    /// The split plan of the planned step (`None` before a plan): what a graph bucket
    /// was planned with, for tests.
    pub fn planned_split(&self) -> Option<SplitPlan> {
        on_dev!(&self.dev, d => d.planned_split())
    }

    /// The split plan of a decode batch of `num_reqs` requests over `max_seq_len` keys:
    /// fixed partitions covering it, or (adaptive) for this step's longest sequence
    /// (eager) or a graph bucket covering the limit ([`SplitPlan::for_graph`]: fine
    /// enough for short contexts).
    fn split_plan(&self, max_seq_len: usize, num_reqs: usize, graph: bool) -> SplitPlan {
        // Under a window a decode row attends to its last `w` keys only: the plan
        // covers those (the kernel starts the partitions at the window).
        let keys = SplitPlan::keys(max_seq_len, self.cfg.sliding_window);
        let bs = self.cfg.block_size;
        if !self.launched().split_kv {
            return SplitPlan::single(keys, bs);
        }
        let groups = self.cfg.num_kv_heads
            * self
                .cfg
                .gqa_ratio()
                .div_ceil(pagoda_cuda_kernels::PAGED_MAX_GROUP);
        let (ctas, sms) = (num_reqs * groups, self.num_sms());
        if self.fixed_splits {
            SplitPlan::fixed(keys, bs)
        } else if graph {
            SplitPlan::for_graph(keys, bs, ctas, sms)
        } else {
            SplitPlan::choose(keys, bs, ctas, sms)
        }
    }

    /// The plan of `batch` with `split`: metadata into the backend's buffers.
    fn plan_with(&mut self, batch: &BatchDescriptor, split: SplitPlan) -> Result<(), CoreError> {
        let cfg = &self.cfg;
        on_dev!(&mut self.dev, d => d.plan(cfg, batch, split)).map_err(|e| failed(self.name, e))?;
        self.plan = Some(Planned {
            batch: batch.clone(),
        });
        Ok(())
    }
}

impl AttentionBackend for CudaAttention {
    fn name(&self) -> &str {
        self.name
    }

    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError> {
        self.plan = None;
        self.kernel
            .capabilities()
            .check_batch(self.name, &self.cfg, batch)?;
        if self.paged_rows {
            let rows = as_decode_rows(batch)?;
            let split = self.split_plan(rows.max_seq_len(), rows.num_reqs(), false);
            return self.plan_with(&rows, split);
        }
        let split = self.split_plan(batch.max_seq_len(), batch.num_reqs(), false);
        self.plan_with(batch, split)
    }

    /// The launched kernel's declaration ([`Kernel::batch_invariant`]): `cuda-paged`
    /// with fixed splits (a decode row's partitions and merge order depend on its
    /// position only), `cuda-flash` with paged rows; a split-KV kernel under adaptive
    /// splits claims nothing (its partitions follow the batch).
    fn batch_invariant(&self) -> Option<&'static str> {
        let k = self.launched();
        if k.split_kv && !self.fixed_splits {
            return None;
        }
        k.batch_invariant
    }

    fn graph_support(&self) -> GraphSupport {
        self.kernel.graph_support
    }

    fn plan_graph(
        &mut self,
        batch: &BatchDescriptor,
        limits: &GraphLimits,
    ) -> Result<(), CoreError> {
        self.plan = None;
        if self.graph_support() == GraphSupport::Never {
            return Err(CoreError::GraphUnsupported {
                what: format!("attention backend `{}`", self.name),
            });
        }
        if batch.num_decode_reqs() != batch.num_reqs() || batch.max_seq_len() > limits.max_seq_len {
            return Err(CoreError::Graph {
                message: format!(
                    "`{}` captures decode-only batches of at most {} tokens per sequence",
                    self.name, limits.max_seq_len
                ),
            });
        }
        self.kernel
            .capabilities()
            .check_batch(self.name, &self.cfg, batch)?;
        // The split depends on the bucket and the limit only, never on this step's
        // lengths: partitions past a sequence's end are empty (lse -inf, weight 0).
        let split = self.split_plan(limits.max_seq_len, batch.num_reqs(), true);
        if self.graph_limits.is_none() {
            // Size the workspace for the largest any bucket needs, then freeze the
            // buffers (eager steps stay within the same limits).
            let (heads, hd) = (self.cfg.num_heads, self.cfg.head_dim);
            let need = (1..=limits.max_num_reqs)
                .map(|r| {
                    self.split_plan(limits.max_seq_len, r, true)
                        .workspace_len(r, heads, hd)
                })
                .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)));
            on_dev!(&mut self.dev, d => d.lock(limits, need)).map_err(|e| failed(self.name, e))?;
            self.graph_limits = Some(*limits);
        } else if self.graph_limits != Some(*limits) {
            return Err(CoreError::Graph {
                message: format!(
                    "`{}` was locked for {:?}, not {limits:?}",
                    self.name, self.graph_limits
                ),
            });
        }
        self.plan_with(batch, split)
    }

    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        let p = self.plan.as_ref().ok_or_else(|| CoreError::NotPlanned {
            backend: self.name.into(),
        })?;
        io.validate_batch(&p.batch, &self.cfg)?;
        let dtype = kernel_dtype(self.cfg.q_dtype)?;
        let (kernel, cfg) = (self.launched(), &self.cfg);
        on_dev!(&self.dev, d => d.run(kernel, cfg, &p.batch, dtype, io))
            .map_err(|e| failed(self.name, e))
    }

    fn write_kv(
        &mut self,
        k_pool: TensorMut<'_>,
        v_pool: TensorMut<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
        slot_mapping: &[i64],
        slot_elems: usize,
    ) -> Result<(), CoreError> {
        let row = self.cfg.num_kv_heads * self.cfg.head_dim;
        if slot_elems != row {
            return Err(CoreError::ShapeMismatch {
                name: "slot_elems",
                expected: row,
                actual: slot_elems,
            });
        }
        for (name, d) in [
            ("k_pool", k_pool.device_of()),
            ("v_pool", v_pool.device_of()),
        ]
        .into_iter()
        .chain([("k", k.device_of()), ("v", v.device_of())])
        {
            if d != self.cfg.device {
                return Err(CoreError::DeviceMismatch {
                    name,
                    expected: self.cfg.device,
                    actual: d,
                });
            }
        }
        let dtypes = (kernel_dtype(k.dtype())?, kernel_dtype(k_pool.dtype())?);
        let cfg = &self.cfg;
        let (pools, kv) = ((k_pool, v_pool), (k, v));
        on_dev!(&mut self.dev, d => d.write_kv(cfg, pools, kv, slot_mapping, dtypes))
            .map_err(|e| failed(self.name, e))
    }
}
