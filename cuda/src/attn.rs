//! The backend type behind `cuda-naive`, `cuda-paged` and `cuda-flash`: one
//! [`CudaAttention`] parameterised by its [`Kernel`].
//!
//! * [`AttentionBackend::plan`] checks the batch against the kernel's role, copies its
//!   metadata (offsets, lengths, block table) and picks `paged`'s split plan: once
//!   per step, shared by every layer's `run`.
//! * [`AttentionBackend::run`] validates the layer's buffers
//!   ([`LayerIo::validate_batch`]) and launches. On the `emu` device the buffers are
//!   host slices and the kernels run through the SIMT emulator of `pagoda-cuda-kernels`;
//!   on `cuda:N` (feature `cuda`) `plan` uploads the metadata once and `run` only
//!   launches (`gpu.rs`: no allocation, no host synchronization).
//! * [`AttentionBackend::write_kv`] runs the `write_kv` kernel (any source dtype into
//!   the pools' dtype).
//!
//! Every kernel takes one element type for q, out and the cache, so the q and KV dtypes
//! must be equal ([`runtime_reasons`]). All three kernels serve sliding windows and
//! logit soft-capping with `naive`'s semantics: a query at position `pos` sees keys
//! `pos + 1 - w..=pos` under a window `w`, and a scaled score `s` becomes
//! `cap * tanh(s / cap)` before the softmax.

use crate::runtime::{cuda_unavailable, COMPILED};
use half::{bf16, f16};
use pagoda_core::{
    AttentionBackend, AttentionConfig, BatchDescriptor, Capabilities, CoreError, DType, Device,
    DeviceKind, HostElem, InvalidReason, LayerIo, TensorMut, TensorRef,
};
use pagoda_cuda_kernels::emu::{self, Batch, Io, Shape};
use pagoda_cuda_kernels::{flash_head_dims, paged_head_dims, Dtype, Element, SplitPlan};

/// Which kernel a backend launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// `naive.cu`: any head dim and block size, f32/bf16/f16, decode and prefill.
    Naive,
    /// `paged.cu`: split-KV decode.
    Paged,
    /// `flash.cu`: tensor-core prefill, bf16/f16.
    Flash,
}

/// The SMs `paged`'s split plan assumes on the emulator: small, so that tests see
/// several splits (and the merge kernel) on short contexts.
pub const EMU_SMS: usize = 2;

const ALL_DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

fn kernel_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::BF16 => Dtype::Bf16,
        DType::F16 => Dtype::F16,
    }
}

impl Kernel {
    /// The head dims with a kernel for `dtype` (`None`: any).
    pub fn head_dims(self, dtype: DType) -> Option<Vec<usize>> {
        match self {
            Kernel::Naive => None,
            Kernel::Paged => Some(paged_head_dims(kernel_dtype(dtype)).to_vec()),
            Kernel::Flash => Some(flash_head_dims(kernel_dtype(dtype)).to_vec()),
        }
    }

    /// What the kernel serves on `cuda` and `emu`: for paged and flash the head dims
    /// are those of any dtype; [`runtime_reasons`] narrows them per dtype.
    pub fn capabilities(self) -> Capabilities {
        let dtypes: Vec<DType> = match self {
            Kernel::Flash => vec![DType::BF16, DType::F16],
            _ => ALL_DTYPES.to_vec(),
        };
        let head_dims = match self {
            Kernel::Naive => None,
            _ => {
                let mut all: Vec<usize> = dtypes
                    .iter()
                    .flat_map(|&d| self.head_dims(d).unwrap_or_default())
                    .collect();
                all.sort_unstable();
                all.dedup();
                Some(all)
            }
        };
        Capabilities {
            devices: vec![DeviceKind::Cuda, DeviceKind::Emu],
            q_dtypes: dtypes.clone(),
            kv_dtypes: dtypes,
            head_dims,
            block_sizes: None,
            max_gqa_ratio: None,
            sliding_window: true,
            logits_soft_cap: true,
            decode: self != Kernel::Flash,
            prefill: self != Kernel::Paged,
            returns_lse: true,
        }
    }
}

/// What capabilities cannot say: q and KV of one dtype, the kernel's head dims for that
/// dtype, a window of at least one key and a positive finite soft cap (what the kernels
/// can express), and for `cuda` devices why they cannot be used here.
pub fn runtime_reasons(kernel: Kernel, cfg: &AttentionConfig) -> Vec<InvalidReason> {
    let mut r = Vec::new();
    if cfg.sliding_window == Some(0) {
        r.push(InvalidReason::Other {
            message: "the CUDA kernels need a sliding window of at least one key".into(),
        });
    }
    if let Some(cap) = cfg.logits_soft_cap {
        if !(cap.is_finite() && cap > 0.0) {
            r.push(InvalidReason::Other {
                message: format!("the CUDA kernels need a positive finite soft cap, not {cap}"),
            });
        }
    }
    if cfg.q_dtype != cfg.kv_dtype {
        r.push(InvalidReason::Other {
            message: format!(
                "the CUDA kernels take one dtype for q and the KV cache (q {}, KV {})",
                cfg.q_dtype, cfg.kv_dtype
            ),
        });
    }
    if let Some(supported) = kernel.head_dims(cfg.q_dtype) {
        if !supported.contains(&cfg.head_dim) && !supported.is_empty() {
            r.push(InvalidReason::HeadDimUnsupported {
                head_dim: cfg.head_dim,
                supported,
            });
        }
    }
    if cfg.device.kind() == DeviceKind::Cuda {
        if !COMPILED {
            r.push(InvalidReason::NotCompiled { feature: "cuda" });
        } else if let Some(message) = cuda_unavailable() {
            r.push(InvalidReason::Other { message });
        }
    }
    r
}

/// The step's metadata, built by `plan`.
#[derive(Debug)]
struct Planned {
    batch: BatchDescriptor,
    split: SplitPlan,
}

/// A CUDA attention backend (see the module docs).
#[derive(Debug)]
pub struct CudaAttention {
    name: &'static str,
    kernel: Kernel,
    cfg: AttentionConfig,
    plan: Option<Planned>,
    /// The device state on `cuda:N` (`None` on `emu`).
    #[cfg(feature = "cuda")]
    gpu: Option<crate::gpu::Gpu>,
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
        kernel: Kernel,
        cfg: &AttentionConfig,
    ) -> Result<Self, CoreError> {
        let role = match kernel {
            Kernel::Naive => pagoda_core::Role::Both,
            Kernel::Paged => pagoda_core::Role::Decode,
            Kernel::Flash => pagoda_core::Role::Prefill,
        };
        let mut reasons = runtime_reasons(kernel, cfg);
        reasons.extend(kernel.capabilities().reasons(cfg, role));
        if !reasons.is_empty() {
            return Err(CoreError::BackendInvalid {
                backend: name.into(),
                reasons,
            });
        }
        #[cfg(feature = "cuda")]
        let gpu = match cfg.device {
            Device::Cuda(ordinal) => Some(crate::gpu::Gpu::new(ordinal).map_err(|message| {
                CoreError::BackendInvalid {
                    backend: name.into(),
                    reasons: vec![InvalidReason::Other { message }],
                }
            })?),
            _ => None,
        };
        Ok(CudaAttention {
            name,
            kernel,
            cfg: cfg.clone(),
            plan: None,
            #[cfg(feature = "cuda")]
            gpu,
        })
    }

    /// The SMs `paged`'s split plan spreads over: the device's, or [`EMU_SMS`].
    fn num_sms(&self) -> usize {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            return g.num_sms();
        }
        EMU_SMS
    }

    fn shape(&self) -> Shape {
        Shape {
            num_heads: self.cfg.num_heads,
            num_kv_heads: self.cfg.num_kv_heads,
            head_dim: self.cfg.head_dim,
            block_size: self.cfg.block_size,
            scale: self.cfg.scale,
            sliding_window: self.cfg.sliding_window,
            soft_cap: self.cfg.logits_soft_cap,
        }
    }

    fn run_emu<T: Element + HostElem>(
        &self,
        p: &Planned,
        io: LayerIo<'_>,
    ) -> Result<(), CoreError> {
        let b = &p.batch;
        let batch = Batch {
            query_start_loc: b.query_start_loc(),
            seq_lens: b.seq_lens(),
            block_table: b.block_table(),
            max_blocks_per_seq: b.block_table_stride(),
            seqs: 0..b.num_reqs(),
        };
        let io = Io {
            q: io.q.as_host::<T>("q")?,
            key_cache: io.k_cache.as_host::<T>("k_cache")?,
            value_cache: io.v_cache.as_host::<T>("v_cache")?,
            out: io.out.into_host::<T>("out")?,
            lse: io.lse.map(|l| l.into_host::<f32>("lse")).transpose()?,
        };
        let shape = self.shape();
        match self.kernel {
            Kernel::Naive => emu::naive(io, &batch, &shape),
            Kernel::Paged => emu::paged(io, &batch, &shape, p.split),
            Kernel::Flash => emu::flash(io, &batch, &shape),
        }
        .map_err(|e| failed(self.name, e))
    }
}

fn write_kv_emu<S: Element + HostElem, T: Element + HostElem>(
    k_pool: TensorMut<'_>,
    v_pool: TensorMut<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    slot_mapping: &[i64],
    shape: &Shape,
) -> Result<Result<(), pagoda_cuda_kernels::Error>, CoreError> {
    Ok(emu::write_kv(
        k.as_host::<S>("k")?,
        v.as_host::<S>("v")?,
        k_pool.into_host::<T>("k_pool")?,
        v_pool.into_host::<T>("v_pool")?,
        slot_mapping,
        shape,
    ))
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
        // Under a window a decode row attends to its last `w` keys only: the plan
        // covers those (the kernel starts the partitions at the window).
        let keys = SplitPlan::keys(batch.max_seq_len(), self.cfg.sliding_window);
        let split = match self.kernel {
            Kernel::Paged => {
                let groups = self.cfg.num_kv_heads
                    * self
                        .cfg
                        .gqa_ratio()
                        .div_ceil(pagoda_cuda_kernels::PAGED_MAX_GROUP);
                SplitPlan::choose(
                    keys,
                    self.cfg.block_size,
                    batch.num_reqs() * groups,
                    self.num_sms(),
                )
            }
            _ => SplitPlan::single(keys, self.cfg.block_size),
        };
        #[cfg(feature = "cuda")]
        if let Some(g) = &mut self.gpu {
            g.plan(&self.cfg, batch, split)
                .map_err(|e| failed(self.name, e))?;
        }
        self.plan = Some(Planned {
            batch: batch.clone(),
            split,
        });
        Ok(())
    }

    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        let p = self.plan.as_ref().ok_or_else(|| CoreError::NotPlanned {
            backend: self.name.into(),
        })?;
        io.validate_batch(&p.batch, &self.cfg)?;
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            let dtype = kernel_dtype(self.cfg.q_dtype);
            return g
                .run(self.kernel, &self.cfg, &p.batch, dtype, io)
                .map_err(|e| failed(self.name, e));
        }
        if self.cfg.device != Device::Emu {
            return Err(failed(self.name, "no launcher for this device"));
        }
        match self.cfg.q_dtype {
            DType::F32 => self.run_emu::<f32>(p, io),
            DType::BF16 => self.run_emu::<bf16>(p, io),
            DType::F16 => self.run_emu::<f16>(p, io),
        }
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
        #[cfg(feature = "cuda")]
        if let Some(g) = &mut self.gpu {
            let dtypes = (kernel_dtype(k.dtype()), kernel_dtype(k_pool.dtype()));
            return g
                .write_kv(&self.cfg, k_pool, v_pool, k, v, slot_mapping, dtypes)
                .map_err(|e| failed(self.name, e));
        }
        let shape = self.shape();
        let sm = slot_mapping;
        macro_rules! by_pool {
            ($s:ty) => {
                match k_pool.dtype() {
                    DType::F32 => write_kv_emu::<$s, f32>(k_pool, v_pool, k, v, sm, &shape),
                    DType::BF16 => write_kv_emu::<$s, bf16>(k_pool, v_pool, k, v, sm, &shape),
                    DType::F16 => write_kv_emu::<$s, f16>(k_pool, v_pool, k, v, sm, &shape),
                }
            };
        }
        let r = match k.dtype() {
            DType::F32 => by_pool!(f32),
            DType::BF16 => by_pool!(bf16),
            DType::F16 => by_pool!(f16),
        }?;
        r.map_err(|e| failed(self.name, e))
    }
}
