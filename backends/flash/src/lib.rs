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
//! * [`AttentionBackend::run`] checks the buffers ([`LayerIo::validate`]), then runs
//!   the tiles in parallel ([`kernel::tile`]), reading K/V in place from the cache.
//!   Each tile writes a disjoint set of output rows.
//!
//! Each row's arithmetic is `pagoda_kernels::attn`'s, the one `paged` runs for a
//! decode row (fixed-size splits cut at positions, one merge order): a prompt
//! token's output does not depend on the batch, the chunking of its prompt, the
//! prefix cache or the thread count, and equals its decode-row output bit for bit
//! (the `batch_invariant` capability).

pub mod kernel;

use kernel::{Dims, Scratch, Tile, TileIo};
use pagoda_core::{
    register_backend, AttentionBackend, AttentionConfig, BackendRegistration, BatchDescriptor,
    Capabilities, CoreError, DType, InvalidReason, KvPools, LayerIo, Role, CPU_SPLIT_ARITHMETIC,
    F8E4M3,
};
use pagoda_kernels::{attn, Isa, KvElem, StepBlocks, E4M3};
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

/// Head dims 16, 32, .., 256: `paged`'s, since a row runs the same arithmetic (the
/// kernels step through a head in 16-lane chunks).
pub fn supported_head_dims() -> Vec<usize> {
    (1..=MAX_HEAD_DIM / 16).map(|i| i * 16).collect()
}

/// What `flash` serves: CPU, f32 queries, an f32, bf16, f16 or fp8 KV cache, prefill rows
/// only, head dims 16, 32, .., 256, GQA groups up to 64, any block size, LSE output.
pub fn capabilities() -> Capabilities {
    Capabilities {
        kv_dtypes: vec![DType::F32, DType::BF16, DType::F16, DType::F8E4M3],
        head_dims: Some(supported_head_dims()),
        max_gqa_ratio: Some(attn::MAX_GROUP),
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

/// Raw output pointers (attention output, LSE) shared by the tile tasks, which
/// write disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32, *mut f32);
// SAFETY: an `OutPtr` points into buffers that `run_layer` borrows mutably for the
// whole parallel loop, and its users write disjoint parts: each tile its own
// (token, head) rows (see `kernel::tile`).
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
        let run = Run {
            dims: &dims,
            items: &self.items,
            blocks: &self.blocks,
            scratch: &self.scratch,
            isa: self.isa,
            q: io.q,
            ptrs,
        };
        // SAFETY: every block id in use is below `num_blocks` (`out_of_range` above),
        // the pools' size checked by `io.validate`, as are `q`, `out` and `lse` for
        // `num_tokens` tokens; `isa` is `Isa::detect()`; the capabilities (checked by
        // `new`) bound the head dim to multiples of 16 and the group to MAX_GROUP;
        // the scratch was sized by `plan` for its tiles.
        unsafe {
            match io.kv {
                KvPools::F32(k, v) => run.all(k, v),
                KvPools::BF16(k, v) => run.all(k, v),
                KvPools::F16(k, v) => run.all(k, v),
                KvPools::F8E4M3(k, v) => run.all(fp8_bits(k), fp8_bits(v)),
            }
        }
        Ok(())
    }
}

/// One layer's tiles and what they share.
struct Run<'a> {
    dims: &'a Dims,
    items: &'a [Item],
    blocks: &'a StepBlocks,
    scratch: &'a [Mutex<Scratch>],
    isa: Isa,
    q: &'a [f32],
    ptrs: OutPtr,
}

impl Run<'_> {
    /// Every tile, in parallel, over pools of `E`.
    ///
    /// # Safety
    /// As in `run_layer`: the batch's blocks are inside the pools, the buffers
    /// sized for the batch, `isa` available, the shapes within the capabilities.
    unsafe fn all<E: KvElem>(&self, kc: &[E], vc: &[E]) {
        let bs = self.dims.block_size;
        self.items.par_iter().with_max_len(1).for_each(|it| {
            // Capture the whole Send wrapper, not its raw-pointer fields (edition 2021).
            #[allow(clippy::redundant_locals)]
            let ptrs = self.ptrs;
            // One scratch per pool thread; a tile never yields inside, so the lock is free.
            let idx = rayon::current_thread_index().unwrap_or(0) % self.scratch.len();
            let mut sc = self.scratch[idx].lock().unwrap_or_else(|e| e.into_inner());
            let io = TileIo {
                q: self.q,
                k_cache: kc,
                v_cache: vc,
                blocks: self.blocks.blocks(it.req, bs),
                out: ptrs.0,
                lse: ptrs.1,
            };
            // SAFETY: this function's contract; `blocks(req)` covers the request's
            // seq_len = context + query_len positions; tiles write disjoint rows.
            unsafe { run_tile(self.isa, self.dims, &it.tile, &io, &mut sc) };
        });
    }
}

/// Calls the tile kernel compiled for `isa`, so that it runs `isa`'s vectors (the
/// ones `paged` uses for the same rows).
///
/// # Safety
/// `isa` is available on this CPU, and `io` meets [`kernel::tile`]'s contract.
unsafe fn run_tile<E: KvElem>(isa: Isa, d: &Dims, t: &Tile, io: &TileIo<'_, E>, sc: &mut Scratch) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        {
            use pagoda_kernels::simd::{Avx2, Avx512};
            #[target_feature(enable = "avx512f")]
            unsafe fn avx512<E: KvElem>(d: &Dims, t: &Tile, io: &TileIo<'_, E>, sc: &mut Scratch) {
                // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
                unsafe { kernel::tile::<Avx512, E>(d, t, io, sc) }
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2<E: KvElem>(d: &Dims, t: &Tile, io: &TileIo<'_, E>, sc: &mut Scratch) {
                // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
                unsafe { kernel::tile::<Avx2, E>(d, t, io, sc) }
            }
            match isa {
                Isa::Avx512 | Isa::Avx512Bf16 => return avx512(d, t, io, sc),
                Isa::Avx2 => return avx2(d, t, io, sc),
                Isa::Portable => {}
            }
        }
        let _ = isa;
        kernel::tile::<pagoda_kernels::simd::Portable, E>(d, t, io, sc)
    }
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

    /// `pagoda_kernels::attn`'s arithmetic, which `paged` and `flash` share.
    fn batch_invariant(&self) -> Option<&'static str> {
        Some(CPU_SPLIT_ARITHMETIC)
    }
}

/// An fp8 pool as the kernels read it (the same bytes; `pagoda-kernels` knows no
/// core types).
fn fp8_bits(x: &[F8E4M3]) -> &[E4M3] {
    E4M3::from_bits_slice(F8E4M3::slice_to_bits(x))
}
