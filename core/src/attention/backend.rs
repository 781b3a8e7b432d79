//! The trait a backend implements, [`AttentionBackend`], and the buffers of one
//! layer's call, [`LayerIo`].

use super::{AttentionConfig, BatchDescriptor};
use crate::fp8::F8E4M3;
use crate::tensor::{DType, Device, HostSlice, TensorMut, TensorRef};
use crate::CoreError;
use half::{bf16, f16};

/// An attention implementation: **the trait a backend implements**. Created for one
/// [`AttentionConfig`] by its registration ([`super::BackendRegistration::create`]).
///
/// The [`BatchDescriptor`] that `plan` receives is valid by construction; `plan`
/// checks only what depends on the backend ([`super::Capabilities::check_batch`]),
/// and `run` only the buffers ([`LayerIo::validate_batch`]). Bad input is an error,
/// never a panic.
pub trait AttentionBackend: Send {
    /// The registered name.
    fn name(&self) -> &str;

    /// Builds this backend's metadata for a step. Called once per step, before any `run`.
    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError>;

    /// Attention of one layer over the paged cache for the planned batch. The new
    /// tokens' K/V must already be in the cache (see [`AttentionBackend::write_kv`]).
    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError>;

    /// Writes new K/V rows (`[num_tokens, num_kv_heads, head_dim]`) into this layer's
    /// pools by slot mapping (negative slots skipped). The default is the host copy
    /// ([`crate::write_kv`], converting to the pools' dtype); a device backend
    /// writes with its own kernel.
    fn write_kv(
        &mut self,
        k_pool: TensorMut<'_>,
        v_pool: TensorMut<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
        slot_mapping: &[i64],
        slot_elems: usize,
    ) -> Result<(), CoreError> {
        crate::write_kv(k_pool, v_pool, k, v, slot_mapping, slot_elems)
    }

    /// The backend's batch-invariance declaration: `Some(arithmetic)` when a query
    /// row's output (and LSE) bits depend only on that row's query, the K/V at its
    /// key positions and the configuration, never on the other rows of the batch,
    /// their order, the block layout, the thread count, nor on whether the row is
    /// a decode row or part of a prefill chunk of any length with any cached
    /// context. `arithmetic` names the per-row computation: two backends that name
    /// the same one give the same bits for the same row, so a hybrid of them is
    /// invariant too (`paged` and `flash` both run `pagoda_kernels::attn`'s, named
    /// [`CPU_SPLIT_ARITHMETIC`]). The conformance kit checks the claim; the
    /// default, `None`, claims nothing.
    fn batch_invariant(&self) -> Option<&'static str> {
        None
    }

    /// Whether `run` serves a batch's verify runs
    /// ([`BatchDescriptor::verify_runs`]) in one pass over each run's keys, all its
    /// query tokens together, with each row's output bit-identical to the same row
    /// unmarked (the conformance kit checks both). The default, `false`: the runs'
    /// rows are served as the plain decode rows they are, which is always correct.
    fn serves_verify_runs(&self) -> bool {
        false
    }

    /// Which steps this backend's `run` can be captured for in a CUDA graph
    /// (vLLM's `AttentionCGSupport`). The default: none.
    fn graph_support(&self) -> GraphSupport {
        GraphSupport::Never
    }

    /// Plans a decode-only `batch` whose `run`s are captured once and replayed for
    /// every batch of the same number of requests and block-table stride: the
    /// launches (geometry, scalars, buffer addresses) must then not depend on the
    /// batch's contents, only on `(num_reqs, block_table_stride)` and `limits`; what
    /// changes (lengths, block tables) goes into the backend's own device buffers, at
    /// addresses fixed from the first such plan on. Eager `plan`s may follow, bounded
    /// by the same `limits`, and must not move those buffers either.
    ///
    /// The default refuses: backends that return [`GraphSupport::Never`] are only run
    /// eagerly.
    fn plan_graph(
        &mut self,
        batch: &BatchDescriptor,
        limits: &GraphLimits,
    ) -> Result<(), CoreError> {
        let _ = (batch, limits);
        Err(CoreError::GraphUnsupported {
            what: format!("attention backend `{}`", self.name()),
        })
    }
}

/// The [`AttentionBackend::batch_invariant`] arithmetic of the CPU backends: keys in
/// splits of 256 positions cut at its multiples, each an online softmax over
/// chunks cut at fixed positions, merged in position order (the arithmetic depends
/// on the instruction set, so the guarantee holds per CPU and
/// `PAGODA_DISABLE_AVX512` setting).
pub const CPU_SPLIT_ARITHMETIC: &str = "cpu-split256";

/// Which steps a backend can run inside a captured CUDA graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphSupport {
    /// Only eagerly.
    Never,
    /// Decode-only batches (every request one new token), planned by
    /// [`AttentionBackend::plan_graph`].
    UniformDecode,
}

/// The bounds every step of an engine stays within, which graph plans size their
/// buffers for once (so that no later step moves them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphLimits {
    /// The longest sequence (context + new tokens): `--max-model-len`.
    pub max_seq_len: usize,
    /// The most rows in a step: `--max-num-seqs`, times `1 + num_speculative_tokens`
    /// under speculation (a verify run's query tokens are decode rows of their own).
    pub max_num_reqs: usize,
    /// The most tokens in a step: `--max-num-batched-tokens`.
    pub max_num_tokens: usize,
    /// The widest block table: blocks of `max_seq_len`.
    pub max_blocks_per_seq: usize,
}

/// Buffers of one layer's attention call. Each carries its device, dtype and shape;
/// [`LayerIo::validate`] checks them against the backend's [`AttentionConfig`].
pub struct LayerIo<'a> {
    /// `[num_tokens, num_heads, head_dim]`, of the config's `q_dtype`.
    pub q: TensorRef<'a>,
    /// This layer's K pool, `[num_blocks, block_size, num_kv_heads, head_dim]`, of the
    /// config's `kv_dtype`.
    pub k_cache: TensorRef<'a>,
    /// This layer's V pool, same shape and dtype.
    pub v_cache: TensorRef<'a>,
    /// `[num_tokens, num_heads, head_dim]`, of the config's `q_dtype`.
    pub out: TensorMut<'a>,
    /// `[num_tokens, num_heads]` f32, natural-log log-sum-exp of the scaled scores, if wanted.
    pub lse: Option<TensorMut<'a>>,
}

/// The buffers of a [`LayerIo`] as host f32 slices: what the CPU f32 backends read
/// ([`LayerIo::into_f32`]).
pub struct F32Io<'a> {
    pub q: &'a [f32],
    pub k_cache: &'a [f32],
    pub v_cache: &'a [f32],
    pub out: &'a mut [f32],
    pub lse: Option<&'a mut [f32]>,
}

/// A layer's K and V pools in host memory, both of one element type (an fp8 cache is
/// [`F8E4M3`] elements, scale 1.0).
#[derive(Debug, Clone, Copy)]
pub enum KvPools<'a> {
    F32(&'a [f32], &'a [f32]),
    F16(&'a [f16], &'a [f16]),
    BF16(&'a [bf16], &'a [bf16]),
    F8E4M3(&'a [F8E4M3], &'a [F8E4M3]),
}

impl KvPools<'_> {
    pub fn dtype(&self) -> DType {
        match self {
            KvPools::F32(..) => DType::F32,
            KvPools::F16(..) => DType::F16,
            KvPools::BF16(..) => DType::BF16,
            KvPools::F8E4M3(..) => DType::F8E4M3,
        }
    }
}

/// The buffers of a [`LayerIo`] in host memory: f32 queries and outputs, the pools of
/// any dtype ([`LayerIo::into_host_kv`]): what the CPU backends read, widening a
/// 16-bit cache in registers.
pub struct HostKvIo<'a> {
    pub q: &'a [f32],
    pub kv: KvPools<'a>,
    pub out: &'a mut [f32],
    pub lse: Option<&'a mut [f32]>,
}

impl<'a> LayerIo<'a> {
    /// CPU f32 buffers (flat views of the slices), the common case of tests and the
    /// CPU model.
    pub fn cpu(
        q: &'a [f32],
        k_cache: &'a [f32],
        v_cache: &'a [f32],
        out: &'a mut [f32],
        lse: Option<&'a mut [f32]>,
    ) -> Self {
        LayerIo {
            q: TensorRef::cpu(q),
            k_cache: TensorRef::cpu(k_cache),
            v_cache: TensorRef::cpu(v_cache),
            out: TensorMut::cpu(out),
            lse: lse.map(TensorMut::cpu),
        }
    }

    /// The buffers as host f32 slices, or the first one that is not
    /// ([`CoreError::DTypeMismatch`] / [`CoreError::NotOnHost`]).
    pub fn into_f32(self) -> Result<F32Io<'a>, CoreError> {
        Ok(F32Io {
            q: self.q.as_f32("q")?,
            k_cache: self.k_cache.as_f32("k_cache")?,
            v_cache: self.v_cache.as_f32("v_cache")?,
            out: self.out.into_f32("out")?,
            lse: self.lse.map(|l| l.into_f32("lse")).transpose()?,
        })
    }

    /// The buffers in host memory: `q`, `out` and `lse` f32, the pools of one host
    /// dtype; else the first buffer that is not ([`CoreError::DTypeMismatch`] /
    /// [`CoreError::NotOnHost`]; a V pool of another dtype than the K pool is a
    /// mismatch named `v_cache`).
    pub fn into_host_kv(self) -> Result<HostKvIo<'a>, CoreError> {
        let q = self.q.as_f32("q")?;
        let host = |t: TensorRef<'a>, name| {
            t.host_slice().ok_or(CoreError::NotOnHost {
                name,
                device: t.device_of(),
            })
        };
        let (k, v) = (
            host(self.k_cache, "k_cache")?,
            host(self.v_cache, "v_cache")?,
        );
        let kv = match (k, v) {
            (HostSlice::F32(k), HostSlice::F32(v)) => KvPools::F32(k, v),
            (HostSlice::F16(k), HostSlice::F16(v)) => KvPools::F16(k, v),
            (HostSlice::BF16(k), HostSlice::BF16(v)) => KvPools::BF16(k, v),
            (HostSlice::F8E4M3(k), HostSlice::F8E4M3(v)) => KvPools::F8E4M3(k, v),
            (k, v) => {
                return Err(CoreError::DTypeMismatch {
                    name: "v_cache",
                    expected: k.dtype(),
                    actual: v.dtype(),
                })
            }
        };
        Ok(HostKvIo {
            q,
            kv,
            out: self.out.into_f32("out")?,
            lse: self.lse.map(|l| l.into_f32("lse")).transpose()?,
        })
    }

    /// Checks the buffers every backend's `run` needs for a batch of `num_tokens`
    /// tokens under `cfg`, in this order: `q`, `out`, `lse` (if asked for), the K pool,
    /// the V pool; each on `cfg.device`, of its dtype (`q`/`out` `cfg.q_dtype`, pools
    /// `cfg.kv_dtype`, `lse` f32), and of its length: `q` and `out` hold
    /// `[num_tokens, num_heads, head_dim]`, `lse` `[num_tokens, num_heads]`, the K pool
    /// is whole blocks and the V pool is as long. Returns the pool's number of blocks
    /// (block ids must be below it); the first bad buffer is a
    /// [`CoreError::DeviceMismatch`], [`CoreError::DTypeMismatch`] or
    /// [`CoreError::ShapeMismatch`] (for a K pool of partial blocks, `expected` is its
    /// length rounded down to whole blocks).
    pub fn validate(&self, num_tokens: usize, cfg: &AttentionConfig) -> Result<usize, CoreError> {
        let check = |name: &'static str,
                     (device, dtype, actual): (Device, DType, usize),
                     want_dtype: DType,
                     expected: usize| {
            if device != cfg.device {
                return Err(CoreError::DeviceMismatch {
                    name,
                    expected: cfg.device,
                    actual: device,
                });
            }
            if dtype != want_dtype {
                return Err(CoreError::DTypeMismatch {
                    name,
                    expected: want_dtype,
                    actual: dtype,
                });
            }
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
        let of = |t: &TensorRef<'_>| (t.device_of(), t.dtype(), t.len());
        let of_mut = |t: &TensorMut<'_>| (t.device_of(), t.dtype(), t.len());
        let tok_elems = num_tokens * cfg.num_heads * cfg.head_dim;
        check("q", of(&self.q), cfg.q_dtype, tok_elems)?;
        check("out", of_mut(&self.out), cfg.q_dtype, tok_elems)?;
        if let Some(l) = self.lse.as_ref() {
            check("lse", of_mut(l), DType::F32, num_tokens * cfg.num_heads)?;
        }
        let block_elems = cfg.block_size * cfg.num_kv_heads * cfg.head_dim;
        let k_len = self.k_cache.len();
        let num_blocks = k_len.checked_div(block_elems).unwrap_or(0);
        check(
            "k_cache",
            of(&self.k_cache),
            cfg.kv_dtype,
            num_blocks * block_elems,
        )?;
        check("v_cache", of(&self.v_cache), cfg.kv_dtype, k_len)?;
        Ok(num_blocks)
    }

    /// [`LayerIo::validate`] for `batch`'s tokens, then that every block the batch
    /// uses exists in the pool ([`CoreError::BlockOutOfRange`] otherwise). Together
    /// with the descriptor's own validity this is every check a `run` needs.
    pub fn validate_batch(
        &self,
        batch: &BatchDescriptor,
        cfg: &AttentionConfig,
    ) -> Result<usize, CoreError> {
        let num_blocks = self.validate(batch.num_tokens(), cfg)?;
        match batch.max_block() {
            Some(block) if block as usize >= num_blocks => {
                Err(CoreError::BlockOutOfRange { block, num_blocks })
            }
            _ => Ok(num_blocks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_io_validate_names_the_first_bad_buffer() {
        // 2 tokens, 4 heads of dim 2, 2 KV heads, blocks of 3: a block is 12 floats.
        let cfg = AttentionConfig::cpu_f32(4, 2, 2, 3);
        let (q, kv) = (vec![0.0; 16], vec![0.0; 36]);
        let (mut out, mut lse) = (vec![0.0; 16], vec![0.0; 8]);
        let run = |q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], lse: Option<&mut [f32]>| {
            LayerIo::cpu(q, k, v, out, lse).validate(2, &cfg)
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
        // Device and dtype are checked too, buffer by buffer.
        let bf = [half::bf16::ZERO; 16];
        let mut io = LayerIo::cpu(&q, &kv, &kv, &mut out, None);
        io.q = TensorRef::host(Device::Emu, &q).unwrap();
        assert!(matches!(
            io.validate(2, &cfg),
            Err(CoreError::DeviceMismatch { name: "q", .. })
        ));
        io.q = TensorRef::host(Device::Cpu, &bf).unwrap();
        assert!(matches!(
            io.validate(2, &cfg),
            Err(CoreError::DTypeMismatch { name: "q", .. })
        ));
        // The first bad buffer wins.
        assert_eq!(
            name(run(&q[1..], &kv[1..], &kv, &mut out[1..], None)).0,
            "q"
        );
    }

    #[test]
    fn into_host_kv_takes_any_pool_dtype_but_one_for_both() {
        let (q, kv) = ([0.0f32; 4], [bf16::ONE; 8]);
        let hv = [f16::ONE; 8];
        let mut out = [0.0f32; 4];
        let bf = TensorRef::host(Device::Cpu, &kv).unwrap();
        let hf = TensorRef::host(Device::Cpu, &hv).unwrap();
        fn make<'a>(
            q: &'a [f32],
            k: TensorRef<'a>,
            v: TensorRef<'a>,
            out: &'a mut [f32],
        ) -> LayerIo<'a> {
            LayerIo {
                q: TensorRef::cpu(q),
                k_cache: k,
                v_cache: v,
                out: TensorMut::cpu(out),
                lse: None,
            }
        }
        let got = make(&q, bf, bf, &mut out).into_host_kv().unwrap();
        assert_eq!(got.kv.dtype(), DType::BF16);
        assert!(matches!(
            make(&q, bf, hf, &mut out).into_host_kv(),
            Err(CoreError::DTypeMismatch {
                name: "v_cache",
                expected: DType::BF16,
                actual: DType::F16
            })
        ));
        // An fp8 pair is an fp8 pool, holding the same bytes; fp8 with bf16 is refused.
        let e8 = [F8E4M3::from_f32(1.5); 8];
        let f8 = TensorRef::host(Device::Cpu, &e8).unwrap();
        let got = make(&q, f8, f8, &mut out).into_host_kv().unwrap();
        assert!(matches!(got.kv, KvPools::F8E4M3(k, v) if k[0].to_f32() == 1.5 && v.len() == 8));
        assert!(matches!(
            make(&q, f8, bf, &mut out).into_host_kv(),
            Err(CoreError::DTypeMismatch {
                name: "v_cache",
                expected: DType::F8E4M3,
                actual: DType::BF16
            })
        ));
    }

    #[test]
    fn validate_batch_checks_the_blocks_against_the_pool() {
        // One KV head of dim 2, blocks of 2: a block is 4 floats; a pool of 3 blocks.
        let cfg = AttentionConfig::cpu_f32(1, 1, 2, 2);
        let kv = vec![0.0; 12];
        let mut out = vec![0.0; 2];
        for (block, want) in [
            (2, Ok(3)),
            (
                3,
                Err(CoreError::BlockOutOfRange {
                    block: 3,
                    num_blocks: 3,
                }),
            ),
        ] {
            let batch = BatchDescriptor::new(2, &[1], &[1], &[&[block]]).unwrap();
            let got =
                LayerIo::cpu(&[0.0; 2], &kv, &kv, &mut out, None).validate_batch(&batch, &cfg);
            assert_eq!(got, want);
        }
    }
}
