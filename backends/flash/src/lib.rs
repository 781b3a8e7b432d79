//! Flash-style prefill attention on CPU: tiled online softmax over the paged cache.
//!
//! Registered as `"flash"`. Serves prefill rows only (query length > 1, variable
//! lengths, with or without cached context), over an f32, bf16, f16 or fp8 KV cache
//! (`--kv-cache-dtype`; rows widened to f32 as they are repacked), and declares so in its
//! [`capabilities`]: as a GEMM tile a decode row is only `group` rows tall, and
//! packing its whole context costs as much again (measured 3-4x slower than the
//! `paged` split-KV kernel). Mixed batches run through the selector's
//! `HybridBackend` (`decode=paged,prefill=flash`, the automatic choice), which hands
//! this backend the prefill rows only; `--attention-backend flash` alone is refused
//! by the selector with that reason.
//!
//! * [`AttentionBackend::plan`] cuts every request into tiles of
//!   `(kv head, query tokens)` with about [`kernel::TILE_ROWS`] rows, and sizes one
//!   [`kernel::Scratch`] per rayon thread.
//! * [`AttentionBackend::run`] checks the buffers ([`LayerIo::validate`]), copies each (request, KV head)'s
//!   K/V rows into contiguous runs ([`kernel::pack`], one pass over the context),
//!   then runs the tiles in parallel
//!   ([`kernel::tile`]: GEMM tiles with the `gemm` crate, online softmax). Each tile
//!   writes a disjoint set of output rows.

pub mod kernel;

use kernel::{Dims, Scratch, Tile, TileIo};
use pagoda_core::{
    register_backend, AttentionBackend, AttentionConfig, BackendRegistration, BatchDescriptor,
    Capabilities, CoreError, DType, InvalidReason, KvPools, LayerIo, Role, F8E4M3,
};
use pagoda_kernels::{Isa, KvElem, StepBlocks, E4M3};
use rayon::prelude::*;
use std::sync::Mutex;
use thiserror::Error;

/// The registered name.
pub const NAME: &str = "flash";
/// Largest supported head dim.
pub const MAX_HEAD_DIM: usize = 256;

/// Errors of the flash backend's own API (the protocol's errors are [`CoreError`]s).
#[derive(Debug, Error, Clone, PartialEq)]
pub enum FlashError {
    #[error("flash backend cannot serve this configuration: {reasons:?}")]
    Unsupported { reasons: Vec<InvalidReason> },
    #[error("run called in a pool of {threads} threads, planned for {planned}")]
    PoolGrew { threads: usize, planned: usize },
}

impl From<FlashError> for CoreError {
    fn from(e: FlashError) -> Self {
        match e {
            FlashError::Unsupported { reasons } => CoreError::BackendInvalid {
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

/// What `flash` serves: CPU, f32 queries, an f32, bf16, f16 or fp8 KV cache, prefill rows
/// only, head dims 1..=256, any block size, LSE output.
pub fn capabilities() -> Capabilities {
    Capabilities {
        kv_dtypes: vec![DType::F32, DType::BF16, DType::F16, DType::F8E4M3],
        head_dims: Some((1..=MAX_HEAD_DIM).collect()),
        max_gqa_ratio: Some(kernel::TILE_ROWS),
        decode: false,
        sliding_window: true,
        logits_soft_cap: true,
        ..Capabilities::cpu_f32()
    }
}

fn create(cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> {
    Ok(Box::new(FlashBackend::new(cfg)?))
}

register_backend!(BackendRegistration {
    name: NAME,
    priority: 90,
    description:
        "CPU flash-style prefill: GQA-packed query tiles, GEMM tiles, online softmax, rayon",
    capabilities,
    runtime_reasons: pagoda_core::no_runtime_reasons,
    create,
});

/// A tile plus the request it belongs to.
#[derive(Debug, Clone, Copy)]
struct Item {
    req: usize,
    tile: Tile,
}

/// A raw output pointer shared by the tile tasks, which write disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32, *mut f32);
// SAFETY: an `OutPtr` points into buffers that `run_layer` borrows mutably for the
// whole parallel loop, and its users write disjoint parts: each (request, KV head)
// its own packed run, each tile its own (token, head) rows (see `kernel::tile`).
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`: concurrent users write disjoint elements only.
unsafe impl Sync for OutPtr {}

/// The flash prefill backend.
pub struct FlashBackend {
    cfg: AttentionConfig,
    planned: bool,
    num_tokens: usize,
    blocks: StepBlocks,
    items: Vec<Item>,
    scratch: Vec<Mutex<Scratch>>,
    /// Which `#[target_feature]` instantiation of the tile kernel to call
    /// ([`Isa::detect`], so `PAGODA_DISABLE_AVX512=1` reaches it).
    isa: Isa,
    /// Per request: first packed token (requests are packed back to back).
    pack_off: Vec<usize>,
    /// Packed K and V, `[request][kv head][position][head_dim]`.
    packed_k: Vec<f32>,
    packed_v: Vec<f32>,
}

impl FlashBackend {
    /// A backend for `cfg`, or the reasons it cannot serve it.
    pub fn new(cfg: &AttentionConfig) -> Result<Self, FlashError> {
        let reasons = capabilities().reasons(cfg, Role::Prefill);
        if !reasons.is_empty() {
            return Err(FlashError::Unsupported { reasons });
        }
        Ok(FlashBackend {
            cfg: cfg.clone(),
            planned: false,
            num_tokens: 0,
            blocks: StepBlocks::default(),
            items: Vec::new(),
            scratch: Vec::new(),
            pack_off: Vec::new(),
            packed_k: Vec::new(),
            packed_v: Vec::new(),
            isa: Isa::detect(),
        })
    }

    /// The instruction set the tile kernel is compiled for ([`Isa::detect`]).
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Number of tiles in the last plan.
    pub fn num_tiles(&self) -> usize {
        self.items.len()
    }

    fn plan_batch(&mut self, b: &BatchDescriptor) -> Result<(), CoreError> {
        self.planned = false;
        capabilities().check_batch(NAME, &self.cfg, b)?;
        let (g, nkv, hd) = (
            self.cfg.gqa_ratio(),
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
        );
        let tile_tokens = (kernel::TILE_ROWS / g).max(1);
        self.num_tokens = b.num_tokens();
        self.blocks.copy_from(
            b.block_size(),
            b.block_table(),
            b.block_table_stride(),
            b.seq_lens(),
        );
        self.items.clear();
        // Longest tiles (most keys) first, so that rayon's stealing ends balanced.
        for r in (0..b.num_reqs()).rev() {
            let ql = b.query_len(r);
            let mut q1 = ql;
            while q1 > 0 {
                let q0 = q1.saturating_sub(tile_tokens);
                for h in 0..nkv {
                    let tile = Tile {
                        kv_head: h,
                        token0: b.tokens(r).start,
                        q0,
                        q1,
                        context: b.context_len(r),
                    };
                    self.items.push(Item { req: r, tile });
                }
                q1 = q0;
            }
        }
        self.items
            .sort_by_key(|it| std::cmp::Reverse(it.tile.context + it.tile.q1));
        self.pack_off.clear();
        let mut total = 0;
        for &s in b.seq_lens() {
            self.pack_off.push(total);
            total += s as usize;
        }
        self.packed_k.resize(total * nkv * hd, 0.0);
        self.packed_v.resize(total * nkv * hd, 0.0);
        let threads = rayon::current_num_threads().max(1);
        let rows = tile_tokens * g;
        while self.scratch.len() < threads {
            self.scratch.push(Mutex::new(Scratch::new(rows, hd)));
        }
        self.planned = true;
        Ok(())
    }

    fn run_layer(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        if !self.planned {
            return Err(CoreError::NotPlanned {
                backend: NAME.into(),
            });
        }
        let threads = rayon::current_num_threads();
        if threads > self.scratch.len() {
            return Err(FlashError::PoolGrew {
                threads,
                planned: self.scratch.len(),
            }
            .into());
        }
        let cfg = &self.cfg;
        let (nh, nkv, hd, bs) = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.block_size,
        );
        let num_blocks = io.validate(self.num_tokens, cfg)?;
        let io = io.into_host_kv()?;
        if let Some(block) = self.blocks.out_of_range(num_blocks) {
            return Err(CoreError::BlockOutOfRange { block, num_blocks });
        }
        let lse_ptr = io.lse.map_or(std::ptr::null_mut(), |l| l.as_mut_ptr());
        let ptrs = OutPtr(io.out.as_mut_ptr(), lse_ptr);
        let dims = Dims {
            num_heads: nh,
            num_kv_heads: nkv,
            group: cfg.gqa_ratio(),
            head_dim: hd,
            block_size: bs,
            scale: cfg.scale,
            sliding_window: cfg.sliding_window,
            soft_cap: cfg.logits_soft_cap,
        };
        let q = io.q;
        let (blocks, pack_off) = (&self.blocks, &self.pack_off);
        let seq_lens = &blocks.seq_lens;
        // Where request r's KV head h starts in the packed buffers.
        let base = |r: usize, h: usize| (pack_off[r] * nkv + h * seq_lens[r] as usize) * hd;
        let packed = OutPtr(self.packed_k.as_mut_ptr(), self.packed_v.as_mut_ptr());
        let isa = self.isa;
        // SAFETY: every block id in use is below `num_blocks` (`out_of_range` above),
        // the pools' size checked by `io.validate`; `plan` sized the packed buffers
        // to sum(seq_lens) * nkv * hd; `isa` is `Isa::detect()`.
        unsafe {
            match io.kv {
                KvPools::F32(k, v) => pack_all(isa, k, v, blocks, &dims, base, packed),
                KvPools::BF16(k, v) => pack_all(isa, k, v, blocks, &dims, base, packed),
                KvPools::F16(k, v) => pack_all(isa, k, v, blocks, &dims, base, packed),
                KvPools::F8E4M3(k, v) => {
                    let (k, v) = (fp8_bits(k), fp8_bits(v));
                    pack_all(isa, k, v, blocks, &dims, base, packed)
                }
            }
        }
        let (pk, pv) = (
            self.packed_k.as_ptr() as usize,
            self.packed_v.as_ptr() as usize,
        );
        let scratch = &self.scratch;
        self.items.par_iter().with_max_len(1).for_each(|it| {
            // Capture the whole Send wrapper, not its raw-pointer fields (edition 2021).
            #[allow(clippy::redundant_locals)]
            let ptrs = ptrs;
            let off = base(it.req, it.tile.kv_head);
            let (k, v) = (
                (pk as *const f32).wrapping_add(off),
                (pv as *const f32).wrapping_add(off),
            );
            // One scratch per pool thread; a tile never yields inside, so the lock is free.
            let idx = rayon::current_thread_index().unwrap_or(0) % scratch.len();
            let mut sc = scratch[idx].lock().unwrap_or_else(|e| e.into_inner());
            let io = TileIo {
                q,
                k,
                v,
                out: ptrs.0,
                lse: ptrs.1,
            };
            // SAFETY: `io.validate` checked `q`, `out` and `lse` for `num_tokens`
            // tokens; `k`/`v` point at this (request, KV head)'s packed run of
            // seq_len >= context + q1 rows; tiles write disjoint (token, head) rows;
            // `isa` is `Isa::detect()`, so available on this CPU.
            unsafe { run_tile(isa, &dims, &it.tile, &io, &mut sc) };
        });
        Ok(())
    }
}

/// Repacks every (request, KV head)'s rows `0..seq_len` into its f32 run at
/// `base(r, h)` of `packed` (K, V), in parallel, widening with `isa`'s vectors.
///
/// # Safety
/// `isa` is available on this CPU; every block id of `blocks` in use is inside the
/// pools `kc`/`vc`; the packed buffers hold every run (`sum(seq_lens) * nkv * hd`
/// elements, run (r, h) of `seq_len[r] * hd` at `base(r, h)`, the runs disjoint).
unsafe fn pack_all<E: KvElem>(
    isa: Isa,
    kc: &[E],
    vc: &[E],
    blocks: &StepBlocks,
    d: &Dims,
    base: impl Fn(usize, usize) -> usize + Sync,
    packed: OutPtr,
) {
    let (nkv, bs) = (d.num_kv_heads, d.block_size);
    let seq_lens = &blocks.seq_lens;
    (0..seq_lens.len() * nkv).into_par_iter().for_each(|i| {
        // Capture the whole Send wrapper, not its raw-pointer fields (edition 2021).
        #[allow(clippy::redundant_locals)]
        let packed = packed;
        let (r, h) = (i / nkv, i % nkv);
        let seq = seq_lens[r] as usize;
        let blocks = blocks.blocks(r, bs);
        // SAFETY: (r, h)'s run of seq * hd floats at base(r, h) is in bounds and no
        // other task's; the rest is this function's contract.
        unsafe {
            let (dk, dv) = (packed.0.add(base(r, h)), packed.1.add(base(r, h)));
            pack_isa(isa, (kc, vc), blocks, d, h, seq, (dk, dv));
        }
    });
}

/// [`kernel::pack`] compiled for `isa`.
///
/// # Safety
/// `isa` is available on this CPU, and the arguments meet [`kernel::pack`]'s contract.
unsafe fn pack_isa<E: KvElem>(
    isa: Isa,
    (kc, vc): (&[E], &[E]),
    blocks: &[u32],
    d: &Dims,
    h: usize,
    seq: usize,
    (dk, dv): (*mut f32, *mut f32),
) {
    let (nkv, hd, bs) = (d.num_kv_heads, d.head_dim, d.block_size);
    #[cfg(target_arch = "x86_64")]
    {
        use pagoda_kernels::simd::{Avx2, Avx512};
        type Args<'a, E> = (
            (&'a [E], &'a [E]),
            &'a [u32],
            [usize; 5],
            (*mut f32, *mut f32),
        );
        #[target_feature(enable = "avx512f")]
        unsafe fn avx512<E: KvElem>(a: Args<'_, E>) {
            let ((kc, vc), b, [bs, nkv, h, hd, seq], (dk, dv)) = a;
            kernel::pack::<Avx512, E>(kc, vc, b, bs, nkv, h, hd, seq, dk, dv)
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn avx2<E: KvElem>(a: Args<'_, E>) {
            let ((kc, vc), b, [bs, nkv, h, hd, seq], (dk, dv)) = a;
            kernel::pack::<Avx2, E>(kc, vc, b, bs, nkv, h, hd, seq, dk, dv)
        }
        let a = ((kc, vc), blocks, [bs, nkv, h, hd, seq], (dk, dv));
        match isa {
            Isa::Avx512 | Isa::Avx512Bf16 => return avx512(a),
            Isa::Avx2 => return avx2(a),
            Isa::Portable => {}
        }
    }
    let _ = isa;
    kernel::pack::<pagoda_kernels::simd::Portable, E>(kc, vc, blocks, bs, nkv, h, hd, seq, dk, dv)
}

/// Calls the tile kernel compiled for the detected ISA, so its softmax loops vectorise wide.
///
/// # Safety
/// `isa` is available on this CPU, and `io` meets [`kernel::tile`]'s contract.
unsafe fn run_tile(isa: Isa, d: &Dims, t: &Tile, io: &TileIo<'_>, sc: &mut Scratch) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        unsafe fn avx512(d: &Dims, t: &Tile, io: &TileIo<'_>, sc: &mut Scratch) {
            kernel::tile(d, t, io, sc)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(d: &Dims, t: &Tile, io: &TileIo<'_>, sc: &mut Scratch) {
            kernel::tile(d, t, io, sc)
        }
        match isa {
            Isa::Avx512 | Isa::Avx512Bf16 => return avx512(d, t, io, sc),
            Isa::Avx2 => return avx2(d, t, io, sc),
            Isa::Portable => {}
        }
    }
    let _ = isa;
    kernel::tile(d, t, io, sc)
}

impl AttentionBackend for FlashBackend {
    fn name(&self) -> &str {
        NAME
    }

    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError> {
        self.plan_batch(batch)
    }

    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        self.run_layer(io)
    }
}

/// An fp8 pool as the kernels read it (the same bytes; `pagoda-kernels` knows no
/// core types).
fn fp8_bits(x: &[F8E4M3]) -> &[E4M3] {
    E4M3::from_bits_slice(F8E4M3::slice_to_bits(x))
}
