//! What the backend type knows of an attention kernel ([`Kernel`]: the rows, dtypes and
//! head dims it serves, split-KV or not, graph support, its batch-invariance claim, the
//! compiled [`AttnKernel`]) and the checks that follow from it ([`runtime_reasons`]).
//! Apart from `attn.rs` (the backend type) so that the device code path (`device.rs`)
//! and the model ops read it without depending on the backend.

use crate::runtime::{cuda_unavailable, COMPILED};
use pagoda_core::{
    AttentionConfig, Capabilities, CoreError, DType, DeviceKind, GraphSupport, InvalidReason, Role,
};
use pagoda_cuda_kernels::{paged_head_dims, AttnKernel, Dtype};

/// An attention kernel as the backend type sees it: what it serves and how it is
/// launched. The library's is [`PAGED`]; a CUDA backend crate that owns its `.cu` file
/// describes its own as a `static Kernel` over its compiled [`AttnKernel`]
/// ([`Kernel::compiled`]; see `backends/cuda-naive`,
/// `examples/cuda-backend-example`), and gets planning, the device code path, graphs and
/// `write_kv` from [`CudaAttention`](crate::attn::CudaAttention): nothing here names a
/// backend.
#[derive(Debug)]
pub struct Kernel {
    /// The kernel family's name (`naive`, `paged`, ...).
    pub name: &'static str,
    /// The rows it serves.
    pub role: Role,
    /// The element types it has instantiations for (q, out and the KV cache share one).
    pub dtypes: &'static [DType],
    /// Its head dims per element type (`None`: any head dim).
    pub head_dims: Option<fn(Dtype) -> &'static [usize]>,
    /// Splits a decode row's keys into partitions (flash-decoding, `paged.cu`), written
    /// in `merge.cu`'s layout and merged by `Call::MergeStates` after it: `plan` picks a
    /// `SplitPlan` for it; other kernels take each row's keys in one partition.
    pub split_kv: bool,
    /// Which steps it can run inside a captured graph (its grid and scalars must follow
    /// the bucket only, the lengths and block tables read from the metadata buffers).
    pub graph_support: GraphSupport,
    /// The arithmetic it declares batch-invariant (`AttentionBackend::batch_invariant`;
    /// a split-KV kernel declares it under fixed splits only): `None` claims nothing.
    pub batch_invariant: Option<&'static str>,
    /// Reads q, K, V and writes out in 16-byte vectors (the buffers' base addresses must
    /// be multiples of 16).
    pub vector_io: bool,
    /// The compiled kernel (host launcher, emulator entry, fatbin, entry points), launched
    /// as [`Call::Attn`](pagoda_cuda_kernels::Call::Attn).
    pub compiled: &'static AttnKernel,
    /// The kernel that serves its rows when batch invariance is asked of it
    /// ([`CudaAttention::with_paged_rows`](crate::attn::CudaAttention::with_paged_rows)):
    /// each prefill token as a decode row.
    pub invariant_rows: Option<&'static Kernel>,
}

/// `paged.cu` (the library's, `pagoda_cuda_kernels::PAGED`): split-KV decode. Served by
/// `cuda-paged`; the rows of any kernel that runs its queries as decode rows under
/// batch invariance ([`Kernel::invariant_rows`], `cuda-flash`).
pub static PAGED: Kernel = Kernel {
    name: "paged",
    role: Role::Decode,
    dtypes: &ALL_DTYPES,
    head_dims: Some(paged_head_dims),
    split_kv: true,
    graph_support: GraphSupport::UniformDecode,
    // A decode row's partitions and merge order depend on its position only
    // (`SplitPlan::fixed`), and a CTA's arithmetic on its own keys.
    batch_invariant: Some(PAGED_FIXED_SPLITS),
    vector_io: true,
    compiled: &pagoda_cuda_kernels::PAGED,
    invariant_rows: None,
};

/// The arithmetic `cuda-paged` declares (`AttentionBackend::batch_invariant`): `paged.cu`
/// over partitions of `SplitPlan::FIXED_PARTITION` keys.
pub const PAGED_FIXED_SPLITS: &str = "cuda-paged-split256";

/// The SMs `paged`'s split plan assumes on the emulator: small, so that tests see
/// several splits (and the merge kernel) on short contexts.
pub const EMU_SMS: usize = 2;

/// Every element type the kernels take.
pub const ALL_DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

pub(crate) fn kernel_dtype(d: DType) -> Result<Dtype, CoreError> {
    match d {
        DType::F32 => Ok(Dtype::F32),
        DType::BF16 => Ok(Dtype::Bf16),
        DType::F16 => Ok(Dtype::F16),
        DType::F8E4M3 => Err(no_fp8()),
    }
}

/// Why an fp8 buffer reaches no CUDA kernel.
pub(crate) fn no_fp8() -> CoreError {
    CoreError::UnsupportedDType {
        what: "the CUDA kernels",
        dtype: DType::F8E4M3,
        reason: "the CUDA kernels do not read fp8 KV caches yet",
    }
}

impl Kernel {
    /// The head dims with a kernel for `dtype` (`None`: any; none for a dtype it has no
    /// instantiation for, such as fp8).
    pub fn head_dims(&self, dtype: DType) -> Option<Vec<usize>> {
        let dims = self.head_dims?;
        Some(match kernel_dtype(dtype) {
            Ok(d) if self.dtypes.contains(&dtype) => dims(d).to_vec(),
            _ => vec![],
        })
    }

    /// What the kernel serves on `cuda` and `emu`: the head dims are those of any of its
    /// dtypes; [`runtime_reasons`] narrows them per dtype.
    pub fn capabilities(&self) -> Capabilities {
        let head_dims = self.head_dims.map(|_| {
            let mut all: Vec<usize> = self
                .dtypes
                .iter()
                .flat_map(|&d| self.head_dims(d).unwrap_or_default())
                .collect();
            all.sort_unstable();
            all.dedup();
            all
        });
        Capabilities {
            devices: vec![DeviceKind::Cuda, DeviceKind::Emu],
            q_dtypes: self.dtypes.to_vec(),
            kv_dtypes: self.dtypes.to_vec(),
            head_dims,
            block_sizes: None,
            max_gqa_ratio: None,
            sliding_window: true,
            logits_soft_cap: true,
            decode: self.role != Role::Prefill,
            prefill: self.role != Role::Decode,
            returns_lse: true,
        }
    }
}

/// What capabilities cannot say: q and KV of one dtype, the kernel's head dims for that
/// dtype, a window of at least one key and a positive finite soft cap (what the kernels
/// can express), and for `cuda` devices why they cannot be used here.
pub fn runtime_reasons(kernel: &Kernel, cfg: &AttentionConfig) -> Vec<InvalidReason> {
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
