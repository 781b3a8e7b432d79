//! The attention-backend protocol.
//!
//! * A backend crate registers a const [`BackendRegistration`] through `inventory`
//!   (use [`register_backend!`](crate::register_backend)): name, priority, [`Capabilities`], a runtime check
//!   and a constructor.
//! * A backend answers an [`AttentionConfig`] with a list of [`InvalidReason`]s
//!   (empty = it can serve it). The selector crate walks the registry with this.
//! * Per engine step the model runner builds one [`BatchDescriptor`]; the backend
//!   turns it into its own metadata once ([`AttentionBackend::plan`]), then runs once
//!   per layer ([`AttentionBackend::run`]) with no planning or allocation inside.
//! * Writing new K/V into the cache by slot mapping is a separate op
//!   ([`AttentionBackend::write_kv`], default [`crate::write_kv`]).
//! * Backends may return the log-sum-exp (natural log) of each row so that
//!   split-KV and chunked computations share one reduction, [`merge_states`].

use crate::CoreError;
use std::fmt;

/// Where a backend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// Element types of Q and of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        })
    }
}

/// Which rows of a batch a backend is asked to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Rows with query length 1.
    Decode,
    /// Rows with query length > 1 (prompt chunks).
    Prefill,
    /// Both kinds of rows.
    Both,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Decode => "decode",
            Role::Prefill => "prefill",
            Role::Both => "decode+prefill",
        })
    }
}

/// The attention configuration of one model on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionConfig {
    pub device: Device,
    pub q_dtype: DType,
    pub kv_dtype: DType,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    pub sliding_window: Option<usize>,
    pub logits_soft_cap: Option<f32>,
}

impl AttentionConfig {
    /// A CPU f32 configuration with the usual scale.
    pub fn cpu_f32(
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
    ) -> Self {
        AttentionConfig {
            device: Device::Cpu,
            q_dtype: DType::F32,
            kv_dtype: DType::F32,
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: None,
            logits_soft_cap: None,
        }
    }

    pub fn gqa_ratio(&self) -> usize {
        self.num_heads / self.num_kv_heads.max(1)
    }
}

/// What a backend supports. `None` in a list field means "any".
#[derive(Debug, Clone, PartialEq)]
pub struct Capabilities {
    pub devices: Vec<DeviceKind>,
    pub q_dtypes: Vec<DType>,
    pub kv_dtypes: Vec<DType>,
    pub head_dims: Option<Vec<usize>>,
    pub block_sizes: Option<Vec<usize>>,
    pub max_gqa_ratio: Option<usize>,
    pub sliding_window: bool,
    pub logits_soft_cap: bool,
    pub decode: bool,
    pub prefill: bool,
    /// Whether `run` fills the log-sum-exp output when asked.
    pub returns_lse: bool,
}

/// A device family, for capability lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

impl Device {
    pub fn kind(self) -> DeviceKind {
        match self {
            Device::Cpu => DeviceKind::Cpu,
            Device::Cuda(_) => DeviceKind::Cuda,
        }
    }
}

/// Why a backend cannot serve a configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum InvalidReason {
    DeviceUnsupported {
        device: Device,
    },
    QDTypeUnsupported {
        dtype: DType,
        supported: Vec<DType>,
    },
    KvDTypeUnsupported {
        dtype: DType,
        supported: Vec<DType>,
    },
    HeadDimUnsupported {
        head_dim: usize,
        supported: Vec<usize>,
    },
    BlockSizeUnsupported {
        block_size: usize,
        supported: Vec<usize>,
    },
    GqaRatioUnsupported {
        ratio: usize,
        max: usize,
    },
    HeadsNotDivisible {
        num_heads: usize,
        num_kv_heads: usize,
    },
    SlidingWindowUnsupported,
    SoftCapUnsupported,
    RoleUnsupported {
        role: Role,
    },
    /// The backend is registered but its code is behind a cargo feature that is off.
    NotCompiled {
        feature: &'static str,
    },
    Other {
        message: String,
    },
}

impl fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidReason::DeviceUnsupported { device } => {
                write!(f, "device {device} is not supported")
            }
            InvalidReason::QDTypeUnsupported { dtype, supported } => {
                write!(
                    f,
                    "query dtype {dtype} is not supported (supported: {})",
                    list(supported)
                )
            }
            InvalidReason::KvDTypeUnsupported { dtype, supported } => {
                write!(
                    f,
                    "KV cache dtype {dtype} is not supported (supported: {})",
                    list(supported)
                )
            }
            InvalidReason::HeadDimUnsupported {
                head_dim,
                supported,
            } => {
                write!(
                    f,
                    "head dim {head_dim} is not supported (supported: {})",
                    list(supported)
                )
            }
            InvalidReason::BlockSizeUnsupported {
                block_size,
                supported,
            } => {
                write!(
                    f,
                    "block size {block_size} is not supported (supported: {})",
                    list(supported)
                )
            }
            InvalidReason::GqaRatioUnsupported { ratio, max } => {
                write!(f, "GQA ratio {ratio} exceeds the supported maximum {max}")
            }
            InvalidReason::HeadsNotDivisible {
                num_heads,
                num_kv_heads,
            } => {
                write!(
                    f,
                    "{num_heads} query heads are not a multiple of {num_kv_heads} KV heads"
                )
            }
            InvalidReason::SlidingWindowUnsupported => {
                write!(f, "sliding-window attention is not supported")
            }
            InvalidReason::SoftCapUnsupported => write!(f, "logits soft-capping is not supported"),
            InvalidReason::RoleUnsupported { role } => match role {
                Role::Prefill => write!(f, "does not handle prefill rows (query length > 1)"),
                Role::Decode => write!(f, "does not handle decode rows (query length 1)"),
                Role::Both => write!(f, "does not handle both decode and prefill rows"),
            },
            InvalidReason::NotCompiled { feature } => {
                write!(
                    f,
                    "not compiled with {} (rebuild with `--features {feature}`)",
                    feature.to_uppercase()
                )
            }
            InvalidReason::Other { message } => f.write_str(message),
        }
    }
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Capabilities {
    /// Every reason this capability set cannot serve `cfg` in `role`; empty = valid.
    pub fn reasons(&self, cfg: &AttentionConfig, role: Role) -> Vec<InvalidReason> {
        let mut r = Vec::new();
        if !self.devices.contains(&cfg.device.kind()) {
            r.push(InvalidReason::DeviceUnsupported { device: cfg.device });
        }
        if !self.q_dtypes.contains(&cfg.q_dtype) {
            r.push(InvalidReason::QDTypeUnsupported {
                dtype: cfg.q_dtype,
                supported: self.q_dtypes.clone(),
            });
        }
        if !self.kv_dtypes.contains(&cfg.kv_dtype) {
            r.push(InvalidReason::KvDTypeUnsupported {
                dtype: cfg.kv_dtype,
                supported: self.kv_dtypes.clone(),
            });
        }
        if let Some(dims) = &self.head_dims {
            if !dims.contains(&cfg.head_dim) {
                r.push(InvalidReason::HeadDimUnsupported {
                    head_dim: cfg.head_dim,
                    supported: dims.clone(),
                });
            }
        }
        if let Some(sizes) = &self.block_sizes {
            if !sizes.contains(&cfg.block_size) {
                r.push(InvalidReason::BlockSizeUnsupported {
                    block_size: cfg.block_size,
                    supported: sizes.clone(),
                });
            }
        }
        if cfg.num_kv_heads == 0 || !cfg.num_heads.is_multiple_of(cfg.num_kv_heads) {
            r.push(InvalidReason::HeadsNotDivisible {
                num_heads: cfg.num_heads,
                num_kv_heads: cfg.num_kv_heads,
            });
        } else if let Some(max) = self.max_gqa_ratio {
            if cfg.gqa_ratio() > max {
                r.push(InvalidReason::GqaRatioUnsupported {
                    ratio: cfg.gqa_ratio(),
                    max,
                });
            }
        }
        if cfg.sliding_window.is_some() && !self.sliding_window {
            r.push(InvalidReason::SlidingWindowUnsupported);
        }
        if cfg.logits_soft_cap.is_some() && !self.logits_soft_cap {
            r.push(InvalidReason::SoftCapUnsupported);
        }
        let needs_decode = matches!(role, Role::Decode | Role::Both);
        let needs_prefill = matches!(role, Role::Prefill | Role::Both);
        if needs_prefill && !self.prefill {
            r.push(InvalidReason::RoleUnsupported {
                role: Role::Prefill,
            });
        }
        if needs_decode && !self.decode {
            r.push(InvalidReason::RoleUnsupported { role: Role::Decode });
        }
        r
    }
}

/// One engine step's batch, as the model runner hands it to attention backends.
///
/// Rows are requests; decode rows (query length 1) come first. Token-indexed
/// buffers (`q`, `out`, `slot_mapping`) are laid out by `query_start_loc`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchDescriptor {
    pub block_size: usize,
    /// `num_reqs + 1` offsets into the token dimension.
    pub query_start_loc: Vec<u32>,
    /// Context plus new tokens, per request.
    pub seq_lens: Vec<u32>,
    /// Row-major `[num_reqs, block_table_stride]`; entries past a request's last block are unused.
    pub block_table: Vec<u32>,
    pub block_table_stride: usize,
    /// Cache slot of each token (`-1` = padding, skipped by `write_kv`).
    pub slot_mapping: Vec<i64>,
    pub num_decode_reqs: usize,
    pub num_decode_tokens: usize,
    pub max_query_len: usize,
    pub max_seq_len: usize,
}

impl BatchDescriptor {
    /// Builds a descriptor from per-request query lengths, sequence lengths and block
    /// rows (decode rows must come first). Derives everything else.
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

    /// Like [`BatchDescriptor::new`] but reusing this descriptor's buffers.
    pub fn rebuild(
        &mut self,
        block_size: usize,
        query_lens: &[usize],
        seq_lens: &[usize],
        block_rows: &[&[u32]],
    ) -> Result<(), CoreError> {
        let n = query_lens.len();
        if seq_lens.len() != n || block_rows.len() != n {
            return Err(CoreError::InvalidBatch {
                message: format!(
                    "{n} query lengths, {} seq lens, {} block rows",
                    seq_lens.len(),
                    block_rows.len()
                ),
            });
        }
        if block_size == 0 {
            return Err(CoreError::InvalidBatch {
                message: "block size 0".into(),
            });
        }
        self.block_size = block_size;
        self.query_start_loc.clear();
        self.seq_lens.clear();
        self.block_table.clear();
        self.slot_mapping.clear();
        self.block_table_stride = block_rows.iter().map(|r| r.len()).max().unwrap_or(0).max(1);
        self.query_start_loc.push(0);
        self.num_decode_reqs = 0;
        let mut seen_prefill = false;
        for r in 0..n {
            let (q, s) = (query_lens[r], seq_lens[r]);
            if q == 0 || q > s {
                return Err(CoreError::InvalidBatch {
                    message: format!("request {r}: query length {q} with sequence length {s}"),
                });
            }
            if s.div_ceil(block_size) > block_rows[r].len() {
                return Err(CoreError::InvalidBatch {
                    message: format!(
                        "request {r}: {s} tokens need {} blocks, has {}",
                        s.div_ceil(block_size),
                        block_rows[r].len()
                    ),
                });
            }
            if q == 1 {
                if seen_prefill {
                    return Err(CoreError::InvalidBatch {
                        message: "decode rows must come before prefill rows".into(),
                    });
                }
                self.num_decode_reqs += 1;
            } else {
                seen_prefill = true;
            }
            let start = *self.query_start_loc.last().unwrap();
            self.query_start_loc.push(start + q as u32);
            self.seq_lens.push(s as u32);
            self.block_table.extend_from_slice(block_rows[r]);
            self.block_table
                .resize((r + 1) * self.block_table_stride, u32::MAX);
            let row = &block_rows[r];
            for pos in s - q..s {
                self.slot_mapping.push(
                    (row[pos / block_size] as i64) * block_size as i64 + (pos % block_size) as i64,
                );
            }
        }
        self.num_decode_tokens = self.num_decode_reqs;
        self.max_query_len = query_lens.iter().copied().max().unwrap_or(0);
        self.max_seq_len = seq_lens.iter().copied().max().unwrap_or(0);
        Ok(())
    }

    pub fn num_reqs(&self) -> usize {
        self.seq_lens.len()
    }
    pub fn num_tokens(&self) -> usize {
        self.query_start_loc.last().copied().unwrap_or(0) as usize
    }
    pub fn num_prefill_reqs(&self) -> usize {
        self.num_reqs() - self.num_decode_reqs
    }
    pub fn num_prefill_tokens(&self) -> usize {
        self.num_tokens() - self.num_decode_tokens
    }
    pub fn query_len(&self, r: usize) -> usize {
        (self.query_start_loc[r + 1] - self.query_start_loc[r]) as usize
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
    /// of those rows' tokens).
    pub fn slice_rows(&self, rows: std::ops::Range<usize>) -> BatchDescriptor {
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
        let max_query_len = (0..query_start_loc.len() - 1)
            .map(|i| (query_start_loc[i + 1] - query_start_loc[i]) as usize)
            .max()
            .unwrap_or(0);
        BatchDescriptor {
            block_size: self.block_size,
            max_seq_len: seq_lens.iter().copied().max().unwrap_or(0) as usize,
            query_start_loc,
            seq_lens,
            block_table,
            block_table_stride: stride,
            slot_mapping: self.slot_mapping[t0 as usize..t1 as usize].to_vec(),
            num_decode_reqs,
            num_decode_tokens: num_decode_reqs,
            max_query_len,
        }
    }

    /// Splits into (decode rows, prefill rows).
    pub fn split_decode_prefill(&self) -> (BatchDescriptor, BatchDescriptor) {
        (
            self.slice_rows(0..self.num_decode_reqs),
            self.slice_rows(self.num_decode_reqs..self.num_reqs()),
        )
    }
}

/// Buffers of one layer's attention call.
pub struct LayerIo<'a> {
    /// `[num_tokens, num_heads, head_dim]`
    pub q: &'a [f32],
    /// This layer's K pool, `[num_blocks, block_size, num_kv_heads, head_dim]`.
    pub k_cache: &'a [f32],
    /// This layer's V pool, same shape.
    pub v_cache: &'a [f32],
    /// `[num_tokens, num_heads, head_dim]`
    pub out: &'a mut [f32],
    /// `[num_tokens, num_heads]`, natural-log log-sum-exp of the scaled scores, if wanted.
    pub lse: Option<&'a mut [f32]>,
}

impl LayerIo<'_> {
    /// Checks the buffer lengths every backend's `run` needs for a batch of
    /// `num_tokens` tokens under `cfg`, in this order: `q` and `out` hold
    /// `[num_tokens, num_heads, head_dim]`, `lse` (if asked for) `[num_tokens, num_heads]`,
    /// the K pool is whole blocks and the V pool is as long. Returns the pool's
    /// number of blocks (block ids must be below it); the first bad buffer is a
    /// [`CoreError::ShapeMismatch`] (for a K pool of partial blocks, `expected` is
    /// its length rounded down to whole blocks).
    pub fn validate(&self, num_tokens: usize, cfg: &AttentionConfig) -> Result<usize, CoreError> {
        let check = |name: &'static str, actual: usize, expected: usize| {
            if actual == expected {
                Ok(())
            } else {
                Err(CoreError::ShapeMismatch {
                    name,
                    expected,
                    actual,
                })
            }
        };
        let tok_elems = num_tokens * cfg.num_heads * cfg.head_dim;
        check("q", self.q.len(), tok_elems)?;
        check("out", self.out.len(), tok_elems)?;
        if let Some(l) = self.lse.as_deref() {
            check("lse", l.len(), num_tokens * cfg.num_heads)?;
        }
        let block_elems = cfg.block_size * cfg.num_kv_heads * cfg.head_dim;
        let num_blocks = self.k_cache.len().checked_div(block_elems).unwrap_or(0);
        check("k_cache", self.k_cache.len(), num_blocks * block_elems)?;
        check("v_cache", self.v_cache.len(), self.k_cache.len())?;
        Ok(num_blocks)
    }
}

/// An attention implementation. Created for one [`AttentionConfig`] by its registration.
pub trait AttentionBackend: Send {
    /// The registered name.
    fn name(&self) -> &str;

    /// Builds this backend's metadata for a step. Called once per step, before any `run`.
    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError>;

    /// Attention of one layer over the paged cache for the planned batch. The new
    /// tokens' K/V must already be in the cache (see [`AttentionBackend::write_kv`]).
    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError>;

    /// Writes new K/V rows by slot mapping (negative slots skipped).
    fn write_kv(
        &mut self,
        k_pool: &mut [f32],
        v_pool: &mut [f32],
        k: &[f32],
        v: &[f32],
        slot_mapping: &[i64],
        slot_elems: usize,
    ) -> Result<(), CoreError> {
        crate::write_kv(k_pool, v_pool, k, v, slot_mapping, slot_elems)
    }
}

/// A backend's entry in the registry. Declare one per backend crate with
/// [`register_backend!`](crate::register_backend).
pub struct BackendRegistration {
    pub name: &'static str,
    /// Higher is preferred by automatic selection.
    pub priority: i32,
    pub description: &'static str,
    pub capabilities: fn() -> Capabilities,
    /// Checks that capabilities cannot express (e.g. "not compiled with CUDA").
    pub runtime_reasons: fn(&AttentionConfig) -> Vec<InvalidReason>,
    pub create: fn(&AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError>,
}

impl BackendRegistration {
    /// Every reason this backend cannot serve `cfg` in `role`; empty = valid.
    pub fn reasons(&self, cfg: &AttentionConfig, role: Role) -> Vec<InvalidReason> {
        let mut r = (self.runtime_reasons)(cfg);
        r.extend((self.capabilities)().reasons(cfg, role));
        r
    }
}

/// No runtime restrictions beyond the capabilities.
pub fn no_runtime_reasons(_: &AttentionConfig) -> Vec<InvalidReason> {
    Vec::new()
}

inventory::collect!(BackendRegistration);

/// Every linked backend, by descending priority then name.
pub fn registered_backends() -> Vec<&'static BackendRegistration> {
    let mut v: Vec<_> = inventory::iter::<BackendRegistration>.into_iter().collect();
    v.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.name.cmp(b.name)));
    v
}

/// Registers a backend: `register_backend!(BackendRegistration { .. });`
#[macro_export]
macro_rules! register_backend {
    ($reg:expr) => {
        $crate::inventory::submit! { $reg }
    };
}

pub use inventory;

/// Merges two partial attention results over disjoint KV sets into `out`/`lse`.
///
/// `o_*`: `[rows, head_dim]` flattened; `lse_*`: `[rows]` (natural log). A row with
/// `lse = -inf` (no keys) contributes nothing.
pub fn merge_states(
    o_a: &[f32],
    lse_a: &[f32],
    o_b: &[f32],
    lse_b: &[f32],
    head_dim: usize,
    out: &mut [f32],
    lse_out: &mut [f32],
) {
    for row in 0..lse_a.len() {
        let (la, lb) = (lse_a[row], lse_b[row]);
        let m = la.max(lb);
        let o = &mut out[row * head_dim..(row + 1) * head_dim];
        if m == f32::NEG_INFINITY {
            o.fill(0.0);
            lse_out[row] = f32::NEG_INFINITY;
            continue;
        }
        let wa = (la - m).exp();
        let wb = (lb - m).exp();
        let inv = 1.0 / (wa + wb);
        let a = &o_a[row * head_dim..(row + 1) * head_dim];
        let b = &o_b[row * head_dim..(row + 1) * head_dim];
        for d in 0..head_dim {
            o[d] = (wa * a[d] + wb * b[d]) * inv;
        }
        lse_out[row] = m + (wa + wb).ln();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Capabilities {
        Capabilities {
            devices: vec![DeviceKind::Cpu],
            q_dtypes: vec![DType::F32],
            kv_dtypes: vec![DType::F32],
            head_dims: Some(vec![64, 128]),
            block_sizes: None,
            max_gqa_ratio: Some(8),
            sliding_window: false,
            logits_soft_cap: false,
            decode: true,
            prefill: false,
            returns_lse: true,
        }
    }

    #[test]
    fn reasons_list_every_problem() {
        let mut cfg = AttentionConfig::cpu_f32(9, 3, 80, 16);
        cfg.sliding_window = Some(4);
        let r = caps().reasons(&cfg, Role::Both);
        assert!(r.contains(&InvalidReason::HeadDimUnsupported {
            head_dim: 80,
            supported: vec![64, 128]
        }));
        assert!(r.contains(&InvalidReason::SlidingWindowUnsupported));
        assert!(r.contains(&InvalidReason::RoleUnsupported {
            role: Role::Prefill
        }));
        assert!(r.iter().any(|x| x.to_string().contains("prefill")));
        assert!(caps()
            .reasons(&AttentionConfig::cpu_f32(9, 3, 64, 16), Role::Decode)
            .is_empty());
    }

    #[test]
    fn batch_descriptor_slot_mapping_and_split() {
        // Two decodes then one prefill of 3 tokens with 2 cached.
        let b = BatchDescriptor::new(4, &[1, 1, 3], &[5, 1, 5], &[&[7, 2], &[3], &[9, 1]]).unwrap();
        assert_eq!(b.query_start_loc, vec![0, 1, 2, 5]);
        assert_eq!(b.num_decode_reqs, 2);
        assert_eq!(b.num_prefill_tokens(), 3);
        // pos 4 of req 0 -> block 2 offset 0 -> slot 8
        assert_eq!(b.slot_mapping, vec![8, 12, 38, 39, 4]);
        let (d, p) = b.split_decode_prefill();
        assert_eq!(d.num_reqs(), 2);
        assert_eq!(p.query_start_loc, vec![0, 3]);
        assert_eq!(p.slot_mapping, vec![38, 39, 4]);
        assert_eq!(p.context_len(0), 2);
        assert_eq!(p.blocks(0), &[9, 1]);
        assert!(BatchDescriptor::new(4, &[3, 1], &[3, 1], &[&[0], &[1]]).is_err());
    }

    #[test]
    fn merge_of_empty_half_is_identity() {
        let o = [1.0, 2.0];
        let mut out = [0.0; 2];
        let mut lse = [0.0];
        merge_states(
            &o,
            &[0.5],
            &[9.0, 9.0],
            &[f32::NEG_INFINITY],
            2,
            &mut out,
            &mut lse,
        );
        assert_eq!(out, o);
        assert_eq!(lse[0], 0.5);
    }

    #[test]
    fn layer_io_validate_names_the_first_bad_buffer() {
        // 2 tokens, 4 heads of dim 2, 2 KV heads, blocks of 3: a block is 12 floats.
        let cfg = AttentionConfig::cpu_f32(4, 2, 2, 3);
        let (q, kv) = (vec![0.0; 16], vec![0.0; 36]);
        let (mut out, mut lse) = (vec![0.0; 16], vec![0.0; 8]);
        let run = |q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], lse: Option<&mut [f32]>| {
            LayerIo {
                q,
                k_cache: k,
                v_cache: v,
                out,
                lse,
            }
            .validate(2, &cfg)
        };
        assert_eq!(run(&q, &kv, &kv, &mut out, Some(&mut lse)), Ok(3));
        assert_eq!(run(&q, &kv, &kv, &mut out, None), Ok(3));
        assert_eq!(run(&q, &[], &[], &mut out, None), Ok(0));
        let name = |r: Result<usize, CoreError>| match r {
            Err(CoreError::ShapeMismatch {
                name,
                expected,
                actual,
            }) => (name, expected, actual),
            other => panic!("expected a shape mismatch, got {other:?}"),
        };
        assert_eq!(name(run(&q[1..], &kv, &kv, &mut out, None)), ("q", 16, 15));
        assert_eq!(
            name(run(&q, &kv, &kv, &mut out[1..], None)),
            ("out", 16, 15)
        );
        assert_eq!(
            name(run(&q, &kv, &kv, &mut out, Some(&mut lse[1..]))),
            ("lse", 8, 7)
        );
        assert_eq!(
            name(run(&q, &kv[1..], &kv[1..], &mut out, None)),
            ("k_cache", 24, 35)
        );
        assert_eq!(
            name(run(&q, &kv, &kv[12..], &mut out, None)),
            ("v_cache", 36, 24)
        );
        // The first bad buffer wins.
        assert_eq!(
            name(run(&q[1..], &kv[1..], &kv, &mut out[1..], None)).0,
            "q"
        );
    }
}
