//! Paged decode attention on CPU: split-KV (flash-decoding), SIMD, multi-threaded.
//!
//! Registered as `"paged"`. Serves decode rows only (query length 1), over an
//! f32, bf16, f16 or fp8 (E4M3) KV cache (`--kv-cache-dtype`): a 16-bit or fp8
//! cache is read at its width and widened in registers ([`kernel`]), never copied
//! to f32.
//!
//! * [`AttentionBackend::plan`] copies the batch's block table and cuts the work
//!   into items `(request, key range)`: a request's keys cut at the multiples of
//!   [`SPLIT_TOKENS`] positions (fixed, not sized to the batch or the thread count,
//!   so that a row's bits never depend on them); it also preallocates every item's
//!   partial output and LSE.
//! * An item covers every KV head rather than one: a token's K (or V) row for all
//!   heads is contiguous, so whole blocks stream from memory. Per-head items read
//!   `head_dim`-sized pieces 4 KiB apart (Llama-8B shape), one page per key, which
//!   defeats the hardware prefetchers; measured, that ran at a fifth of bandwidth.
//! * [`AttentionBackend::run`] checks buffer sizes ([`LayerIo::validate`]), runs the items in parallel (each
//!   KV head serves its whole GQA group, see [`kernel`]), then merges
//!   the partial results of each head in position order (`pagoda_kernels::attn::Merge`,
//!   the log-sum-exp merge of [`pagoda_core::merge_states`] folded over n parts).
//!   No allocation, no planning.

pub mod kernel;

use pagoda_core::{
    register_backend, AttentionBackend, AttentionConfig, BackendRegistration, BatchDescriptor,
    Capabilities, CoreError, DType, InvalidReason, KvPools, LayerIo, Role, CPU_SPLIT_ARITHMETIC,
    F8E4M3,
};
use pagoda_kernels::{attn, Isa, KvElem, StepBlocks, E4M3};
use rayon::prelude::*;
use thiserror::Error;

/// The registered name.
pub const NAME: &str = "paged";
/// Keys per split: a request's keys are cut at the multiples of this many
/// positions, one work item each (fixed, so that results are batch-invariant).
pub const SPLIT_TOKENS: usize = attn::SPLIT_KEYS;

/// Errors of the paged backend's own API (the protocol's errors are [`CoreError`]s).
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PagedError {
    #[error("paged backend cannot serve this configuration: {reasons:?}")]
    Unsupported { reasons: Vec<InvalidReason> },
    #[error("instruction set {isa:?} is not available on this CPU")]
    IsaUnavailable { isa: Isa },
}

impl From<PagedError> for CoreError {
    fn from(e: PagedError) -> Self {
        match e {
            PagedError::Unsupported { reasons } => CoreError::BackendInvalid {
                backend: NAME.into(),
                reasons,
            },
            other => CoreError::BackendFailed {
                backend: NAME.into(),
                message: other.to_string(),
            },
        }
    }
}

/// Largest supported head dim.
pub const MAX_HEAD_DIM: usize = 256;

/// Head dims 16, 32, .., 256 (the kernels step through a head in 16-lane chunks).
pub fn supported_head_dims() -> Vec<usize> {
    (1..=MAX_HEAD_DIM / 16).map(|i| i * 16).collect()
}

/// What `paged` serves: CPU, f32 queries, an f32, bf16, f16 or fp8 KV cache, decode
/// only, any block size, LSE output, sliding window and logits soft-cap.
pub fn capabilities() -> Capabilities {
    Capabilities {
        kv_dtypes: vec![DType::F32, DType::BF16, DType::F16, DType::F8E4M3],
        sliding_window: true,
        logits_soft_cap: true,
        head_dims: Some(supported_head_dims()),
        max_gqa_ratio: Some(kernel::MAX_GROUP),
        prefill: false,
        ..Capabilities::cpu_f32()
    }
}

fn create(cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> {
    Ok(Box::new(PagedBackend::new(cfg)?))
}

register_backend!(BackendRegistration {
    name: NAME,
    priority: 100,
    description: "CPU paged decode attention: split-KV flash-decoding, AVX-512/AVX2, rayon",
    capabilities,
    runtime_reasons: pagoda_core::no_runtime_reasons,
    create,
});

/// One unit of parallel work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkItem {
    pub req: u32,
    /// Key positions `start..end`.
    pub start: u32,
    pub end: u32,
}

/// The per-step metadata built by `plan`.
#[derive(Debug, Default)]
struct Plan {
    planned: bool,
    num_reqs: usize,
    blocks: StepBlocks,
    /// In task order: a task's items are consecutive.
    items: Vec<WorkItem>,
    /// `(first item, items)`: one item, or split `t` of every row of (a piece of) a
    /// verify run that reaches it, served in one pass ([`kernel::attend_run`]).
    tasks: Vec<(u32, u32)>,
    /// Row `r`'s items are `row_items[first_item[r]..][..splits[r]]`, in split order.
    row_items: Vec<u32>,
    first_item: Vec<usize>,
    splits: Vec<usize>,
    partial_o: Vec<f32>,
    partial_lse: Vec<f32>,
    partial_l: Vec<f32>,
}

/// The paged decode backend.
pub struct PagedBackend {
    cfg: AttentionConfig,
    isa: Isa,
    plan: Plan,
}

impl PagedBackend {
    /// A backend for `cfg`, or the reasons it cannot serve it as a decode backend.
    pub fn new(cfg: &AttentionConfig) -> Result<Self, PagedError> {
        let reasons = capabilities().reasons(cfg, Role::Decode);
        if !reasons.is_empty() {
            return Err(PagedError::Unsupported { reasons });
        }
        Ok(PagedBackend {
            cfg: cfg.clone(),
            isa: Isa::detect(),
            plan: Plan::default(),
        })
    }

    /// The instruction set the kernels use: [`Isa::detect`] (so
    /// `PAGODA_DISABLE_AVX512=1` turns AVX-512 off here too) unless [`Self::set_isa`].
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Forces a slower instruction set (tests compare every ISA with the reference).
    /// Fails if it is not [`Isa::available`].
    pub fn set_isa(&mut self, isa: Isa) -> Result<(), PagedError> {
        if !isa.available() {
            return Err(PagedError::IsaUnavailable { isa });
        }
        self.isa = isa;
        Ok(())
    }

    /// The work items of the last plan.
    pub fn work_items(&self) -> &[WorkItem] {
        &self.plan.items
    }

    fn plan_batch(&mut self, b: &BatchDescriptor) -> Result<(), CoreError> {
        self.plan.planned = false;
        capabilities().check_batch(NAME, &self.cfg, b)?;
        let n = b.num_reqs();
        let (bs, nh, hd) = (b.block_size(), self.cfg.num_heads, self.cfg.head_dim);
        let p = &mut self.plan;
        p.num_reqs = n;
        p.blocks
            .copy_from(bs, b.block_table(), b.block_table_stride(), b.seq_lens());

        // Splits of `attn::SPLIT_KEYS` positions, cut at its multiples: their
        // boundaries depend on positions only, never on the batch or the thread
        // count, so a row's bits do not either (and `flash` cuts a prefill row's
        // keys at the same places).
        let window = self.cfg.sliding_window;
        let lo = |r: usize| b.seq_len(r) - window.map_or(b.seq_len(r), |w| b.seq_len(r).min(w));
        p.items.clear();
        p.tasks.clear();
        p.row_items.clear();
        p.first_item.clear();
        p.splits.clear();
        for r in 0..n {
            p.first_item.push(p.row_items.len());
            let count = attn::splits(lo(r), b.seq_len(r)).count();
            p.splits.push(count);
            p.row_items.resize(p.row_items.len() + count, 0);
        }
        let threads = rayon::current_num_threads();
        let mut runs = b.verify_runs().peekable();
        let mut r = 0;
        while r < n {
            let run = match runs.next_if(|run| run.start == r) {
                // One pass needs the same split starts: the same first key.
                Some(run) if run.clone().all(|j| lo(j) == lo(r)) => run,
                _ => r..r + 1,
            };
            // Pieces of the run, enough for every thread to have a task: a run that
            // reaches few splits (a short context) would otherwise run on one
            // thread. (How rows are grouped never changes a row's arithmetic.)
            let splits = p.splits[run.end - 1];
            let pieces = threads.div_ceil(splits).clamp(1, run.len());
            let per = run.len().div_ceil(pieces).min(kernel::MAX_RUN);
            for piece in run.clone().step_by(per) {
                p.add_tasks(piece..(piece + per).min(run.end), lo(r), b);
            }
            r = run.end;
        }
        p.partial_o.resize(p.items.len() * nh * hd, 0.0);
        p.partial_lse.resize(p.items.len() * nh, 0.0);
        p.partial_l.resize(p.items.len() * nh, 0.0);
        p.planned = true;
        Ok(())
    }

    fn run_layer(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        let p = &mut self.plan;
        if !p.planned {
            return Err(CoreError::NotPlanned {
                backend: NAME.into(),
            });
        }
        let cfg = &self.cfg;
        let (nh, hd) = (cfg.num_heads, cfg.head_dim);
        let num_blocks = io.validate(p.num_reqs, cfg)?;
        let io = io.into_host_kv()?;
        if let Some(block) = p.blocks.out_of_range(num_blocks) {
            return Err(CoreError::BlockOutOfRange { block, num_blocks });
        }
        let (q, isa) = (io.q, self.isa);
        // SAFETY: `isa` is `Isa::detect()` or was checked by `set_isa`; every block
        // id in use is below `num_blocks` (`out_of_range` above), the pools' size
        // checked by `io.validate`, and `q` holds `num_reqs` rows.
        unsafe {
            match io.kv {
                KvPools::F32(k, v) => attend_items(p, cfg, isa, q, k, v),
                KvPools::BF16(k, v) => attend_items(p, cfg, isa, q, k, v),
                KvPools::F16(k, v) => attend_items(p, cfg, isa, q, k, v),
                KvPools::F8E4M3(k, v) => {
                    let (k, v) = (fp8_bits(k), fp8_bits(v));
                    attend_items(p, cfg, isa, q, k, v)
                }
            }
        }

        let merge = |r: usize, out: &mut [f32], lse: Option<&mut [f32]>| {
            merge_request(p, r, nh, hd, out, lse);
        };
        match io.lse {
            Some(l) => io
                .out
                .par_chunks_mut(nh * hd)
                .zip(l.par_chunks_mut(nh))
                .enumerate()
                .for_each(|(r, (o, l))| merge(r, o, Some(l))),
            None => io
                .out
                .par_chunks_mut(nh * hd)
                .enumerate()
                .for_each(|(r, o)| merge(r, o, None)),
        }
        Ok(())
    }
}

impl Plan {
    /// The tasks of rows `rows` (one row, or consecutive rows of a verify run, whose
    /// key ranges all start at `lo`): for each split of the last (longest) row, one
    /// task of the rows that reach it. Row `r`'s split `t` has the same start as
    /// the last row's (cut at the same multiples from the same `lo`) and ends at
    /// `min(seq_len(r), end)`.
    fn add_tasks(&mut self, rows: std::ops::Range<usize>, lo: usize, b: &BatchDescriptor) {
        let last = rows.end - 1;
        for (t, (start, end)) in attn::splits(lo, b.seq_len(last)).enumerate() {
            let first = self.items.len();
            for r in rows.clone().filter(|&r| t < self.splits[r]) {
                self.row_items[self.first_item[r] + t] = self.items.len() as u32;
                self.items.push(WorkItem {
                    req: r as u32,
                    start: start as u32,
                    // Split t of row r: the same start, its own end.
                    end: b.seq_len(r).min(end) as u32,
                });
            }
            self.tasks
                .push((first as u32, (self.items.len() - first) as u32));
        }
    }
}

/// A plan's partial buffer, written by disjoint tasks in parallel.
#[derive(Clone, Copy)]
struct Partials(*mut f32);
// SAFETY: made from a `&mut [f32]` borrowed for the whole parallel call; each task
// writes only its own items' elements through it (tasks cover disjoint items).
unsafe impl Send for Partials {}
// SAFETY: as for `Send`.
unsafe impl Sync for Partials {}
impl Partials {
    /// Items `items` of `per` elements each.
    ///
    /// # Safety
    /// The buffer holds those items, and no other live slice covers them.
    #[allow(clippy::mut_from_ref)]
    unsafe fn items(&self, items: std::ops::Range<usize>, per: usize) -> &mut [f32] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(items.start * per), items.len() * per) }
    }
}

/// Every task of the plan over pools of `E`, into the plan's partial outputs.
///
/// # Safety
/// `isa` is available on this CPU; `q` holds the plan's `num_reqs` query rows, and
/// every block id the plan uses is below the pools' number of blocks (`kc` and `vc`
/// of equal length, whole blocks).
unsafe fn attend_items<E: KvElem>(
    p: &mut Plan,
    cfg: &AttentionConfig,
    isa: Isa,
    q: &[f32],
    kc: &[E],
    vc: &[E],
) {
    let (nh, nkv, hd, bs) = (
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.block_size,
    );
    let (g, scale, soft_cap) = (cfg.gqa_ratio(), cfg.scale, cfg.logits_soft_cap);
    let (blocks, items) = (&p.blocks, &p.items);
    let po = Partials(p.partial_o.as_mut_ptr());
    let plse = Partials(p.partial_lse.as_mut_ptr());
    let pl = Partials(p.partial_l.as_mut_ptr());
    let q_row = |r: usize| &q[r * nh * hd..(r + 1) * nh * hd];
    p.tasks
        .par_iter()
        .with_max_len(1)
        .for_each(|&(first, count)| {
            let range = first as usize..(first + count) as usize;
            let it = items[range.end - 1];
            let r = it.req as usize;
            let args = kernel::ItemArgs {
                q: q_row(r),
                k_cache: kc,
                v_cache: vc,
                blocks: blocks.blocks(r, bs),
                block_size: bs,
                num_kv_heads: nkv,
                head_dim: hd,
                group: g,
                scale,
                soft_cap,
                start: it.start as usize,
                end: it.end as usize,
            };
            // SAFETY: the partial buffers hold every item (sized in `plan`) and tasks
            // cover disjoint item ranges.
            let (o, lse, l) = unsafe {
                (
                    po.items(range.clone(), nh * hd),
                    plse.items(range.clone(), nh),
                    pl.items(range.clone(), nh),
                )
            };
            if count == 1 {
                // SAFETY: `isa` is available and every block id in use is inside the
                // pools (this function's contract); `blocks(r, bs)` covers the
                // request's `seq_len >= end` positions.
                unsafe { kernel::attend(isa, &args, o, lse, l) };
                return;
            }
            // A verify run's rows (their blocks are the last row's, cut shorter).
            let mut rows = [kernel::RunRow { q: &[], end: 0 }; kernel::MAX_RUN];
            for (row, it) in rows.iter_mut().zip(&items[range]) {
                *row = kernel::RunRow {
                    q: q_row(it.req as usize),
                    end: it.end as usize,
                };
            }
            // SAFETY: as above; the last row's blocks cover every row's positions.
            unsafe { kernel::attend_run(isa, &args, &rows[..count as usize], o, lse, l) };
        });
}

/// Merge of request `r`'s splits into its output row `[nh, hd]`, folded in
/// position order (`attn::Merge`, which `flash` runs too). `acc` is `hd` floats of
/// scratch.
fn merge_request(
    p: &Plan,
    r: usize,
    nh: usize,
    hd: usize,
    out: &mut [f32],
    mut lse: Option<&mut [f32]>,
) {
    let (splits, base) = (p.splits[r], p.first_item[r]);
    let mut acc = [0f32; MAX_HEAD_DIM];
    for head in 0..nh {
        let (mut m, mut l) = (0.0, 0.0);
        let mut g = attn::Merge {
            m: &mut m,
            l: &mut l,
            o: &mut acc[..hd],
        };
        g.reset();
        for k in 0..splits {
            let i = p.row_items[base + k] as usize * nh + head;
            g.add(p.partial_lse[i], &p.partial_o[i * hd..(i + 1) * hd]);
        }
        let x = g.finish(&mut out[head * hd..(head + 1) * hd]);
        if let Some(l) = lse.as_deref_mut() {
            l[head] = x;
        }
    }
}

impl AttentionBackend for PagedBackend {
    fn name(&self) -> &str {
        NAME
    }

    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError> {
        self.plan_batch(batch)
    }

    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        self.run_layer(io)
    }

    /// `pagoda_kernels::attn`'s arithmetic, which `paged` and `flash` share.
    fn batch_invariant(&self) -> Option<&'static str> {
        Some(CPU_SPLIT_ARITHMETIC)
    }

    /// A verify run's rows take one pass per split ([`kernel::attend_run`]), each
    /// with a plain decode row's chunk steps.
    fn serves_verify_runs(&self) -> bool {
        true
    }
}

/// An fp8 pool as the kernels read it (the same bytes; `pagoda-kernels` knows no
/// core types).
fn fp8_bits(x: &[F8E4M3]) -> &[E4M3] {
    E4M3::from_bits_slice(F8E4M3::slice_to_bits(x))
}
