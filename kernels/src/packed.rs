//! `out = x · wᵀ` with `w` packed once, at load time, into column panels for a
//! broadcast-form (BLIS-style) GEMM: the serving path's matmul for f32 weights.
//!
//! `w` (`[n, k]`, `nn.Linear` layout) is stored as panels of [`PANEL`] rows of `w`
//! (output columns), each panel `k` lines of [`PANEL`] floats: line `p` of panel
//! `j` holds `w[j*PANEL .. (j+1)*PANEL][p]`, zero-padded past `n`. The AVX-512
//! micro-kernel keeps an `MR × PANEL` block of outputs in 24 registers, and per
//! `p` loads one 256-byte line of the panel and broadcasts `MR` scalars of `x`:
//! 24 FMAs per 4 + 6 loads and no horizontal sums, which runs near the core's FMA
//! peak (measured 270-286 GFLOP/s on one Zen core at m = 32, against 167-182 for
//! the dot-product tiles of `avx512.rs`). Lines are contiguous, so `m = 1` streams
//! each panel front to back (the decode case is bound by reading `w`).
//!
//! Every output element is one accumulator lane summed over `p = 0..k` in order,
//! whatever `m` is and whichever rows share a tile, so a row's result does not
//! depend on the batch it came in (the engine's "batched = solo" guarantee).

use crate::error::{check_len, KernelError};
use crate::matmul::{trivial, OutPtr};

/// Output columns (rows of `w`) per panel: four 16-lane vectors.
pub const PANEL: usize = 64;

/// Rows of `x` per AVX-512 micro-kernel call (6 × 4 = 24 accumulators).
pub(crate) const MR: usize = 6;

/// Below this many multiply-adds a call runs on the calling thread only.
const PARALLEL_MIN_FLOPS: usize = 1 << 16;

/// One panel line: `PANEL` floats, cache-line aligned so no load splits a line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; PANEL]);

/// A weight matrix `[n, k]` packed for [`matmul_packed`].
#[derive(Clone)]
pub struct PackedMatrix {
    n: usize,
    k: usize,
    /// `panels * k` lines.
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("n", &self.n)
            .field("k", &self.k)
            .finish_non_exhaustive()
    }
}

impl PackedMatrix {
    /// Packs `w[n, k]` (row-major).
    pub fn pack(w: &[f32], n: usize, k: usize) -> Result<Self, KernelError> {
        check_len("w", w.len(), n * k)?;
        let panels = n.div_ceil(PANEL);
        let mut lines = vec![Line([0.0; PANEL]); panels * k];
        for (j, row) in w.chunks_exact(k.max(1)).enumerate().take(n) {
            let (panel, col) = (j / PANEL, j % PANEL);
            for (p, &v) in row.iter().enumerate() {
                lines[panel * k + p].0[col] = v;
            }
        }
        Ok(PackedMatrix { n, k, lines })
    }

    /// Rows of `w` (output columns).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Columns of `w` (the reduction length).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes held, padding included.
    pub fn num_bytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<Line>()
    }

    /// Copies row `r` of the original `w` into `dst` (`k` elements): the embedding
    /// lookup when the table is tied to a packed LM head.
    pub fn row_into(&self, r: usize, dst: &mut [f32]) -> Result<(), KernelError> {
        check_row(r, self.n, self.k, dst)?;
        let (panel, col) = (r / PANEL, r % PANEL);
        let lines = &self.lines[panel * self.k..(panel + 1) * self.k];
        for (d, line) in dst.iter_mut().zip(lines) {
            *d = line.0[col];
        }
        Ok(())
    }

    /// The original `w[n, k]`, row-major.
    pub fn unpack(&self) -> Vec<f32> {
        let mut w = vec![0.0; self.n * self.k];
        for (r, row) in w.chunks_exact_mut(self.k.max(1)).enumerate().take(self.n) {
            // r < n and row has k elements.
            let _ = self.row_into(r, row);
        }
        w
    }
}

/// Arguments of a `row_into`: row `r` of `n`, into `dst` of `k` elements.
pub(crate) fn check_row(r: usize, n: usize, k: usize, dst: &[f32]) -> Result<(), KernelError> {
    if r >= n {
        return Err(KernelError::InvalidArgument {
            name: "r",
            message: format!("row {r} of a matrix with {n} rows"),
        });
    }
    check_len("dst", dst.len(), k)
}

/// `out[m, n] = x[m, k] · wᵀ` for a packed `w`.
pub fn matmul_packed(
    x: &[f32],
    w: &PackedMatrix,
    out: &mut [f32],
    m: usize,
) -> Result<(), KernelError> {
    let avx512 = crate::Isa::detect().avx512();
    run_panels(x, out, m, w.k, w.n, &w.lines, w.k, |t| {
        // SAFETY: `avx512` comes from `Isa::detect`; run_panels checked the shapes
        // and hands out tasks whose `out` is valid for `rows` x `cols` at `ldo`
        // (disjoint blocks of `out`).
        unsafe { block_rows(avx512, t) }
    })
}

/// One task of [`run_panels`]: `rows` rows of `x` (row stride `k`) times one
/// panel (`lines`), into `out` (row stride `ldo`, `cols` valid columns); `next` is
/// the panel this thread most likely takes next (tasks run in index order within
/// a thread), to prefetch while this one computes.
#[derive(Clone, Copy)]
pub(crate) struct PanelTask<'a, L> {
    pub x: &'a [f32],
    pub rows: usize,
    pub k: usize,
    pub lines: &'a [L],
    pub next: &'a [L],
    pub out: *mut f32,
    pub ldo: usize,
    pub cols: usize,
}

/// `out[m, n] = x[m, k] · wᵀ` for `w` packed as `n.div_ceil(PANEL)` panels of
/// `per_panel` lines: checks the shapes, then runs `block` over every (row block,
/// panel) pair, in parallel when the call is big enough. Row blocks are multiples
/// of [`MR`] rows so only the last one has a ragged tile; few panels (o_proj,
/// down_proj: 9 at SmolLM2's 576) get split along `m` too, so every core has work.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_panels<L: Sync>(
    x: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    all_lines: &[L],
    per_panel: usize,
    block: impl Fn(PanelTask<'_, L>) + Sync,
) -> Result<(), KernelError> {
    check_len("x", x.len(), m * k)?;
    check_len("out", out.len(), m * n)?;
    if trivial(out, m, k, n) {
        return Ok(());
    }
    let panels = n.div_ceil(PANEL);
    let threads = rayon::current_num_threads();
    let parallel = threads > 1 && m * k * n >= PARALLEL_MIN_FLOPS;
    let row_tiles = m.div_ceil(MR);
    let row_blocks = if parallel {
        (threads * 8).div_ceil(panels).clamp(1, row_tiles)
    } else {
        1
    };
    let rows_per_block = row_tiles.div_ceil(row_blocks) * MR;
    let out_ptr = OutPtr(out.as_mut_ptr());
    let task = |t: usize| {
        let (rb, panel) = (t / panels, t % panels);
        let r0 = rb * rows_per_block;
        let r1 = (r0 + rows_per_block).min(m);
        if r0 >= r1 {
            return;
        }
        let lines = &all_lines[panel * per_panel..(panel + 1) * per_panel];
        let next = &all_lines[(panel + 1) % panels * per_panel..][..per_panel];
        block(PanelTask {
            x: &x[r0 * k..r1 * k],
            rows: r1 - r0,
            k,
            lines,
            next,
            // SAFETY: in bounds (r0 < m, panel < panels); tasks write disjoint
            // (row range, panel columns) blocks of out, which outlives the loop.
            out: unsafe { out_ptr.get().add(r0 * n + panel * PANEL) },
            ldo: n,
            cols: PANEL.min(n - panel * PANEL),
        });
    };
    let tasks = row_blocks * panels;
    if parallel {
        use rayon::prelude::*;
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
    Ok(())
}

/// One [`PanelTask`].
///
/// # Safety
/// AVX-512 F available when `avx512`; the task's `out` is valid for `rows` rows of
/// `cols` elements at stride `ldo`.
unsafe fn block_rows(avx512: bool, t: PanelTask<'_, Line>) {
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        // Each row tile prefetches its share of the next panel into L2, so memory
        // streams while the later row tiles run from cache (at decode sizes a
        // step reads all weights from DRAM, and the first row tile of a panel
        // would otherwise wait for it).
        let (k, ldo, cols) = (t.k, t.ldo, t.cols);
        let tiles = t.rows.div_ceil(MR);
        let lp = t.lines.as_ptr() as *const f32;
        let mut i = 0;
        while i < t.rows {
            let h = MR.min(t.rows - i);
            // SAFETY: i < rows: row i's k floats lie in `t.x`, and row i of `out` at
            // `ldo` (the caller's contract).
            let (xp, o) = unsafe { (t.x.as_ptr().add(i * k), t.out.add(i * ldo)) };
            let pf = Prefetch::share(t.next, i / MR, tiles);
            // SAFETY: AVX-512 F is available (the caller's contract for `avx512`);
            // `xp` has h <= rows - i rows of k floats in `t.x`; `lp` points at the
            // panel's k `Line`s (64-byte aligned by `repr(align(64))`); `o` has h
            // rows of `cols` at `ldo` (caller's contract); `pf` lies inside `next`.
            unsafe {
                match h {
                    6 => ukr::<6>(xp, k, lp, o, ldo, cols, pf),
                    5 => ukr::<5>(xp, k, lp, o, ldo, cols, pf),
                    4 => ukr::<4>(xp, k, lp, o, ldo, cols, pf),
                    3 => ukr::<3>(xp, k, lp, o, ldo, cols, pf),
                    2 => ukr::<2>(xp, k, lp, o, ldo, cols, pf),
                    _ => ukr::<1>(xp, k, lp, o, ldo, cols, pf),
                }
            }
            i += h;
        }
        return;
    }
    let _ = avx512;
    // SAFETY: the caller's contract, forwarded.
    unsafe { portable_rows(t) };
}

/// Without AVX-512: the same loop order (one accumulator per output, summed over
/// `p` in order), left to the compiler's vectoriser; 8-wide FMAs on AVX2 CPUs.
///
/// # Safety
/// As [`block_rows`].
unsafe fn portable_rows(t: PanelTask<'_, Line>) {
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::detect().avx2_fma() {
        // SAFETY: AVX2 + FMA detected just above; the rest is the caller's contract.
        return unsafe { portable_rows_avx2(t) };
    }
    // SAFETY: the caller's contract, forwarded.
    unsafe { portable_rows_generic::<false>(t) }
}

/// # Safety
/// As [`block_rows`], and AVX2 + FMA available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn portable_rows_avx2(t: PanelTask<'_, Line>) {
    // SAFETY: the caller's contract, forwarded.
    unsafe { portable_rows_generic::<true>(t) }
}

/// `FMA`: fused multiply-adds (only where the CPU has them: otherwise `mul_add`
/// is a library call).
///
/// # Safety
/// As [`block_rows`].
#[inline(always)]
unsafe fn portable_rows_generic<const FMA: bool>(t: PanelTask<'_, Line>) {
    for i in 0..t.rows {
        let mut acc = [0.0f32; PANEL];
        for (p, line) in t.lines.iter().enumerate() {
            let a = t.x[i * t.k + p];
            for (s, &b) in acc.iter_mut().zip(&line.0) {
                *s = if FMA { a.mul_add(b, *s) } else { *s + a * b };
            }
        }
        // SAFETY: row i of `out` has `cols` elements at `ldo` (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), t.out.add(i * t.ldo), t.cols) };
    }
}

/// Panel lines (256 bytes each, f32 or bf16 pairs) of another panel to pull into
/// L2 during a micro-kernel call.
#[derive(Clone, Copy)]
pub(crate) struct Prefetch {
    pub ptr: *const u8,
    pub lines: usize,
}

impl Prefetch {
    /// Row tile `tile` of `tiles` over a panel of `total` lines: its share of the
    /// next panel at `next` (nothing for a lone tile: a pure stream, which the
    /// hardware prefetcher follows on its own; software prefetch there cost ~30 %
    /// of 1-stream decode).
    pub(crate) fn share<L>(next: &[L], tile: usize, tiles: usize) -> Prefetch {
        let total = next.len();
        let share = total.div_ceil(tiles.max(1));
        let p0 = (tile * share).min(total);
        Prefetch {
            // In bounds: p0 <= total.
            ptr: next[p0..].as_ptr() as *const u8,
            lines: if tiles > 1 { share.min(total - p0) } else { 0 },
        }
    }

    /// At step `p` of `steps`: issues the range's 64-byte cache lines up to an even
    /// share of the steps so far (`issued` counts them across calls).
    ///
    /// # Safety
    /// `ptr` is valid for `lines` panel lines.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) unsafe fn step(&self, p: usize, steps: usize, issued: &mut usize) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let count = self.lines * PANEL * 4 / 64;
        while *issued < count && *issued * steps <= p * count {
            // SAFETY: `issued < count`: the line lies inside the `lines` panel lines at
            // `ptr` (this function's contract); a prefetch reads nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.ptr.add(*issued * 64) as *const i8) };
            *issued += 1;
        }
    }
}

/// The AVX-512 micro-kernel: `H` rows of `x` times one panel (`k` lines at `lp`).
///
/// # Safety
/// AVX-512 F available; `xp` has `H` rows of `k` at stride `ldx`; `lp` has `k`
/// 64-byte aligned lines of `PANEL` floats; `out` has `H` rows of `cols` at `ldo`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)]
unsafe fn ukr<const H: usize>(
    xp: *const f32,
    ldx: usize,
    lp: *const f32,
    out: *mut f32,
    ldo: usize,
    cols: usize,
    pf: Prefetch,
) {
    // SAFETY: every unsafe operation below is covered by this function's `# Safety`
    // contract, which its callers uphold.
    unsafe {
        use std::arch::x86_64::*;
        const NV: usize = PANEL / 16;
        let k = ldx;
        let mut acc = [[_mm512_setzero_ps(); NV]; H];
        // The prefetch range's 64-byte lines, spread evenly over the k iterations.
        let mut pf_issued = 0usize;
        for p in 0..k {
            pf.step(p, k, &mut pf_issued);
            let line = lp.add(p * PANEL);
            let mut b = [_mm512_setzero_ps(); NV];
            for v in 0..NV {
                b[v] = _mm512_load_ps(line.add(v * 16));
            }
            for i in 0..H {
                let a = _mm512_set1_ps(*xp.add(i * ldx + p));
                for v in 0..NV {
                    acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
                }
            }
        }
        for i in 0..H {
            let o = out.add(i * ldo);
            for v in 0..NV {
                let c0 = v * 16;
                if c0 + 16 <= cols {
                    _mm512_storeu_ps(o.add(c0), acc[i][v]);
                } else if c0 < cols {
                    let mask = ((1u32 << (cols - c0)) - 1) as u16;
                    _mm512_mask_storeu_ps(o.add(c0), mask, acc[i][v]);
                }
            }
        }
    }
}
